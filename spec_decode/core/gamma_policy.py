"""gamma='auto': a goodput policy evaluated inside the compiled loop.

Every iteration of the speculative loop picks gamma in {0, ..., G} (0 = one
plain target step, no draft call) maximizing the expected output tokens per
second of the batch as it is now:

  goodput(g) = sum over active rows r of E(alpha_r, g) / seconds(g),
  E(a, g) = (1 - a^(g+1)) / (1 - a)   (paper, equation 1; E(a, 0) = 1),

where `seconds [G+1]` is the measured walltime of one loop iteration at
each gamma for this batch size (`costs.iteration_seconds`: the real loop,
timed in context, so cache eviction and the loop's own work are in it) and
alpha_r is the running acceptance estimate of row r: the mean of beta over
the positions it tested so far, shrunk toward the batch's pooled mean, which
itself starts from an optimistic prior so that the first iterations draft
and measure.

Exploration: a gamma-0 iteration tests nothing, so once gamma 0 wins the
estimate could never change again (a draft that is poor early in the
sequence and good later would never be tried). After `probe_period`
consecutive gamma-0 choices the policy drafts gamma 1 once (a probe); the
period is set from the measured seconds so that the probes' extra time is
at most EXPLORE_COST of the time spent at gamma 0, and the probe's tested
position updates the estimate like any other.

Exactness: the choice at an iteration that starts at output length n reads
only counters of positions <= n, whose draws are all behind; the draws of
positions > n are made from their own keys afterwards, so every iteration
is Algorithm 1 run with a gamma fixed before its draws, and each token keeps
the target's distribution. The choice never reads future draws (no
calibration decode with the decode's own keys); probes are scheduled from
the count of earlier gamma-0 iterations, also a thing of the past.

What holds across rows: the choice is the batch's, from all active rows'
past, so for a fixed seed a row's sampled tokens can depend on its batch
mates (a different schedule draws a position through different keys).
Each row's tokens still follow the target's distribution exactly, and the
rows are independent samples, as under plain sampling: at every iteration
the gamma is fixed before that iteration's draws, which use each row's own
keys, so conditionally on the past each row's next tokens are the target's
and independent of the other rows' (induction over iterations). Greedy
outputs are the target's argmax path whatever the schedule.

Why one gamma for the batch and not one per row: the program's shapes are
static, so an iteration costs the same whatever gamma each row would use
(the draft steps and the target call cover every row), and a row held
below the batch's gamma can only expect fewer tokens (E grows with gamma).
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# The pooled estimate starts as PRIOR_WEIGHT tested positions of beta
# PRIOR_ALPHA: optimistic, so that speculation is tried (and alpha measured)
# unless the measured costs say it cannot pay even at this alpha.
PRIOR_ALPHA = 0.8
PRIOR_WEIGHT = 2.0
# A row's own estimate is shrunk toward the pooled one with this weight.
ROW_PRIOR_WEIGHT = 4.0
# Probes may add at most this fraction to the time spent at gamma 0.
EXPLORE_COST = 0.02
# What the policy loop's gamma-0 iteration costs over plain decoding's step
# (measured 1-5% at batch 16-32 on the CPU, base-size models, forced gamma
# 0 against plain): `can_pay` asks speculation to beat it at alpha 1 by
# more, else the plain program runs (at batch 16-32 there, gamma 1 costs
# 1.95-2.1 gamma-0 iterations: a knife edge at alpha 1, a loss at any real
# alpha once stragglers and the loop's overhead count).
LOOP_MARGIN = 0.05
# alpha is capped below 1 so that E(alpha, g) stays finite and ordered.
_MAX_ALPHA = 0.999


@flax.struct.dataclass(kw_only=True)
class PolicyInputs:
  """Run-time inputs of the policy (arrays: new values never recompile).

  Attributes:
    seconds: `[G + 1] float32` measured seconds of one loop iteration at each
      gamma; `inf` where a gamma is not a candidate.
    forced_gamma: `[K] int32` a schedule: iteration i runs gamma
      `forced_gamma[i % K]`, or the policy's where that is -1 (`[-1]`: the
      policy throughout; `[g]`: gamma g throughout, how `auto_gamma`
      times the loop).
    max_iterations: `[] int32`, the loop stops after this many iterations
      (timing runs; a decode passes a bound it never reaches).
    explore_cost: `[] float32` the probes' time budget as a fraction of the
      time at gamma 0 (`probe_period`); 0 turns probing off.
  """

  seconds: jax.Array
  forced_gamma: jax.Array
  max_iterations: jax.Array
  explore_cost: jax.Array

  @classmethod
  def create(
    cls,
    seconds,
    forced_gamma=-1,
    max_iterations: int = 2**30,
    explore_cost: float = EXPLORE_COST,
  ) -> 'PolicyInputs':
    return cls(
      seconds=jnp.asarray(seconds, jnp.float32),
      forced_gamma=jnp.atleast_1d(jnp.asarray(forced_gamma, jnp.int32)),
      max_iterations=jnp.asarray(max_iterations, jnp.int32),
      explore_cost=jnp.asarray(explore_cost, jnp.float32),
    )


def expected_tokens(alpha: jax.Array, gammas: jax.Array) -> jax.Array:
  """E(alpha, g) = (1 - alpha^(g+1)) / (1 - alpha), broadcast."""
  alpha = jnp.clip(alpha, 0.0, _MAX_ALPHA)
  return (1.0 - alpha ** (gammas + 1.0)) / (1.0 - alpha)


def row_alphas(
  beta_sum: jax.Array, tested: jax.Array, active: jax.Array
) -> jax.Array:
  """Running acceptance estimates `[B]` from per-row counts.

  Args:
    beta_sum: `[B]` sum of beta over the positions each row tested.
    tested: `[B]` positions each row tested.
    active: `[B] bool` rows still decoding (the pool is theirs).
  """
  w = active.astype(jnp.float32)
  tested = tested.astype(jnp.float32)
  pooled = (jnp.sum(w * beta_sum) + PRIOR_WEIGHT * PRIOR_ALPHA) / (
    jnp.sum(w * tested) + PRIOR_WEIGHT
  )
  return (beta_sum + ROW_PRIOR_WEIGHT * pooled) / (tested + ROW_PRIOR_WEIGHT)


def goodput(
  alphas: jax.Array, active: jax.Array, seconds: jax.Array
) -> jax.Array:
  """Expected tokens per second `[G + 1]` of the active rows per gamma."""
  gammas = jnp.arange(seconds.shape[0], dtype=jnp.float32)
  tokens = expected_tokens(alphas[:, None], gammas[None])  # [B, G + 1]
  total = jnp.sum(jnp.where(active[:, None], tokens, 0.0), axis=0)
  return total / seconds


def can_pay(seconds, margin: float = LOOP_MARGIN) -> bool:
  """Whether some gamma >= 1 could beat plain decoding at all (host-side).

  True when, with every draft token accepted (alpha at its cap), a gamma
  >= 1 would give more than (1 + `margin`) times the tokens per second of
  gamma 0 under the measured `seconds [G + 1]`. False means no acceptance
  rate makes speculation pay at this batch size by more than what the
  policy loop costs over plain decoding's own program, so the policy would
  run gamma 0 and probe for nothing. True when gamma 0 is not a candidate
  (inf).
  """
  seconds = np.asarray(seconds, np.float64)
  if not np.isfinite(seconds[0]):
    return True
  gammas = np.arange(1, seconds.shape[0])
  best = np.asarray(expected_tokens(_MAX_ALPHA, gammas)) / seconds[1:]
  return bool(np.any(best > (1.0 + margin) / seconds[0]))


def probe_period(
  seconds: jax.Array, explore_cost: jax.Array | float = EXPLORE_COST
) -> jax.Array:
  """Gamma-0 iterations `[] int32` between probes at gamma 1.

  The smallest P with (seconds[1] - seconds[0]) / (P seconds[0]) <=
  explore_cost (a probe's extra time against P plain steps); never when
  either gamma is not a candidate or `explore_cost` is 0.
  """
  extra = jnp.maximum(seconds[1] - seconds[0], 0.0)
  period = jnp.ceil(extra / (explore_cost * seconds[0]))
  ok = jnp.isfinite(period)
  return jnp.where(ok, jnp.clip(period, 1.0, 2.0**30), 2.0**30).astype(
    jnp.int32
  )


def choose(
  beta_sum: jax.Array,
  tested: jax.Array,
  active: jax.Array,
  inputs: PolicyInputs,
  step: jax.Array,
  idle: jax.Array | int = 0,
) -> jax.Array:
  """The gamma `[] int32` of iteration `step` (forced, or best goodput).

  Args:
    beta_sum: `[B]` sum of beta over the positions each row tested.
    tested: `[B]` positions each row tested.
    active: `[B] bool` rows still decoding.
    inputs: the run-time inputs (seconds, schedule).
    step: `[] int32` the iteration.
    idle: `[] int32` consecutive gamma-0 iterations just before this one;
      at `probe_period` the policy's gamma 0 becomes a gamma-1 probe.
  """
  best = jnp.argmax(
    goodput(row_alphas(beta_sum, tested, active), active, inputs.seconds)
  ).astype(jnp.int32)
  probe = (best == 0) & (
    idle >= probe_period(inputs.seconds, inputs.explore_cost)
  )
  best = jnp.where(probe, 1, best)
  schedule = inputs.forced_gamma
  forced = schedule[step % schedule.shape[0]]
  return jnp.where(forced >= 0, forced, best)

"""gamma='auto': a finish-time policy evaluated inside the compiled loop.

Every iteration of the speculative loop picks gamma in {0, ..., G} (0 = one
plain target step, no draft call) minimizing the predicted walltime until
the batch as it is now has finished, were that gamma kept:

  finish(g) = seconds(g) * max over active rows r of
              (mu_r(g) + z(n) sigma_r(g)),

where `seconds [G+1]` is the measured walltime of one loop iteration at
each gamma for this batch size (`chain.auto_costs.iteration_seconds`: the
real loop, timed in context, so cache eviction and the loop's own work are
in it), and
mu_r, sigma_r are the mean and spread of the iterations row r needs for the
R_r tokens it may still emit. An iteration at gamma g emits X tokens, X =
k with probability alpha^(k-1) (1 - alpha) for k <= g and X = g + 1 with
probability alpha^g, mean E(alpha, g) = (1 - alpha^(g+1)) / (1 - alpha)
(paper, equation 1), variance V. Renewal theory gives

  mu = (R + overshoot) / E,  overshoot = E[X^2] / (2E) - 1/2,
  sigma^2 = R V / E^3,

(mu never below ceil(R / (g + 1)), the fewest iterations possible), and a
static batch runs until its slowest row is done, so the rows' iteration
counts enter as an expected maximum: z(n) is the expected largest of n
standard normals (Blom's approximation Phi^-1((n - 0.375) / (n + 0.25))),
n the active rows. alpha is the running acceptance estimate: the mean of
beta over the positions the active rows tested so far, pooled over the
rows (`pooled_alpha` says why not per row), from an optimistic prior so
that the first iterations draft and measure, or from an estimate carried
from earlier decodes of the same pair (`policy.carried`). R_r is what row
r may still emit before the decode's length limit (an EOS can end it
earlier; the limit is the only horizon known in advance).

Why not tokens per second (sum over rows of E / seconds, the policy before
this one): a static batch ends with its slowest row, so the iterations a
finished row sits out are wasted, and the last iteration's tokens past the
limit are dropped. Measured on the CPU (batch 32, alpha 0.95, base-size
models): a gamma-7 iteration cost 6.26 plain steps and emits 6.73 tokens on
average (1.07x by tokens per second), but the slowest of 32 rows needs 12.6
iterations for 64 tokens, not 9.5 (0.81x); near the end, with 10 tokens
left, two gamma-7 iterations cost 12.5 plain steps against 10. For one row
and a far limit both objectives pick the same gamma (the overshoot term
aside). Against the exact expected maximum (dynamic programming over the
iteration counts), the approximation is within 4% at 64 tokens left, 13%
at 10 and 27% at 5 (alpha 0.5-0.95, gamma 1-7, 1-32 rows;
tests/policy/test_finish_time.py checks it against the exact value): its errors
matter only in a decode's last iterations.

Exploration: a gamma-0 iteration tests nothing, so once gamma 0 wins the
estimate could never change again (a draft that is poor early in the
sequence and good later would never be tried). After `probe_period`
consecutive gamma-0 choices the policy drafts gamma 1 once (a probe); the
period is set from the measured seconds so that the probes' extra time is
at most EXPLORE_COST of the time spent at gamma 0, and the probe's tested
position updates the estimate like any other; a periodic probe is skipped
when fewer than a period's tokens are left (nothing left to use what it
finds). And while the estimate rests on few positions (the prior's alone
at first), gamma 0 stands only if it would also win with alpha one
standard error (`UNCERTAINTY_Z`) higher; else the iteration is a gamma-1
probe, the cheapest test. Without it an unlucky start stuck: simulated at
batch 2, alpha 0.5, under the CPU's measured costs, two poor iterations
put the estimate at 0.27 and the policy at gamma 0 for 15 iterations at a
time, 0.951x the best fixed gamma over many decodes (0.982x with it); and
a batch that starts at gamma 0 waited a whole probe period (39 iterations
at batch 8) before testing a draft that was accepted every time (0.936x
the best fixed gamma; 0.989x with it). The price: 0.974x -> 0.965x plain
at batch 2, alpha 0.2, where drafting never pays
(tests/policy/test_finish_time.py simulates these).

Exactness: the choice at an iteration that starts at output length n reads
only counters of positions <= n, whose draws are all behind; the draws of
positions > n are made from their own keys afterwards, so every iteration
is Algorithm 1 run with a gamma fixed before its draws, and each token keeps
the target's distribution. The choice never reads future draws (no
calibration decode with the decode's own keys); probes are scheduled from
the count of earlier gamma-0 iterations, also a thing of the past. A
carried start (`policy.carried`) is a thing of earlier decodes, fixed
before this one draws (with row keys of its own).

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
# The largest gamma gamma='auto' considers unless told otherwise.
MAX_GAMMA = 8
PRIOR_ALPHA = 0.8
PRIOR_WEIGHT = 2.0
# Gamma 0 stands only if it also wins with alpha this many standard errors
# above the estimate; else a gamma-1 probe (`choose`).
UNCERTAINTY_Z = 1.0
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
      policy throughout; `[g]`: gamma g throughout, how `chain.auto_costs`
      times the loop).
    max_iterations: `[] int32`, the loop stops after this many iterations
      (timing runs; a decode passes a bound it never reaches).
    explore_cost: `[] float32` the probes' time budget as a fraction of the
      time at gamma 0 (`probe_period`); 0 turns probing off.
    uncertainty_z: `[] float32` gamma 0 stands only if it also wins with
      alpha this many standard errors higher (`choose`); 0 turns it off.
    prior_alpha: `[] float32` the alpha the estimate starts from
      (PRIOR_ALPHA, or an earlier decode's: `policy.carried`).
    prior_weight: `[] float32` the tested positions the start counts as.
  """

  seconds: jax.Array
  forced_gamma: jax.Array
  max_iterations: jax.Array
  explore_cost: jax.Array
  uncertainty_z: jax.Array
  prior_alpha: jax.Array
  prior_weight: jax.Array

  @classmethod
  def create(
    cls,
    seconds,
    forced_gamma=-1,
    max_iterations: int = 2**30,
    explore_cost: float = EXPLORE_COST,
    uncertainty_z: float = UNCERTAINTY_Z,
    prior_alpha: float = PRIOR_ALPHA,
    prior_weight: float = PRIOR_WEIGHT,
  ) -> 'PolicyInputs':
    return cls(
      seconds=jnp.asarray(seconds, jnp.float32),
      forced_gamma=jnp.atleast_1d(jnp.asarray(forced_gamma, jnp.int32)),
      max_iterations=jnp.asarray(max_iterations, jnp.int32),
      explore_cost=jnp.asarray(explore_cost, jnp.float32),
      uncertainty_z=jnp.asarray(uncertainty_z, jnp.float32),
      prior_alpha=jnp.asarray(prior_alpha, jnp.float32),
      prior_weight=jnp.asarray(prior_weight, jnp.float32),
    )


def expected_tokens(alpha: jax.Array, gammas: jax.Array) -> jax.Array:
  """E(alpha, g) = (1 - alpha^(g+1)) / (1 - alpha), broadcast."""
  alpha = jnp.clip(alpha, 0.0, _MAX_ALPHA)
  return (1.0 - alpha ** (gammas + 1.0)) / (1.0 - alpha)


def pooled_alpha(
  beta_sum: jax.Array,
  tested: jax.Array,
  active: jax.Array,
  prior_alpha: jax.Array | float = PRIOR_ALPHA,
  prior_weight: jax.Array | float = PRIOR_WEIGHT,
) -> jax.Array:
  """The acceptance estimate `[]` the policy uses, pooled over the rows.

  The mean of beta over every position the active rows tested, with the
  prior (`prior_weight` positions at `prior_alpha`: PRIOR_WEIGHT at
  PRIOR_ALPHA, or an estimate carried from earlier decodes,
  `policy.carried`). Not each row's own
  estimate: the finish time is the slowest row's, and a maximum over noisy
  per-row estimates picks the unluckiest row's noise (a winner's curse).
  Measured with per-row estimates (shrunk toward the pool by 4 positions):
  at batch 2, alpha 0.5 (the same for both rows), the policy ran gamma 0
  for 60 of 64 iterations while fixed gamma 2 ran 1.18x plain. The spread
  term (`finish_seconds`) already models each row's luck given alpha.

  Args:
    beta_sum: `[B]` sum of beta over the positions each row tested.
    tested: `[B]` positions each row tested.
    active: `[B] bool` rows still decoding (the pool is theirs).
    prior_alpha: `[]` the start's alpha.
    prior_weight: `[]` the tested positions the start counts as.
  """
  w = active.astype(jnp.float32)
  tested = tested.astype(jnp.float32)
  return (jnp.sum(w * beta_sum) + prior_weight * prior_alpha) / (
    jnp.sum(w * tested) + prior_weight
  )


def iteration_moments(
  alphas: jax.Array, num_gammas: int
) -> tuple[jax.Array, jax.Array]:
  """Mean and second moment `[..., G + 1]` of the tokens of one iteration.

  Args:
    alphas: `[...]` acceptance rates.
    num_gammas: G + 1 (gammas 0..G).
  """
  alpha = jnp.clip(alphas, 0.0, _MAX_ALPHA)[..., None, None]
  gammas = jnp.arange(num_gammas, dtype=jnp.float32)[:, None]  # [G+1, 1]
  k = jnp.arange(1, num_gammas + 1, dtype=jnp.float32)[None]  # [1, K]
  # P(X = k): a rejection at draft position k (k <= g), or all g accepted.
  stop = alpha ** (k - 1.0) * (1.0 - alpha)
  prob = jnp.where(
    k <= gammas, stop, jnp.where(k == gammas + 1.0, alpha**gammas, 0.0)
  )
  return jnp.sum(prob * k, -1), jnp.sum(prob * k * k, -1)


def straggler_z(num_rows: jax.Array) -> jax.Array:
  """Expected largest of `num_rows` standard normals (Blom); 0 for <= 1."""
  n = jnp.maximum(num_rows.astype(jnp.float32), 1.0)
  z = jax.scipy.special.ndtri((n - 0.375) / (n + 0.25))
  return jnp.where(n > 1.0, z, 0.0)


def row_iterations(
  alpha: jax.Array, remaining: jax.Array, z: jax.Array, num_gammas: int
) -> jax.Array:
  """mu + z sigma `[..., G + 1]`: a row's iterations, with a straggler margin.

  Non-decreasing in `remaining` (mu and sigma both grow with it), which is
  why the slowest active row is the one with the most tokens left.

  Args:
    alpha: `[]` acceptance rate.
    remaining: `[...]` tokens the row may still emit.
    z: `[]` standard deviations above the mean (`straggler_z`).
    num_gammas: G + 1 (gammas 0..G).
  """
  mean, second = iteration_moments(alpha, num_gammas)  # [G + 1]
  var = jnp.maximum(second - mean * mean, 0.0)
  r = jnp.maximum(jnp.asarray(remaining, jnp.float32), 0.0)[..., None]
  gammas = jnp.arange(num_gammas, dtype=jnp.float32)
  overshoot = second / (2.0 * mean) - 0.5
  mu = jnp.maximum((r + overshoot) / mean, jnp.ceil(r / (gammas + 1.0)))
  mu = jnp.where(r > 0, mu, 0.0)
  return mu + z * jnp.sqrt(r * var / mean**3)


def most_left(active: jax.Array, remaining: jax.Array) -> jax.Array:
  """The most tokens `[] int32` an active row may still emit (0: none)."""
  remaining = jnp.asarray(remaining, jnp.int32)
  return jnp.max(jnp.where(active, remaining, 0), initial=0)


def finish_seconds(
  alpha: jax.Array,
  active: jax.Array,
  remaining: jax.Array,
  seconds: jax.Array,
) -> jax.Array:
  """Predicted seconds `[G + 1]` until the active rows are all done.

  With one alpha for the batch (`pooled_alpha`) the maximum over the
  active rows of `row_iterations` is that of the row with the most tokens
  left (`row_iterations` grows with them), with z from the number of active
  rows.

  Args:
    alpha: `[]` the batch's acceptance estimate.
    active: `[B] bool` rows still decoding.
    remaining: `[B]` tokens each row may still emit (its length limit).
    seconds: `[G + 1]` measured seconds of one iteration at each gamma.
  """
  active = jnp.asarray(active, bool)
  z = straggler_z(jnp.sum(active))
  longest = most_left(active, remaining)
  its = row_iterations(alpha, longest, z, seconds.shape[0])
  # At least one iteration: the loop's last choice (no active row left)
  # compares finite numbers.
  return seconds * jnp.maximum(its, 1.0)


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
  remaining: jax.Array,
  inputs: PolicyInputs,
  step: jax.Array,
  idle: jax.Array | int = 0,
) -> jax.Array:
  """The gamma `[] int32` of iteration `step` (forced, or soonest finish).

  Args:
    beta_sum: `[B]` sum of beta over the positions each row tested.
    tested: `[B]` positions each row tested.
    active: `[B] bool` rows still decoding.
    remaining: `[B]` tokens each row may still emit.
    inputs: the run-time inputs (seconds, schedule).
    step: `[] int32` the iteration.
    idle: `[] int32` consecutive gamma-0 iterations just before this one;
      at `probe_period` (with at least that many tokens left) the policy's
      gamma 0 becomes a gamma-1 probe, as it does while alpha one standard
      error higher would draft (`PolicyInputs.uncertainty_z`).
  """
  active = jnp.asarray(active, bool)
  alpha = pooled_alpha(
    beta_sum, tested, active, inputs.prior_alpha, inputs.prior_weight
  )
  soonest = lambda a: jnp.argmin(  # noqa: E731
    finish_seconds(a, active, remaining, inputs.seconds)
  ).astype(jnp.int32)
  best = soonest(alpha)
  n = jnp.sum(active * tested.astype(jnp.float32))
  se = jnp.sqrt(alpha * (1.0 - alpha) / (n + inputs.prior_weight))
  upper = jnp.minimum(alpha + inputs.uncertainty_z * se, 1.0)
  unsure = soonest(upper) > 0
  # A periodic probe pays only with tokens left to use what it finds.
  period = probe_period(inputs.seconds, inputs.explore_cost)
  left = most_left(active, remaining)
  probe = (best == 0) & (unsure | ((idle >= period) & (left >= period)))
  best = jnp.where(probe, 1, best)
  schedule = inputs.forced_gamma
  forced = schedule[step % schedule.shape[0]]
  return jnp.where(forced >= 0, forced, best)

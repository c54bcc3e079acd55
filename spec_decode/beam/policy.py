"""Speculative beam search that never loses: a plain step or a tree call.

With `beam_search(..., draft=, gamma='auto')` every iteration of the
speculative beam-search loop (`beam/speculative.py`) chooses, for the whole
batch,
between one plain beam-search step (one target call scoring each live
beam's newest token, no draft work) and one speculative call (draft trees
of depth G, one target tree call, 1 .. G + 1 replayed steps). It picks the
one with more expected steps per second:

  speculative  iff  S / seconds[1] > 1 / seconds[0],

where `seconds` are the measured walltimes of one loop iteration of each
kind for this batch size (`beam.costs.iteration_seconds`: the compiled loop
itself, forced to each kind) and S is the running mean of steps committed
per speculative call over the rows still decoding, which starts from an
optimistic prior (the steps a draft agreeing at rate PRIOR_ALPHA would
give), so that the first iterations speculate and measure.

Exploration: plain steps measure nothing, so after `probe_period` plain
steps in a row the loop makes one speculative call (a probe). The period
keeps the probes' extra time at most EXPLORE_COST of the plain steps'
(`finish_time.probe_period`) and is capped at MAX_IDLE = 64: the draft
has not seen the steps taken plainly and catches up on them, in one call
over at most G + 2 + MAX_IDLE inputs, at the next speculative call.

Exactness needs no argument beyond plain beam search's: both kinds of
iteration apply `beam.rules.step` to the target's own log-probs, so any
schedule returns plain beam search's beams (the policy only moves time).
"""

import jax
import jax.numpy as jnp

from spec_decode.policy import finish_time

# The prior of S: PRIOR_WEIGHT calls of E(PRIOR_ALPHA, G) steps each.
PRIOR_ALPHA = finish_time.PRIOR_ALPHA
PRIOR_WEIGHT = finish_time.PRIOR_WEIGHT
EXPLORE_COST = finish_time.EXPLORE_COST
# Plain steps in a row at most (the draft's catch-up chunk grows with it,
# and is only that long when needed). 64: about the 2% probe budget where a
# call costs 2-3 steps; a cap of 16 spent 15% of a 4-beam demo decode on
# probes.
MAX_IDLE = 64
# Values of `BeamPolicyInputs.forced_gamma`.
POLICY, PLAIN, SPECULATIVE = -1, 0, 1


# The run-time inputs are `finish_time.PolicyInputs` read for two kinds:
# `seconds [2]` (a plain step, a speculative call) and `forced_gamma`
# holding POLICY, PLAIN or SPECULATIVE per iteration.
BeamPolicyInputs = finish_time.PolicyInputs


def steps_per_call(histogram: jax.Array, active: jax.Array) -> jax.Array:
  """S `[]`: steps per speculative call of the active rows, with the prior.

  Args:
    histogram: `[B, G + 1]` speculative calls that committed 1 + a steps.
    active: `[B] bool` rows still decoding.
  """
  g = histogram.shape[1] - 1
  w = active.astype(jnp.float32)[:, None] * histogram.astype(jnp.float32)
  steps = jnp.sum(w * jnp.arange(1, g + 2, dtype=jnp.float32))
  prior = finish_time.expected_tokens(jnp.float32(PRIOR_ALPHA), g)
  return (steps + PRIOR_WEIGHT * prior) / (jnp.sum(w) + PRIOR_WEIGHT)


def speculate(
  histogram: jax.Array,
  active: jax.Array,
  inputs: BeamPolicyInputs,
  iteration: jax.Array,
  idle: jax.Array,
) -> jax.Array:
  """Whether iteration `iteration` makes a speculative call (`[] bool`).

  Args:
    histogram: `[B, G + 1]` speculative calls that committed 1 + a steps.
    active: `[B] bool` rows still decoding.
    inputs: the run-time inputs.
    iteration: `[] int32` the loop iteration.
    idle: `[] int32` plain steps in a row just before this iteration.
  """
  s = inputs.seconds
  spec = steps_per_call(histogram, active) * s[0] > s[1]
  spec |= idle >= finish_time.probe_period(s, inputs.explore_cost)
  schedule = inputs.forced_gamma
  forced = schedule[iteration % schedule.shape[0]]
  spec = jnp.where(forced == POLICY, spec, forced == SPECULATIVE)
  # Even a forced schedule: the draft's catch-up holds MAX_IDLE steps.
  return spec | (idle >= MAX_IDLE)

"""Speculative beam search's `gamma='auto'`: its two costs, measured once.

`beam_policy.speculate` compares a plain step with a speculative call by
their walltimes in the compiled loop. They are measured on that loop
itself, forced to each kind for a few iterations (run-time inputs, so the
decode that follows reuses the program), with `policy.loop_costs`' rounds
and clean-up, as `chain.auto_costs` times gammas: the kinds are its
"gammas" 0 (`PLAIN`) and 1 (`SPECULATIVE`). A call costs at least a plain
step (it scores the same roots and more), so a smaller measured call is
noise, pooled with the step (`loop_costs.non_decreasing`: both get their
mean). Cached by shapes, batch, settings and device like
`chain.auto_costs`' (`policy.cost_cache`, `'kind': 'beam'` in the key).
"""

from typing import Any

import jax
import numpy as np

from spec_decode.beam import policy as beam_policy
from spec_decode.beam import speculative as spec_beam
from spec_decode.policy import cost_cache
from spec_decode.policy import loop_costs


def measure(
  target: Any,
  draft: Any,
  encoder_tokens: jax.Array,
  settings: Any,
  layout: Any,
  repeats: int = loop_costs.REPEATS,
  iterations: int = loop_costs.TIMING_ITERATIONS,
) -> list[float]:
  """Seconds `[2]` of one loop iteration: a plain step, a speculative call.

  Args:
    target, draft: the models.
    encoder_tokens: `[B, S]` inputs with the decode's shapes (placed as
      the decode places them).
    settings: `beam.search.BeamSettings`.
    layout: `draft_trees.TreeLayout` of the speculative calls.
    repeats: timed rounds (medians).
    iterations: iterations per timing decode (<= MAX_IDLE).
  """

  def run(kind: int, limit: int) -> int:
    policy = beam_policy.BeamPolicyInputs.create(
      np.ones(2), forced_gamma=kind, max_iterations=limit
    )
    out = spec_beam.spec_beam_decode_jit(
      target, draft, encoder_tokens, settings=settings, layout=layout,
      policy=policy,
    )  # fmt: skip
    jax.block_until_ready(out)
    return int(np.asarray(out[4]).max(initial=0))

  kinds = (beam_policy.PLAIN, beam_policy.SPECULATIVE)
  return loop_costs.measure(
    run,
    kinds,
    g_max=beam_policy.SPECULATIVE,
    repeats=repeats,
    iterations=min(iterations, beam_policy.MAX_IDLE),
    retry_rounds=0,  # Two kinds: no line to be off.
  )


def iteration_seconds(
  target: Any,
  draft: Any,
  encoder_tokens: jax.Array,
  settings: Any,
  layout: Any,
  use_disk: bool = True,
) -> tuple[list[float], dict[str, Any]]:
  """`measure`'s seconds, from the caches when there (`policy.cost_cache`).

  Returns:
    seconds `[2]` and `{'key', 'path', 'measured'}`.
  """
  desc = cost_cache.describe(
    target, draft, (settings, layout), encoder_tokens.shape[0]
  )
  desc['kind'] = 'beam'
  return cost_cache.cached_seconds(
    desc,
    lambda: measure(target, draft, encoder_tokens, settings, layout),
    use_disk,
  )

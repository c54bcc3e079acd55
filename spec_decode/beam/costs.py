"""Speculative beam search's `gamma='auto'`: its two costs, measured once.

`beam_policy.speculate` compares a plain step with a speculative call by
their walltimes in the compiled loop. They are measured on that loop
itself, forced to each kind for a few iterations (run-time inputs, so the
decode that follows reuses the program), less a decode of no iterations
(setup and outputs), in rounds (each kind once per round, medians), as
`chain.auto_costs.measure` times gammas. A call costs at least a plain step (it
scores the same roots and more), so a smaller measured call is noise and
both are set to their mean. Cached by shapes, batch, settings and device
like `chain.auto_costs`' (`policy.cost_cache`, `'kind': 'beam'` in the key).
"""

import statistics
import time
from typing import Any

import jax
import numpy as np

from spec_decode.beam import policy as beam_policy
from spec_decode.beam import speculative as spec_beam
from spec_decode.policy import cost_cache

# Iterations per timing decode (at most the policy's cap on plain steps in
# a row), and timed rounds (medians).
TIMING_ITERATIONS = 16
REPEATS = 3


def measure(
  target: Any,
  draft: Any,
  encoder_tokens: jax.Array,
  settings: Any,
  layout: Any,
  repeats: int = REPEATS,
  iterations: int = TIMING_ITERATIONS,
) -> list[float]:
  """Seconds `[2]` of one loop iteration: a plain step, a speculative call.

  Args:
    target, draft: the models.
    encoder_tokens: `[B, S]` inputs with the decode's shapes (placed as
      the decode places them).
    settings: `beam_search.BeamSettings`.
    layout: `beam_trees.TreeLayout` of the speculative calls.
    repeats: timed rounds (medians).
    iterations: iterations per timing decode (<= MAX_IDLE).
  """
  iterations = min(iterations, beam_policy.MAX_IDLE)

  def run(kind: int, limit: int):
    policy = beam_policy.BeamPolicyInputs.create(
      np.ones(2), forced_gamma=kind, max_iterations=limit
    )
    out = spec_beam.spec_beam_decode_jit(
      target, draft, encoder_tokens, settings=settings, layout=layout,
      policy=policy,
    )  # fmt: skip
    jax.block_until_ready(out)
    return out

  kinds = (beam_policy.PLAIN, beam_policy.SPECULATIVE)
  run(beam_policy.PLAIN, 1)  # Compile; the decode reuses the program.
  # Iterations each kind runs (fewer than `iterations` when rows end).
  ran = {k: max(int(np.asarray(run(k, iterations)[4]).max()), 1) for k in kinds}
  setups, rounds = [], {k: [] for k in kinds}
  for _ in range(repeats):
    t0 = time.perf_counter()
    run(beam_policy.PLAIN, 0)
    setups.append(time.perf_counter() - t0)
    for k in kinds:
      t0 = time.perf_counter()
      run(k, iterations)
      rounds[k].append(time.perf_counter() - t0)
  setup = statistics.median(setups)
  plain, spec = (
    max(statistics.median(rounds[k]) - setup, 1e-9) / ran[k] for k in kinds
  )
  if spec < plain:
    plain = spec = (plain + spec) / 2
  return [plain, spec]


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

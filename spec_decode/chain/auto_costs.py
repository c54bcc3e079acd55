"""gamma='auto''s cost model: the chain loop's seconds per gamma, measured once.

`policy.finish_time` picks each iteration's gamma from the running
acceptance estimate and `seconds[g]`, one iteration of the compiled auto
loop at gamma g. `measure` times them on that loop itself, forced to each
gamma (`PolicyInputs` `forced_gamma`, `max_iterations`: run-time values, so
the decode that follows reuses the same program), with `policy.loop_costs`'
rounds and clean-up; `iteration_seconds` caches them (`policy.cost_cache`).
The timing decodes use their own keys, never the decode's.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.chain import loops
from spec_decode.core import drafter
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.policy import cost_cache
from spec_decode.policy import finish_time
from spec_decode.policy import loop_costs

# The timing decodes' seed (their draws are theirs, not the decode's).
_TIMING_SEED = 0x5EED


def zero_allowed(draft: Any) -> bool:
  """Gamma 0 is a candidate: `draft` is a language model (the loop catches
  it up) or a drafter without state."""
  return drafter.zero_gamma_ok(draft)


def _run(target, draft, enc, keys, settings, policy):
  out = loops.speculative_decode_jit(
    target, draft, enc, keys, settings=settings, policy=policy
  )
  jax.block_until_ready(out)
  return out


def measure(
  target: Any,
  draft: Any,
  encoder_tokens: jax.Array,
  settings: DecodeSettings,
  repeats: int = loop_costs.REPEATS,
  iterations: int = loop_costs.TIMING_ITERATIONS,
  retry_rounds: int = loop_costs.RETRY_ROUNDS,
) -> list[float]:
  """Seconds of one auto-loop iteration at each gamma 0..G, `[G + 1]`.

  `policy.loop_costs.measure` over forced runs of the auto loop (`inf` for
  gamma 0 where a stateful drafter makes it no candidate).

  Args:
    target: the target.
    draft: the draft (model or drafter).
    encoder_tokens: `[B, S]` inputs with the decode's shapes (placed as the
      decode places them).
    settings: the auto decode's settings (`gamma_policy` set, width = G).
    repeats: timed rounds (medians).
    iterations: iterations per timing decode.
    retry_rounds: more rounds for the suspects (0: none).
  """
  batch = encoder_tokens.shape[0]
  base = jax.random.key(_TIMING_SEED)
  keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(
    jnp.arange(batch, dtype=jnp.uint32)
  )
  g_max = settings.width

  def run(g: int, limit: int) -> int:
    policy = finish_time.PolicyInputs.create(
      np.ones(g_max + 1), forced_gamma=g, max_iterations=limit
    )
    counters = _run(target, draft, encoder_tokens, keys, settings, policy)[2]
    return int(np.asarray(counters.iterations).max(initial=0))

  candidates = range(0 if zero_allowed(draft) else 1, g_max + 1)
  return loop_costs.measure(
    run, candidates, g_max, repeats, iterations, retry_rounds
  )


def iteration_seconds(
  target: Any,
  draft: Any,
  encoder_tokens: jax.Array,
  settings: DecodeSettings,
  use_disk: bool = True,
) -> tuple[list[float], dict[str, Any]]:
  """`measure`'s seconds for this setting, from the caches when there.

  Returns:
    seconds `[G + 1]`, and `{'key', 'path', 'measured'}`: the cache key,
    the cache file (None without `use_disk`) and whether it was measured
    now.
  """
  desc = cost_cache.describe(target, draft, settings, encoder_tokens.shape[0])
  return cost_cache.cached_seconds(
    desc,
    lambda: measure(target, draft, encoder_tokens, settings),
    use_disk,
  )

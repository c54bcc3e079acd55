"""gamma='auto': the cost model the in-loop policy reads, measured once.

`gamma_policy` picks each iteration's gamma from the running acceptance
estimate and `seconds[g]`, the walltime of one loop iteration at gamma g
(g = 0: a plain target step). Those are measured on the compiled auto loop
itself, forced to each gamma for a few iterations (`PolicyInputs`
`forced_gamma`, `max_iterations`: run-time values, so the decode that
follows reuses the same program): what the loop really pays per iteration
in context, target call v(g + 1, B), g draft steps c(B), the loop's own work
and the cache eviction between the two models included. The timing decodes
use their own keys, never the decode's.

The measurement depends on the models' shapes, the batch size, the settings
and the device, not on weights or inputs, so it is cached under a key of
those: in memory and as a JSON file per key in `cache_dir()`
(`$SPEC_DECODE_CACHE_DIR`, default `~/.cache/spec_decode/costs`): a second
process does not measure again. This is the engine's one file (a cache of
measurements).
"""

import hashlib
import json
import math
import os
import platform
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.core import gamma_policy
from spec_decode.core import loops
from spec_decode.core.decode_settings import DecodeSettings

MAX_GAMMA = 8
# Iterations per timing decode, and timed repeats (medians).
TIMING_ITERATIONS = 16
REPEATS = 3
# A gamma more than SPIKE_TOLERANCE off the line through the others is timed
# in RETRY_ROUNDS more rounds (`suspects`).
SPIKE_TOLERANCE = 0.1
RETRY_ROUNDS = 4
# Part of the cache key: a changed measurement is not read from old files.
MEASURE_VERSION = 2
# The timing decodes' seed (their draws are theirs, not the decode's).
_TIMING_SEED = 0x5EED
_memory: dict[str, list[float]] = {}


def cache_dir() -> str:
  return os.environ.get('SPEC_DECODE_CACHE_DIR') or os.path.join(
    os.path.expanduser('~'), '.cache', 'spec_decode', 'costs'
  )


def zero_allowed(draft: Any) -> bool:
  """Gamma 0 is a candidate: `draft` is a language model (the loop catches
  it up) or a drafter without state."""
  return loops.zero_gamma_ok(draft)


def _shapes(tree: Any) -> list:
  leaves, treedef = jax.tree.flatten(tree)
  return [
    type(tree).__name__,
    treedef.num_leaves,
    [[list(np.shape(x)), _dtype_name(x)] for x in leaves],
  ]


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(x: Any) -> str:
  # str(dtype) is slow in numpy (most of a batch-1 decode's describe).
  dtype = getattr(x, 'dtype', None)
  if dtype is None:
    return type(x).__name__
  name = _DTYPE_NAMES.get(dtype)
  if name is None:
    name = _DTYPE_NAMES[dtype] = str(dtype)
  return name


def describe(
  target: Any, draft: Any, settings: DecodeSettings, batch: int
) -> dict[str, Any]:
  """What the measured costs depend on (the cache key's contents)."""
  devices = jax.devices()
  return {
    'target': _shapes(target),
    'draft': _shapes(draft),
    'batch': int(batch),
    'settings': repr(settings),
    'device': [
      devices[0].platform,
      devices[0].device_kind,
      len(devices),
      platform.node(),
      platform.machine(),
    ],
    'environment': sorted(
      (k, v)
      for k, v in os.environ.items()
      if k.startswith('SPEC_DECODE_') and k != 'SPEC_DECODE_CACHE_DIR'
    ),
    'jax': jax.__version__,
    'measure': MEASURE_VERSION,
  }


def cache_key(description: dict[str, Any]) -> str:
  text = json.dumps(description, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:24]


def _run(target, draft, enc, keys, settings, policy):
  out = loops.speculative_decode_jit(
    target, draft, enc, keys, settings=settings, policy=policy
  )
  jax.block_until_ready(out)
  return out


def _median_seconds(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def measure(
  target: Any,
  draft: Any,
  encoder_tokens: jax.Array,
  settings: DecodeSettings,
  repeats: int = REPEATS,
  iterations: int = TIMING_ITERATIONS,
  retry_rounds: int = RETRY_ROUNDS,
) -> list[float]:
  """Seconds of one auto-loop iteration at each gamma 0..G, `[G + 1]`.

  Each forced-gamma decode runs at most `iterations` iterations (fewer when
  its rows end sooner); its time less that of a decode of 0 iterations
  (setup and outputs), over the iterations it ran, timed in rounds (each
  gamma once per round; medians over rounds) and made non-decreasing in
  gamma (`non_decreasing`). A gamma that is not a candidate gets `inf`.
  Gammas whose medians are off the line through the others (`suspects`)
  are timed in `retry_rounds` more rounds first (their medians then over
  all their rounds).

  Args:
    target: the target.
    draft: the draft (model or drafter).
    encoder_tokens: `[B, S]` inputs with the decode's shapes (placed as the
      decode places them).
    settings: the auto decode's settings (`gamma_policy` set, gamma = G).
    repeats: timed rounds (medians).
    iterations: iterations per timing decode.
    retry_rounds: more rounds for the suspects (0: none).
  """
  batch = encoder_tokens.shape[0]
  base = jax.random.key(_TIMING_SEED)
  keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(
    jnp.arange(batch, dtype=jnp.uint32)
  )
  g_max = settings.gamma
  candidates = range(0 if zero_allowed(draft) else 1, g_max + 1)

  def policy(g: int, limit: int):
    return gamma_policy.PolicyInputs.create(
      np.ones(g_max + 1), forced_gamma=g, max_iterations=limit
    )

  run = lambda p: _run(target, draft, encoder_tokens, keys, settings, p)  # noqa: E731
  run(policy(1, 1))  # compile (the decode reuses the program)
  empty = policy(0, 0)
  forced = {g: policy(g, iterations) for g in candidates}
  # Iterations each forced decode runs (fewer than `iterations` when its
  # rows end sooner); this first run also warms its caches.
  ran = {
    g: max(int(np.asarray(run(p)[2].iterations).max(initial=0)), 1)
    for g, p in forced.items()
  }
  # Rounds: the setup and every gamma once per round, so that a change of
  # load on a shared machine moves them alike; a short decode (high gamma,
  # high acceptance) is run several times per round (up to 4), so that
  # each gamma's time rests on about as many iterations.
  # The order is reversed every other round, so that no gamma always runs
  # right after the same neighbour.
  setups, rounds = [], {g: [] for g in forced}

  def time_rounds(gammas, count):
    for r in range(count):
      setups.append(_median_seconds(lambda: run(empty), 1))
      order = [g for g in forced if g in gammas]
      for g in order if r % 2 == 0 else order[::-1]:
        k = min(math.ceil(iterations / ran[g]), 4)
        t0 = time.perf_counter()
        for _ in range(k):
          run(forced[g])
        rounds[g].append((time.perf_counter() - t0) / k)

  def per_iteration():
    setup = statistics.median(setups)
    raw = [math.inf] * (g_max + 1)
    for g in forced:
      raw[g] = max(statistics.median(rounds[g]) - setup, 1e-9) / ran[g]
    return raw

  time_rounds(set(forced), repeats)
  # A gamma off the line through the others was most likely timed during a
  # busy moment (measured: gamma 4 at 1.5x gamma 3 at batch 8, where a
  # later side-by-side timing put it 1.2x): time it again, more rounds.
  again = suspects(per_iteration())
  if again and retry_rounds:
    time_rounds(set(again), retry_rounds)
  return non_decreasing(per_iteration())


def suspects(
  seconds: list[float], tolerance: float = SPIKE_TOLERANCE
) -> list[int]:
  """Gammas >= 1 whose seconds are off a robust line through the others.

  An iteration at gamma g >= 1 costs about a + b g (g draft steps and a
  target call whose width grows with g); the line is the Theil-Sen fit
  (median of pairwise slopes, then median intercept), which one or two
  spikes do not move. A gamma more than `tolerance` (relative) off it is a
  suspect. Gamma 0 (no draft call, a different program path) and `inf`
  entries are not fitted. Fewer than four points: no suspects (a line
  through three points cannot outvote one).
  """
  points = [
    (g, s) for g, s in enumerate(seconds) if g >= 1 and math.isfinite(s)
  ]
  if len(points) < 4:
    return []
  slope = statistics.median(
    (s2 - s1) / (g2 - g1)
    for i, (g1, s1) in enumerate(points)
    for g2, s2 in points[i + 1 :]
  )
  intercept = statistics.median(s - slope * g for g, s in points)
  out = []
  for g, s in points:
    fit = intercept + slope * g
    if fit <= 0 or abs(s - fit) > tolerance * fit:
      out.append(g)
  return out


def non_decreasing(seconds: list[float]) -> list[float]:
  """The non-decreasing sequence closest to `seconds` in squared error.

  An iteration at gamma g + 1 does all the work of one at g and more (a
  draft step, a wider target call), so a measured decrease is noise (a
  busy moment on a shared machine); pooling adjacent violators (isotonic
  regression) removes it without favouring either side. `inf` entries
  (gammas that are not candidates) are kept as they are and skipped.
  """
  blocks = []  # [mean, count, indices]
  for i, x in enumerate(seconds):
    if not math.isfinite(x):
      continue
    blocks.append([x, 1, [i]])
    while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
      m2, n2, i2 = blocks.pop()
      m1, n1, i1 = blocks.pop()
      blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2, i1 + i2])
  out = list(seconds)
  for mean, _, indices in blocks:
    for i in indices:
      out[i] = mean
  return out


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
  desc = describe(target, draft, settings, encoder_tokens.shape[0])
  return cached_seconds(
    desc,
    lambda: measure(target, draft, encoder_tokens, settings),
    use_disk,
  )


def cached_seconds(
  description: dict[str, Any], measure_fn, use_disk: bool = True
) -> tuple[list[float], dict[str, Any]]:
  """`measure_fn()`'s list of seconds, cached under `description`.

  In memory, and (with `use_disk`) as `cache_dir()/<key>.json` holding the
  description too: an entry whose description differs, or that cannot be
  read, is measured again and rewritten (atomically).

  Returns:
    the seconds (`inf` kept), and `{'key', 'path', 'measured'}`.
  """
  desc = description
  key = cache_key(desc)
  path = os.path.join(cache_dir(), key + '.json') if use_disk else None
  info = {'key': key, 'path': path, 'measured': False}
  if key in _memory:
    return list(_memory[key]), info
  if path is not None and os.path.exists(path):
    try:
      with open(path) as f:
        stored = json.load(f)
      if stored.get('description') == json.loads(json.dumps(desc)):
        _memory[key] = [
          math.inf if s is None else float(s) for s in stored['seconds']
        ]
        return list(_memory[key]), info
    except (OSError, ValueError, KeyError):
      pass  # An unreadable entry is measured again and rewritten.
  seconds = [float(x) for x in measure_fn()]
  _memory[key] = seconds
  info['measured'] = True
  if path is not None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'w') as f:
      finite = [s if math.isfinite(s) else None for s in seconds]
      json.dump({'description': desc, 'seconds': finite}, f, indent=1)
    os.replace(tmp, path)
  return list(seconds), info

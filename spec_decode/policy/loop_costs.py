"""Seconds per loop iteration at each gamma, timed on forced runs of a loop.

The gamma='auto' policy (`finish_time`) needs `seconds[g]`, the walltime of
one iteration of the compiled loop at gamma g (g = 0: a plain target step).
They are timed on the loop itself, forced to each gamma for a few
iterations: what the loop really pays per iteration in context (target call
v(g + 1, B), g draft steps c(B), the loop's own work and the cache eviction
between the two models included). This module does the timing and the
robust clean-up of the figures for any loop given as a function `run(g,
limit)`; `chain.auto_costs` gives it the chain loop, `beam.costs` the
speculative beam loop (its two kinds as gammas 0 and 1).
"""

import math
import statistics
import time
from collections.abc import Callable
from collections.abc import Sequence

# Iterations per timing decode, and timed repeats (medians).
TIMING_ITERATIONS = 16
REPEATS = 3
# A gamma more than SPIKE_TOLERANCE off the line through the others is timed
# in RETRY_ROUNDS more rounds (`suspects`).
SPIKE_TOLERANCE = 0.1
RETRY_ROUNDS = 4


def measure(
  run: Callable[[int, int], int],
  candidates: Sequence[int],
  g_max: int,
  repeats: int = REPEATS,
  iterations: int = TIMING_ITERATIONS,
  retry_rounds: int = RETRY_ROUNDS,
) -> list[float]:
  """Seconds of one loop iteration at each gamma 0..G, `[G + 1]`.

  Each forced-gamma run does at most `iterations` iterations (fewer when
  its rows end sooner); its time less that of a run of 0 iterations
  (setup and outputs), over the iterations it ran, timed in rounds (each
  gamma once per round; medians over rounds) and made non-decreasing in
  gamma (`non_decreasing`). A gamma that is not a candidate gets `inf`.
  Gammas whose medians are off the line through the others (`suspects`)
  are timed in `retry_rounds` more rounds first (their medians then over
  all their rounds).

  Args:
    run: `run(g, limit)` runs the loop forced to gamma g for at most
      `limit` iterations, waits for it, and returns the iterations it ran.
      `run(1, 1)` first compiles the program.
    candidates: the gammas to time (the others get `inf`).
    g_max: the largest gamma G.
    repeats: timed rounds (medians).
    iterations: iterations per timing run.
    retry_rounds: more rounds for the suspects (0: none).
  """
  run(1, 1)  # compile (the decode reuses the program)
  # Iterations each forced run does (fewer than `iterations` when its rows
  # end sooner); this first run also warms its caches.
  ran = {g: max(int(run(g, iterations)), 1) for g in candidates}
  # Rounds: the setup and every gamma once per round, so that a change of
  # load on a shared machine moves them alike; a short decode (high gamma,
  # high acceptance) is run several times per round (up to 4), so that
  # each gamma's time rests on about as many iterations.
  # The order is reversed every other round, so that no gamma always runs
  # right after the same neighbour.
  setups, rounds = [], {g: [] for g in ran}

  def time_rounds(gammas, count):
    for r in range(count):
      t0 = time.perf_counter()
      run(0, 0)
      setups.append(time.perf_counter() - t0)
      order = [g for g in ran if g in gammas]
      for g in order if r % 2 == 0 else order[::-1]:
        k = min(math.ceil(iterations / ran[g]), 4)
        t0 = time.perf_counter()
        for _ in range(k):
          run(g, iterations)
        rounds[g].append((time.perf_counter() - t0) / k)

  def per_iteration():
    setup = statistics.median(setups)
    raw = [math.inf] * (g_max + 1)
    for g in ran:
      raw[g] = max(statistics.median(rounds[g]) - setup, 1e-9) / ran[g]
    return raw

  time_rounds(set(ran), repeats)
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

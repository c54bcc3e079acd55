"""`tree='auto'`: a tree shape from measured acceptance and measured costs.

One decode (`tree.generation.decode_auto`), in two parts:

1. Calibration: the decode's first `calibration_iterations(M)` iterations
   run with `CALIBRATION` (a wide, deep tree) and measure a[d][r] = P(the
   rank-r child at depth d is accepted | it is tested), the report's
   `rank_acceptance`. Depths and ranks the calibration tree lacks take the
   deepest measured depth's value, and 0 for untested ranks.
2. Under the model that a node at depth d and rank r is accepted with
   probability a[d][r] given that its parent was accepted and its elder
   siblings rejected, a node's probability of being accepted is
   P(parent) * prod_{r' < r} (1 - a[d][r']) * a[d][r], and the expected
   tokens per call are 1 + the sum over nodes. `best_trees` finds, for
   every budget n, the tree of at most n nodes with the most expected
   tokens (a dynamic program, as Sequoia's).
3. Cost of an iteration with n nodes at depth D: the tree loop's own
   iterations (`tree.loop.Iteration.step`: the drafter's tree, the
   target's tree call, verification, the commit and its records) are
   timed at this batch size and sampler for chains of depth 1, 2, 4, 8
   and stars of 4, 16, 32 nodes, on the first iterations of runs of the
   compiled loop from the decode's inputs with keys of their own, through
   `policy.loop_costs.measure` as gamma='auto''s costs are (rounds,
   medians, the setup subtracted, non-decreasing along the chains and
   along the stars), and t(n, D) = a + b n + c D is fitted to them.
4. Over every budget n <= `MAX_NODES` and depth cap D <= `MAX_DEPTH`, the
   best tree (step 2 with depths beyond the cap removed) with the most
   expected tokens per second is chosen, and the decode goes on with it
   from where the calibration left it; the report gives the expected and
   the measured tokens per call.

Exactness: the choice reads counts of tested and accepted nodes at output
positions the rows have committed, never a draw the rest of the decode
uses (those are keyed by later positions), so the output is the target's
distribution whatever the choice (as with gamma='auto').
"""

import functools
import math

import numpy as np

from spec_decode.core import inputs
from spec_decode.core import tree_shape as tree_lib
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.policy import loop_costs
from spec_decode.tree import loop

CALIBRATION = (4, 2, 2, 1, 1, 1)
# The calibration decodes the first max(1, M // CALIBRATION_SHARE)
# iterations of the decode itself.
CALIBRATION_SHARE = 16
MAX_NODES = 32
MAX_DEPTH = 8


def best_trees(acceptance: np.ndarray, budget: int) -> list[tuple]:
  """The tree with the most expected tokens for every budget 1..budget.

  Dynamic program (Sequoia's): with s[d][r] = prod_{r' < r} (1 - a[d][r'])
  * a[d][r], the probability that a node at depth d's rank-r child is the
  accepted one given the node was, a node reached with probability 1 and
  m nodes below it is worth f(d, m) = g(d, 0, m), where g(d, r, m) is the
  best of stopping (0) or giving rank r a subtree of k nodes:
  s[d][r] (1 + f(d + 1, k)) + g(d, r + 1, m - 1 - k). Child ranks are
  0..k-1 (a drafter's r-th choice), so a best tree is not simply the n
  likeliest nodes when s is not decreasing in r.

  Args:
    acceptance: `[D, W]` a[d][r] in [0, 1] (NaN treated as 0).
    budget: nodes at most.

  Returns:
    Per budget n = 1..budget: `(paths, expected accepted tokens)`; a tree
    may use fewer than n nodes when more would add nothing.
  """
  acc = np.nan_to_num(np.asarray(acceptance, np.float64), nan=0.0)
  depth, width = acc.shape
  share = np.zeros_like(acc)
  for d in range(depth):
    miss = np.concatenate([[1.0], np.cumprod(1.0 - acc[d])[:-1]])
    share[d] = miss * acc[d]

  @functools.lru_cache(maxsize=None)
  def g(d: int, r: int, m: int) -> tuple[float, tuple]:
    """(value, subtrees) for ranks r.. of a depth-d node, m nodes."""
    best = (0.0, ())
    if d >= depth or r >= width or m <= 0 or share[d, r] <= 0.0:
      return best
    for k in range(m):
      below, sub = g(d + 1, 0, k)
      rest, others = g(d, r + 1, m - 1 - k)
      value = share[d, r] * (1.0 + below) + rest
      if value > best[0] + 1e-15:
        best = (value, ((r, sub),) + others)
    return best

  def paths(prefix: tuple, subtrees: tuple) -> list[tuple]:
    out = []
    for rank, sub in subtrees:
      out.append(prefix + (rank,))
      out.extend(paths(prefix + (rank,), sub))
    return out

  return [
    (paths((), g(0, 0, n)[1]), g(0, 0, n)[0]) for n in range(1, budget + 1)
  ]


def extend(rank_acceptance: np.ndarray) -> np.ndarray:
  """`[MAX_DEPTH, W]` from the calibration's `[D, W]` (module docstring)."""
  acc = np.nan_to_num(np.asarray(rank_acceptance, np.float64), nan=0.0)
  if acc.shape[0] >= MAX_DEPTH:
    return acc[:MAX_DEPTH]
  tail = np.repeat(acc[-1:], MAX_DEPTH - acc.shape[0], axis=0)
  return np.concatenate([acc, tail], 0)


# Shapes timed for the cost fit: chains (cost per depth) and stars (cost
# per node at depth 1).
TIMED = tuple((1,) * d for d in (1, 2, 4, 8)) + tuple((w,) for w in (4, 16, 32))
# The timing decodes' seed (their draws are theirs, not the decode's).
_TIMING_SEED = 0x5EED


def _families(shapes) -> list[dict[int, tuple]]:
  """`shapes` (branching tuples) as families whose cost grows with one
  index, as `policy.loop_costs.measure`'s gammas do: chains by depth,
  one-level stars by width, any other tree alone (index 1)."""
  chains, stars, others = {}, {}, []
  for branching in shapes:
    if all(b == 1 for b in branching):
      chains[len(branching)] = branching
    elif len(branching) == 1:
      stars[branching[0]] = branching
    else:
      others.append({1: branching})
  return [f for f in (chains, stars) if f] + others


def iteration_seconds(
  target,
  draft,
  enc,
  settings: DecodeSettings,
  shapes=TIMED,
  repeats: int = loop_costs.REPEATS,
  iterations: int = loop_costs.TIMING_ITERATIONS,
  retry_rounds: int = loop_costs.RETRY_ROUNDS,
) -> dict[tuple, float]:
  """Seconds of one tree-loop iteration for each branching tuple in
  `shapes`, at this batch size and sampler.

  `policy.loop_costs.measure` (as gamma='auto''s costs) over runs of the
  tree loop itself (`tree.loop.start_and_iterate_jit`: the decode's
  iteration, at most `iterations` of them from the decode's inputs, with
  keys of their own), one family of shapes at a time (`_families`: a
  family's index plays the gamma). Every run has room for the largest tree
  `choose` considers, so that their setups (timed once per round and
  subtracted) are alike.

  Args:
    target: the target.
    draft: the draft (model or drafter).
    enc: `[B, S]` the decode's inputs (placed as the decode places them).
    settings: the decode's settings.
    shapes: the branching tuples to time.
    repeats: timed rounds (medians).
    iterations: iterations per timing run.
    retry_rounds: more rounds for the suspects (0: none).
  """
  keys = inputs.row_keys(_TIMING_SEED, enc.shape[0])
  out = {}
  for family in _families(shapes):

    def run(index: int, limit: int, family=family) -> int:
      # `measure`'s setup run (index 0, no iterations) and its first
      # compile (index 1) run the family's first shape where it has none.
      shape = tree_lib.from_branching(family.get(index, min(family.items())[1]))
      state = loop.run_jit(
        loop.start_and_iterate_jit,
        target,
        draft,
        enc,
        keys,
        settings,
        shape,
        room=(MAX_NODES, MAX_DEPTH),
        max_iterations=limit,
      )
      return int(np.asarray(state.counters.iterations).max(initial=0))

    seconds = loop_costs.measure(
      run, sorted(family), max(family), repeats, iterations, retry_rounds
    )
    out.update({family[i]: seconds[i] for i in family})
  return out


def fit_costs(seconds: dict[tuple, float]) -> tuple[float, float, float]:
  """(a, b, c) of t(N, D) = a + b N + c D by least squares (each >= 0)."""
  rows, ys = [], []
  for branching, t in seconds.items():
    shape = tree_lib.from_branching(branching)
    rows.append([1.0, shape.num_nodes, shape.depth])
    ys.append(t)
  coef = np.linalg.lstsq(np.asarray(rows), np.asarray(ys), rcond=None)[0]
  return tuple(float(max(c, 0.0)) for c in coef)


def choose(
  rank_acceptance: np.ndarray,
  cost: tuple[float, float, float],
  max_nodes: int = MAX_NODES,
) -> dict:
  """The best budget and its tree (module docstring, steps 2-4).

  Args:
    rank_acceptance: `[D, W]` measured a[d][r].
    cost: (a, b, c): an iteration with N nodes at depth D takes
      a + b N + c D seconds (`fit_costs`).
    max_nodes: the largest budget.
  """
  acc = extend(rank_acceptance)
  best = None
  candidates = [
    tree
    for depth_cap in range(1, acc.shape[0] + 1)
    for tree in best_trees(acc[:depth_cap], max_nodes)
  ]
  for paths, accepted in candidates:
    if not paths:
      continue
    n = len(paths)
    expected = 1.0 + accepted
    depth = max(len(p) for p in paths)
    seconds = cost[0] + cost[1] * n + cost[2] * depth
    rate = expected / seconds
    if best is None or rate > best['tokens_per_second']:
      best = {
        'paths': sorted(paths, key=lambda p: (len(p), p)),
        'num_nodes': n,
        'expected_tokens_per_call': expected,
        'seconds_per_call': seconds,
        'tokens_per_second': rate,
      }
  if best is None:  # Nothing was ever accepted: a chain of one.
    best = {
      'paths': [(0,)],
      'num_nodes': 1,
      'expected_tokens_per_call': 1.0,
      'seconds_per_call': math.nan,
      'tokens_per_second': math.nan,
    }
  return best


def calibration_iterations(max_decode_len: int) -> int:
  """Iterations decoded with `CALIBRATION` before the choice (step 1)."""
  return max(1, max_decode_len // CALIBRATION_SHARE)


def decide(model, draft, enc, settings, rank_acceptance):
  """Steps 2-4 after a calibration: `(choice, iteration seconds, cost fit)`.

  Args:
    model: the target.
    draft: the draft (model or drafter).
    enc: `[B, S]` the decode's inputs (placed as the decode places them).
    settings: the decode's settings.
    rank_acceptance: `[D, W]` the calibration's measured a[d][r].
  """
  timed = iteration_seconds(model, draft, enc, settings)
  cost = fit_costs(timed)
  return choose(rank_acceptance, cost), timed, cost

"""`tree='auto'`: a tree shape from measured acceptance and measured costs.

1. A calibration decode of this batch with `CALIBRATION` (a wide, deep
   tree) measures a[d][r] = P(the rank-r child at depth d is accepted | it
   is tested), `tree_generate.report`'s `rank_acceptance`. Depths and ranks
   the calibration tree lacks take the deepest measured depth's value, and
   0 for untested ranks.
2. Under the model that a node at depth d and rank r is accepted with
   probability a[d][r] given that its parent was accepted and its elder
   siblings rejected, a node's probability of being accepted is
   P(parent) * prod_{r' < r} (1 - a[d][r']) * a[d][r], and the expected
   tokens per call are 1 + the sum over nodes. `best_trees` finds, for
   every budget n, the tree of at most n nodes with the most expected
   tokens (a dynamic program, as Sequoia's).
3. Cost of an iteration with n nodes at depth D: the target's tree call on
   n + 1 tokens, timed (median of calls inside a compiled loop, at this
   batch size, for n in powers of two and interpolated), plus the drafter's
   proposal of a chain of depth D (timed at D = 1 and 2, linear in D).
4. The budget n <= `MAX_NODES` with the most expected tokens per second is
   chosen; the report gives the expected and the measured tokens per call.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spec_decode.core import costs
from spec_decode.core import drafter as drafter_lib
from spec_decode.core import model_drafter
from spec_decode.core import tree as tree_lib
from spec_decode.core.decode_settings import DecodeSettings

CALIBRATION = (4, 2, 2, 1, 1, 1)
MAX_NODES = 32
MAX_DEPTH = 8
_REPEATS = 5
_CALLS = 4


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


@functools.partial(jax.jit, static_argnames=('attention', 'calls'))
def _repeated_tree_score(model, state, tokens, attention, calls: int):
  def body(_, carry):
    st, acc = carry
    logits, st = model.score_tree(st, tokens, attention)
    return st, acc + logits[0, 0, 0]

  return lax.fori_loop(0, calls, body, (state, jnp.float32(0)))[1]


@functools.partial(jax.jit, static_argnames=('settings', 'shape', 'calls'))
def _repeated_propose(proposer, state, context, settings, shape, calls: int):
  def body(_, carry):
    st, acc = carry
    proposal, st = proposer.propose_tree(st, context, settings, shape)
    return st, acc + proposal.tokens[0, 0]

  return lax.fori_loop(0, calls, body, (state, jnp.int32(0)))[1]


def verify_seconds(model, batch: int, max_nodes: int) -> dict[int, float]:
  """Seconds of one target tree call on n + 1 tokens, n = 1, 2, 4, ...."""
  prefix, length = 16, 16 + max_nodes + 2
  state = model.init_state(jnp.full((batch, 16), 5, jnp.int32), length)
  state = model.score(state, jnp.zeros((batch, prefix), jnp.int32))[1]
  out = {}
  n = 1
  while True:
    attention = tree_lib.chain(n).target_attention()
    tokens = jnp.zeros((batch, n + 1), jnp.int32)
    out[n] = (
      costs.median_time(
        functools.partial(
          _repeated_tree_score, model, state, tokens, attention, calls=_CALLS
        ),
        _REPEATS,
      )
      / _CALLS
    )
    if n >= max_nodes:
      return out
    n = min(2 * n, max_nodes)


def draft_seconds(draft, enc, settings: DecodeSettings) -> tuple[float, float]:
  """(base, per depth) seconds of the drafter's proposal of a chain."""
  proposer = model_drafter.as_drafter(draft)
  batch = enc.shape[0]
  length = 16 + MAX_NODES + 2
  times = []
  for depth in (1, 2):
    shape = tree_lib.chain(depth)
    state = proposer.init_draft(enc, length)
    inputs = jnp.full((batch, length), 5, jnp.int32).at[:, 0].set(0)
    keys = jax.random.split(jax.random.key(0), batch * depth)
    context = drafter_lib.DraftContext(
      inputs=inputs,
      length=jnp.full((batch,), 8, jnp.int32),
      encoder_tokens=enc,
      keys=keys.reshape(batch, depth),
      target_features=_features(proposer, draft, batch),
    )
    s = DecodeSettings(max_decode_len=8, sampler=settings.sampler, gamma=depth)
    times.append(
      costs.median_time(
        functools.partial(
          _repeated_propose, proposer, state, context, s, shape, calls=_CALLS
        ),
        _REPEATS,
      )
      / _CALLS
    )
  per_depth = max(times[1] - times[0], 0.0)
  return max(times[0] - per_depth, 0.0), per_depth


def _features(proposer, draft, batch):
  if not getattr(proposer, 'uses_target_features', False):
    return None
  size = getattr(draft, 'feature_size', None) or draft.projection.shape[1]
  return jnp.zeros((batch, size), jnp.float32)


def _interpolate(table: dict[int, float], n: int) -> float:
  """v(n), linear between the timed sizes; made non-decreasing first (a
  bigger call never costs less; timing noise can say otherwise)."""
  xs = sorted(table)
  ys = np.maximum.accumulate([table[x] for x in xs])
  return float(np.interp(n, xs, ys))


def choose(
  rank_acceptance: np.ndarray,
  verify: dict[int, float],
  draft_base: float,
  draft_per_depth: float,
  max_nodes: int = MAX_NODES,
) -> dict:
  """The best budget and its tree (module docstring, steps 2-4)."""
  best = None
  for paths, accepted in best_trees(extend(rank_acceptance), max_nodes):
    if not paths:
      continue
    n = len(paths)
    expected = 1.0 + accepted
    depth = max(len(p) for p in paths)
    seconds = _interpolate(verify, n) + draft_base + draft_per_depth * depth
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


def run(model, draft, enc, keys, settings, batch, decode):
  """Calibrates, chooses and decodes; `decode` is `tree_generate.decode`."""
  calibration = tree_lib.from_branching(CALIBRATION)
  _, _, _, cal = decode(model, draft, enc, keys, settings, calibration, batch)
  verify = verify_seconds(model, enc.shape[0], MAX_NODES)
  base, per_depth = draft_seconds(draft, enc, settings)
  choice = choose(cal['rank_acceptance'], verify, base, per_depth)
  shape = tree_lib.from_paths(choice['paths'])
  out, lengths, counters, report = decode(
    model, draft, enc, keys, settings, shape, batch
  )
  choice = dict(choice, paths=[list(p) for p in choice['paths']])
  report['auto'] = dict(
    choice,
    calibration_rank_acceptance=cal['rank_acceptance'],
    verify_seconds=verify,
    draft_seconds=(base, per_depth),
    measured_tokens_per_call=report['tokens_per_call'],
  )
  return out, lengths, counters, report

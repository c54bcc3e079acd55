"""`generate(tree=...)`: checks, the tree loop, and what it measured.

`generate` calls `check` before anything compiles and `decode` to run the
loop; the statistics come back as the chain loop's counters (`SpecCounters`
with the per-node counts; for `SpecStats` depth d plays position d) plus a
`tree` report with the
per-node, per-depth and per-rank acceptance that `tree='auto'` uses, and
the tokens' provenance (`core.provenance`: the accepted path, each node's
rank among its siblings, the target's token and the rejected child).

Dynamic trees (EAGLE-2 style, `core.tree_shape.DynamicTree`): `tree=` a
`DynamicTree` (a node budget: nodes per depth, most children per node),
or `tree='dynamic'`, whose budget is tree='auto''s choice: the static tree
with the most expected tokens per second under the same calibration and
cost model (`tree.auto`), its nodes per depth kept and their parents left
to the draft's confidence (`dynamic_like`).
"""

from typing import Any

import jax
import numpy as np

from spec_decode.core import inputs
from spec_decode.core import loop_state
from spec_decode.core import placement
from spec_decode.core import provenance
from spec_decode.core import tree_shape as tree_lib
from spec_decode.core.counters import SpecCounters
from spec_decode.tree import auto as tree_auto
from spec_decode.tree import loop as tree_loop


def check(
  model: Any, draft: Any, tree: Any, verifier: Any, lenience: float, tau: float
) -> tree_lib.TreeShape | None:
  """Validates a `tree=` request; the shape (None for 'auto').

  Raises:
    ValueError: naming the problem (no draft, an inexact setting, a model
      or drafter that cannot score or propose trees, a malformed tree).
  """
  if draft is None:
    raise ValueError('tree= needs a draft (plain decoding has no tree)')
  if verifier is not None or lenience != 1.0:
    raise ValueError(
      'tree= verifies exactly (recursive rejection); verifier= and '
      'lenience= apply to chains only'
    )
  if tau > 0.0:
    raise ValueError('dynamic_gamma applies to chains only, not to tree=')
  if not hasattr(model, 'score_tree') or not hasattr(model, 'commit_tree'):
    raise ValueError(
      f'tree= needs a target that scores trees (score_tree, commit_tree); '
      f'{type(model).__name__} does not'
    )
  if not hasattr(draft, 'propose_tree'):
    if hasattr(draft, 'propose'):
      raise ValueError(
        f'drafter {type(draft).__name__} does not propose trees '
        '(no propose_tree); use gamma= for its chains'
      )
    if not hasattr(draft, 'score_tree'):
      raise ValueError(
        f'tree= needs a draft model that scores trees; '
        f'{type(draft).__name__} has no score_tree'
      )
  if is_auto(tree):
    return None
  if is_dynamic_auto(tree):
    return DYNAMIC
  if tree_lib.is_dynamic(tree):
    return tree
  return tree_lib.parse(tree)


# `check`'s answer for tree='dynamic' (the budget chosen in the decode).
DYNAMIC = 'dynamic'


def is_auto(tree: Any) -> bool:
  return inputs.is_auto(tree)


def is_dynamic_auto(tree: Any) -> bool:
  """Whether `tree` spells 'dynamic' (any case, surrounding whitespace)."""
  return isinstance(tree, str) and tree.strip().lower() == DYNAMIC


def dynamic_like(paths) -> tree_lib.DynamicTree:
  """The dynamic tree with the nodes per depth of the static tree `paths`
  (tree='dynamic''s budget)."""
  return tree_lib.DynamicTree.like(tree_lib.from_paths(paths))


def run(model, draft, enc, keys, settings, shape, batch):
  """`generate`'s tree path: a fixed shape or `DynamicTree`, 'auto'
  (shape None) or 'dynamic' (`DYNAMIC`)."""
  if shape is None:
    return decode_auto(model, draft, enc, keys, settings, batch)
  if shape == DYNAMIC:
    return decode_auto(model, draft, enc, keys, settings, batch, dynamic=True)
  return decode(model, draft, enc, keys, settings, shape, batch)


def _provenance(record, settings, batch):
  """The first `batch` rows' `core.provenance.Provenance` (or None)."""
  if record is None:
    return None
  prov = provenance.Provenance.of(record, settings.max_decode_len)
  return prov.rows(slice(0, batch))


def decode(model, draft, enc, keys, settings, shape, batch):
  """Runs the tree loop; returns tokens, lengths, `SpecCounters`, the
  tree report and the tokens' provenance (host numpy, the first `batch`
  rows)."""
  out, lengths, counters, record = placement.to_host(
    tree_loop.run_jit(
      tree_loop.tree_decode_jit, model, draft, enc, keys, settings, shape
    )
  )
  counters = jax.tree.map(lambda x: np.asarray(x)[:batch], counters)
  lengths = lengths[:batch]
  prov = _provenance(record, settings, batch)
  return out[:batch], lengths, counters, report(shape, counters, lengths), prov


def decode_auto(model, draft, enc, keys, settings, batch, dynamic=False):
  """tree='auto' in one decode (`tree.auto`): the first iterations with the
  calibration tree, then the tree chosen from what they accepted, from the
  same loop state, with the same keys (`dynamic`: tree='dynamic', the
  dynamic tree with the chosen tree's nodes per depth). When the chosen
  tree is shallower, its first iteration re-synchronises the drafter with
  the committed prefix (the calibration may have accepted more tokens than
  the new tree is deep; `tree.loop.Iteration.iterate`).

  Exact: the choice reads the calibration iterations' counts of tested and
  accepted nodes (and costs timed with other keys), which depend only on
  the draws at output positions each row has already committed; every later
  draw is keyed by its row and a later position, so it is independent of
  the choice, and each iteration samples exactly whatever its tree
  (`tree.verification`).
  """
  calibration = tree_lib.from_branching(tree_auto.CALIBRATION)
  room = (max(calibration.num_nodes, tree_auto.MAX_NODES), tree_auto.MAX_DEPTH)
  state = tree_loop.run_jit(
    tree_loop.start_and_iterate_jit,
    model,
    draft,
    enc,
    keys,
    settings,
    calibration,
    room=room,
    max_iterations=tree_auto.calibration_iterations(settings.max_decode_len),
  )
  cal_counters, cal_lengths = placement.to_host((state.counters, state.length))
  cal_counters = jax.tree.map(lambda x: x[:batch], cal_counters)
  cal = report(calibration, cal_counters, cal_lengths[:batch])
  choice, timed, cost = tree_auto.decide(
    model, draft, enc, settings, cal['rank_acceptance']
  )
  shape = tree_lib.from_paths(choice['paths'])
  if dynamic:
    shape = dynamic_like(choice['paths'])
  state = tree_loop.run_jit(
    tree_loop.go_on_jit, model, draft, enc, keys, settings, shape, state=state
  )
  (out, lengths), counters, record = placement.to_host(
    (loop_state.outputs(state, settings), state.counters, state.provenance)
  )
  out, lengths = out[:batch], lengths[:batch]
  counters = jax.tree.map(lambda x: x[:batch], counters)
  tree = report(shape, counters, lengths - cal_lengths[:batch])
  tree['auto'] = dict(
    choice,
    paths=[list(p) for p in choice['paths']],
    calibration=dict(
      paths=cal['paths'],
      iterations=int(cal_counters.iterations.max(initial=0)),
      tokens_per_call=cal['tokens_per_call'],
    ),
    calibration_rank_acceptance=cal['rank_acceptance'],
    iteration_seconds={str(k): v for k, v in timed.items()},
    cost_fit=cost,
    measured_tokens_per_call=tree['tokens_per_call'],
  )
  if dynamic:  # The expected count is the static tree's (a lower bound).
    tree['auto']['dynamic_levels'] = list(shape.levels)
  spec = _joined(cal_counters, counters)
  return out, lengths, spec, tree, _provenance(record, settings, batch)


def _joined(a: SpecCounters, b: SpecCounters) -> SpecCounters:
  """Two phases' counters summed, per-depth arrays padded to the deeper
  (their trees' per-node counts differ: the sum has none)."""

  def pad(x, width):
    return np.pad(x, ((0, 0), (0, width - x.shape[1])))

  depth = max(a.position_tries.shape[1], b.position_tries.shape[1])
  return SpecCounters(
    iterations=a.iterations + b.iterations,
    accepted_histogram=pad(a.accepted_histogram, depth + 1)
    + pad(b.accepted_histogram, depth + 1),
    position_tries=pad(a.position_tries, depth) + pad(b.position_tries, depth),
    position_accepts=pad(a.position_accepts, depth)
    + pad(b.position_accepts, depth),
    beta_sum=a.beta_sum + b.beta_sum,
    proposed=a.proposed + b.proposed,
  )


def report(shape, counters: SpecCounters, lengths) -> dict:
  """What a tree decode measured (plain Python / numpy values).

  Keys: `paths` (the shape), `num_nodes`, `depth`, `node_tries` and
  `node_accepts` `[N]` (summed over rows), `rank_acceptance` `[D, W]`
  (P(the rank-r child at depth d is accepted | it was tested), NaN where
  never tested), `tokens_per_call` (output tokens per target call). A
  `DynamicTree`'s ranks vary by row: `levels` and `width` instead of
  `paths`, and `depth_acceptance` `[D]` (P(a node at depth d is accepted |
  tested)) instead of the per-rank counts.
  """
  tries = counters.node_tries.sum(0)
  accepts = counters.node_accepts.sum(0)
  iters = counters.iterations
  tokens_per_call = float(np.sum(lengths) / max(int(iters.sum()), 1))
  if tree_lib.is_dynamic(shape):
    depth_of = shape.depths[1:] - 1
    d_tries = np.bincount(depth_of, tries, shape.depth)
    d_accepts = np.bincount(depth_of, accepts, shape.depth)
    with np.errstate(invalid='ignore', divide='ignore'):
      depth_acc = np.where(d_tries > 0, d_accepts / d_tries, np.nan)
    return {
      'levels': list(shape.levels),
      'width': shape.width,
      'num_nodes': shape.num_nodes,
      'depth': shape.depth,
      'node_tries': tries,
      'node_accepts': accepts,
      'depth_acceptance': depth_acc,
      'tokens_per_call': tokens_per_call,
    }
  d, w = shape.depth, shape.width
  rank_tries = np.zeros((d, w))
  rank_accepts = np.zeros((d, w))
  np.add.at(rank_tries, (shape.depths[1:] - 1, shape.ranks[1:]), tries)
  np.add.at(rank_accepts, (shape.depths[1:] - 1, shape.ranks[1:]), accepts)
  with np.errstate(invalid='ignore', divide='ignore'):
    rank_acc = np.where(rank_tries > 0, rank_accepts / rank_tries, np.nan)
  return {
    'paths': [list(p) for p in shape.paths],
    'num_nodes': shape.num_nodes,
    'depth': shape.depth,
    'node_tries': tries,
    'node_accepts': accepts,
    'rank_tries': rank_tries,
    'rank_acceptance': rank_acc,
    'tokens_per_call': tokens_per_call,
  }

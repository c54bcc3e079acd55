"""`generate(tree=...)`: checks, the tree loop, and what it measured.

`generate` calls `check` before anything compiles and `decode` to run the
loop; the statistics come back as the chain loop's counters (for
`SpecStats`: depth d plays position d) plus a `tree` report with the
per-node, per-depth and per-rank acceptance that `tree='auto'` uses.
"""

import dataclasses
from typing import Any

import jax
import numpy as np

from spec_decode.core import placement
from spec_decode.core import tree_shape as tree_lib
from spec_decode.core.counters import SpecCounters
from spec_decode.core.decode_settings import DecodeSettings
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
  return tree_lib.parse(tree)


def is_auto(tree: Any) -> bool:
  return isinstance(tree, str) and tree.strip().lower() == 'auto'


def settings_for(
  settings: DecodeSettings, shape: tree_lib.TreeShape
) -> DecodeSettings:
  """The loop's settings: gamma is the tree's depth."""
  return dataclasses.replace(settings, gamma=shape.depth, dynamic_gamma=0.0)


def run(model, draft, enc, keys, settings, shape, batch):
  """`generate`'s tree path: a fixed shape, or 'auto' (shape None)."""
  if shape is None:
    return tree_auto.run(model, draft, enc, keys, settings, batch, decode)
  return decode(model, draft, enc, keys, settings, shape, batch)


def decode(model, draft, enc, keys, settings, shape, batch):
  """Runs the tree loop; returns tokens, lengths, `SpecCounters` and
  the tree report (host numpy, the first `batch` rows)."""
  out, lengths, counters = placement.to_host(
    tree_loop.tree_decode_jit(
      model,
      draft,
      enc,
      keys,
      settings=settings_for(settings, shape),
      shape=shape,
    )
  )
  counters = jax.tree.map(lambda x: np.asarray(x)[:batch], counters)
  lengths = lengths[:batch]
  spec = SpecCounters(
    iterations=counters.iterations,
    accepted_histogram=counters.accepted_histogram,
    position_tries=counters.position_tries,
    position_accepts=counters.position_accepts,
    beta_sum=counters.beta_sum,
    proposed=counters.proposed,
  )
  return out[:batch], lengths, spec, report(shape, counters, lengths)


def report(
  shape: tree_lib.TreeShape, counters: tree_loop.TreeCounters, lengths
) -> dict:
  """What a tree decode measured (plain Python / numpy values).

  Keys: `paths` (the shape), `num_nodes`, `depth`, `node_tries` and
  `node_accepts` `[N]` (summed over rows), `rank_acceptance` `[D, W]`
  (P(the rank-r child at depth d is accepted | it was tested), NaN where
  never tested), `tokens_per_call` (output tokens per target call).
  """
  tries = counters.node_tries.sum(0)
  accepts = counters.node_accepts.sum(0)
  d, w = shape.depth, shape.width
  rank_tries = np.zeros((d, w))
  rank_accepts = np.zeros((d, w))
  np.add.at(rank_tries, (shape.depths[1:] - 1, shape.ranks[1:]), tries)
  np.add.at(rank_accepts, (shape.depths[1:] - 1, shape.ranks[1:]), accepts)
  with np.errstate(invalid='ignore', divide='ignore'):
    rank_acc = np.where(rank_tries > 0, rank_accepts / rank_tries, np.nan)
  iters = counters.iterations
  return {
    'paths': [list(p) for p in shape.paths],
    'num_nodes': shape.num_nodes,
    'depth': shape.depth,
    'node_tries': tries,
    'node_accepts': accepts,
    'rank_tries': rank_tries,
    'rank_acceptance': rank_acc,
    'tokens_per_call': float(np.sum(lengths) / max(int(iters.sum()), 1)),
  }

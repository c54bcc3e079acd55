"""Drafters that propose the target's own greedy tokens (draft = target):
with greedy decoding a drafter whose state holds the committed prefix has
every draft token accepted, so any rejection shows a stale state."""

import jax
import numpy as np

from spec_decode.drafters import EarlyExit
from spec_decode.drafters import FeatureDraft

SELF_DRAFTS = ('model', 'early_exit', 'feature')


def feature_as_target(target) -> FeatureDraft:
  """A feature draft that computes the target's decoder: every target
  layer (copied), and a fusion that passes the token embedding through
  and ignores the feature."""
  draft = FeatureDraft.init(target, num_layers=target.config.num_decoder_layers)
  d = target.config.emb_dim
  params = jax.tree.map(np.array, draft.params)
  params['fc']['kernel'] = np.concatenate([np.eye(d), np.zeros((d, d))]).astype(
    np.float32
  )
  return draft.with_params(params)


def self_draft(name: str, target):
  """`name` in `SELF_DRAFTS`: the target as a model draft, its early exit
  after all its layers, or `feature_as_target`."""
  if name == 'model':
    return target
  if name == 'early_exit':
    return EarlyExit.of(target, target.config.num_decoder_layers)
  if name == 'feature':
    return feature_as_target(target)
  raise ValueError(name)

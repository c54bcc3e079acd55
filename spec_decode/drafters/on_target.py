"""Drafters made of a target's own layers: what every model family shares.

The feature draft (`feature.py` for T5, `feature_t5gemma.py`) and the
early-exit self-draft (`early_exit.py`, `early_exit_t5gemma.py`) draft the
same way on a T5 and on a T5Gemma target; only how the family's layers run
and what its cache is differ. The drafting loops (the catch-up block,
`propose`, `propose_tree`) and the argument checks live here once; each
family's class inherits them and supplies the few methods they call:

  `FeatureDrafting`: `cross_layers` (the target layers whose encoder-side
    keys and values the draft layers read), `logits(features)` (over the
    full vocabulary; a draft with a draft vocabulary, `draft_vocab` ids,
    also `draft_logits(features)` over those ids alone), and
    `run_tokens(features, tokens, positions, cross, cache, tree)` (the
    network on token ids; `positions` None for inputs past the newest
    committed one, never position 0). Its state is a dataclass with a
    `cache` that has `rollback(index)`.
  `EarlyExitDrafting`: `model()` (the truncated target, a language model),
    `synced(state, context, width)` (the draft's decode state holding
    inputs 0..n-1; a family that copies slots from the target's cache
    copies those of the last `width` inputs) and `next_state(state,
    decode_state)` (the draft's state after a call).

A feature draft's checkpoint is one format for both families
(`save_feature_draft`, `read_feature_info`, `restore_params`): `params/`
(orbax, the draft network only), `feature_draft.json` (its shape,
`cross_layers`, and the target's config, whose `family` says which
family's draft it is) and the vocabulary.
"""

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from spec_decode import checkpoints
from spec_decode.core import drafter
from spec_decode.core import model_drafter
from spec_decode.core import tree_draft
from spec_decode.core.decode_settings import DecodeSettings


def check_num_layers(num_layers: Any, layers: int) -> int:
  """`num_layers` as an int in [1, `layers`] (the target's decoder layers).

  Raises:
    ValueError: it is not.
  """
  if isinstance(num_layers, bool) or not 1 <= int(num_layers) <= layers:
    raise ValueError(
      f'num_layers must be in [1, {layers}] (the target has {layers} '
      f'decoder layers), got {num_layers!r}'
    )
  return int(num_layers)


def cross_layers_for(
  num_layers: int, layers: int, cross_layers: Any = None
) -> tuple[int, ...]:
  """The target decoder layer each of `num_layers` draft layers reads
  (default the last `num_layers` of the target's `layers`).

  Raises:
    ValueError: `num_layers` < 1, or `cross_layers` does not name
      `num_layers` target layers.
  """
  if num_layers < 1:
    raise ValueError(f'num_layers must be >= 1, got {num_layers}')
  if cross_layers is None:
    first = max(layers - num_layers, 0)
    cross_layers = tuple(min(first + i, layers - 1) for i in range(num_layers))
  cross_layers = tuple(int(j) for j in cross_layers)
  if len(cross_layers) != num_layers or not all(
    0 <= j < layers for j in cross_layers
  ):
    raise ValueError(
      f'cross_layers must name {num_layers} target decoder layers in '
      f'[0, {layers}), got {cross_layers}'
    )
  return cross_layers


INFO_FILE = 'feature_draft.json'
FAMILY_NAMES = {'t5': 'T5', 't5gemma': 'T5Gemma'}


def family_of(config: Any) -> str:
  """'t5gemma' for a `T5GemmaConfig`, 't5' for a `T5Config` (or either's
  `to_dict()`: a T5 config's has no family)."""
  d = config if isinstance(config, dict) else config.to_dict()
  return d.get('family', 't5')


def save_feature_draft(draft: Any, path: str, info: dict) -> None:
  """Writes `draft`'s network (`draft.params`), `info` plus the target's
  config, and its vocabulary to a new directory `path`.

  Raises:
    FileExistsError: `path` exists and is not empty.
  """
  path = checkpoints.save_arrays(path, jax.tree.map(np.asarray, draft.params))
  info = dict(info, target_config=draft.target.config.to_dict())
  with open(os.path.join(path, INFO_FILE), 'w') as f:
    json.dump(info, f, indent=2, sort_keys=True)
  if draft.vocabulary is not None:
    checkpoints.write_vocabulary(path, draft.vocabulary)


def read_feature_info(path: str, target_config: Any) -> dict:
  """The `feature_draft.json` of the draft in `path`, after the check that
  it was saved for `target_config`'s family.

  Raises:
    FileNotFoundError: `path` holds no feature draft.
    ValueError: it is a draft for the other family's targets.
  """
  info_file = os.path.join(path, INFO_FILE)
  if not os.path.isfile(info_file):
    raise FileNotFoundError(f'{path}: no {INFO_FILE}; not a feature draft')
  with open(info_file) as f:
    info = json.load(f)
  saved, here = family_of(info['target_config']), family_of(target_config)
  if saved != here:
    raise ValueError(
      f'{path}: a feature draft trained for a {FAMILY_NAMES[saved]} target '
      f'cannot draft for a {FAMILY_NAMES[here]} target (train one on it: '
      '`spec-decode train` with `feature.train_feature`)'
    )
  return info


def check_target(path: str, wrong: list[str]) -> None:
  """Refuses a draft whose saved target differs in the fields `wrong`
  lists (`'name saved != target's'` each).

  Raises:
    ValueError: `wrong` is not empty.
  """
  if wrong:
    raise ValueError(
      f'{path}: the feature draft was trained for another target '
      f'({", ".join(wrong)})'
    )


def restore_params(path: str, abstract: Any) -> Any:
  """The network's parameters in `path/params`, shaped as `abstract`."""
  params = ocp.StandardCheckpointer().restore(
    os.path.join(path, checkpoints.PARAMS_DIR), abstract
  )
  return jax.tree.map(jnp.asarray, params)


def cross_of(cross: Any, layers: Any) -> Any:
  """A family's encoder-side keys and values (`cross`, a dataclass of
  per-layer `keys` and `values`) of the decoder layers `layers` only."""
  return cross.replace(
    keys=tuple(cross.keys[j] for j in layers),
    values=tuple(cross.values[j] for j in layers),
  )


class OnTarget:
  """The vocabulary of a drafter that is the target's (`target`)."""

  target: Any

  @property
  def vocab_size(self) -> int:
    return self.target.vocab_size

  @property
  def vocabulary(self) -> Any:
    return self.target.vocabulary


class FeatureDrafting(OnTarget):
  """The feature draft's drafting (`feature.py`'s module docstring)."""

  uses_target_features = True
  uses_recent_features = True
  uses_target_state = True
  # None, or the draft vocabulary: `[N]` distinct token ids, the only ones
  # the draft proposes (q = 0 elsewhere).
  draft_vocab = None

  @property
  def draft_vocab_size(self) -> int:
    """N, the ids the draft can propose (V without a draft vocabulary)."""
    if self.draft_vocab is None:
      return self.vocab_size
    return int(self.draft_vocab.shape[0])

  def draft_logits(self, features: Any) -> Any:
    """Logits `[..., N]` over `draft_vocab` (`[..., V]` without one)."""
    return self.logits(features)

  def _vocab(self) -> Any:
    """`model_drafter.draft_chain`'s `vocab`: None or `(ids, V)`."""
    if self.draft_vocab is None:
      return None
    return self.draft_vocab, self.vocab_size

  def cross(self, target_state: Any) -> Any:
    """The target's encoder-side keys and values the draft layers read
    (those of its decoder layers `cross_layers`)."""
    return cross_of(target_state.cross, self.cross_layers)

  def _catch_up(self, state, context, cross, depth: int):
    """Re-feeds the last A + 1 inputs with the target's features, A the
    most tokens the previous iteration accepted (`drafter.accepted_bound`
    of this call's `depth`): the predicted feature `[B, D]` of input n and
    the cache holding inputs 0..n. Its cache held the inputs up to the
    previous call's newest (n - A - 1 or later) from the target's
    features; what it drafted after them is overwritten here."""
    window = context.recent_features
    if window is None or context.target_state is None:
      raise ValueError(
        'FeatureDraft needs DraftContext.recent_features and target_state '
        '(the loops fill them for drafters that declare them)'
      )
    n = context.length
    k = window.shape[1]
    w = drafter.accepted_bound(context, depth) + 1
    if w > k:
      raise ValueError(
        f'the previous iteration may have committed {w} inputs, the '
        f'feature window holds {k} (the loop sizes it for its deepest '
        'iteration)'
      )
    start = jnp.maximum(n - w + 1, 0)
    cols = start[:, None] + jnp.arange(w)[None]  # Inputs t of the block.
    width = context.inputs.shape[1]
    tokens = jnp.take_along_axis(
      context.inputs, jnp.minimum(cols, width - 1), axis=1
    )
    # The window's entry j is input n - K + j; input t reads input t - 1.
    fidx = jnp.clip(cols - 1 - (n[:, None] - k), 0, k - 1)
    feats = jnp.take_along_axis(window, fidx[..., None], axis=1)
    cache = state.cache.rollback(start)
    hidden, cache = self.run_tokens(feats, tokens, cols, cross, cache)
    rows = jnp.arange(n.shape[0])
    return hidden[rows, n - start], cache.rollback(n + 1)

  def propose(
    self, state: Any, context: drafter.DraftContext, settings: DecodeSettings
  ) -> tuple[drafter.Proposal, Any]:
    """Tokens n+1..n+G (`feature.py`'s module docstring)."""
    cross = self.cross(context.target_state)
    h, cache = self._catch_up(state, context, cross, settings.gamma)

    def step(carry, prev):
      cache, h = carry
      out, cache = self.run_tokens(
        h[:, None], prev[:, None], None, cross, cache
      )
      h = out[:, 0]
      return self.draft_logits(h), (cache, h)

    # Drawn over the draft vocabulary (if any), q scattered to V.
    proposal, (cache, _) = model_drafter.draft_chain(
      step,
      (cache, h),
      self.draft_logits(h),
      context.keys,
      settings.sampler,
      settings.dynamic_gamma,
      self._vocab(),
    )
    return proposal, state.replace(cache=cache)

  def propose_tree(
    self,
    state: Any,
    context: drafter.DraftContext,
    settings: DecodeSettings,
    shape,
  ) -> tuple[drafter.TreeProposal, Any]:
    """The tree level by level; a node reads its parent's predicted
    feature (`feature.py`'s module docstring)."""
    cross = self.cross(context.target_state)
    h, cache = self._catch_up(state, context, cross, shape.depth)
    hidden = (
      jnp.zeros((h.shape[0], shape.num_nodes + 1, h.shape[-1]), jnp.float32)
      .at[:, 0]
      .set(h)
    )

    def level_logits(level, tokens, carry):
      cache, hidden = carry
      fed = level.fed
      out, cache = self.run_tokens(
        level.at_parents(hidden), tokens[:, fed], None, cross, cache,
        level.attention,
      )  # fmt: skip
      return self.logits(out), (cache, hidden.at[:, fed].set(out))

    proposal, (cache, _) = tree_draft.expand(
      shape,
      settings.sampler,
      self.logits(h),
      level_logits,
      (cache, hidden),
      context.keys,
    )
    return proposal, state.replace(cache=cache)


class EarlyExitDrafting(OnTarget):
  """The early-exit self-draft's drafting (`early_exit.py`'s docstring)."""

  uses_target_features = False
  uses_target_state = True

  def target_state(self, context: drafter.DraftContext) -> Any:
    """The target's decode state in `context` (a clear error without)."""
    if context.target_state is None:
      raise ValueError(
        'EarlyExit needs DraftContext.target_state (the loops fill it for '
        'drafters with uses_target_state)'
      )
    return context.target_state

  def _root(self, model, ds, context):
    """Feeds the newest input n: logits `[B, V]` of token n + 1."""
    newest = jnp.take_along_axis(context.inputs, context.length[:, None], 1)
    logits, ds = model.score(ds, newest)
    return logits[:, 0], ds

  def propose(self, state, context, settings) -> tuple[drafter.Proposal, Any]:
    """G tokens, one k-layer call each (the first feeds input n alone)."""
    model = self.model()
    first, ds = self._root(model, self.synced(state, context, 1), context)

    def step(ds, prev):
      logits, ds = model.score(ds, prev[:, None])
      return logits[:, 0], ds

    proposal, ds = model_drafter.draft_chain(
      step, ds, first, context.keys, settings.sampler, settings.dynamic_gamma
    )
    return proposal, self.next_state(state, ds)

  def propose_tree(self, state, context, settings, shape):
    """The tree level by level (`tree_draft.expand`), after one call for
    the newest input; its nodes go in scratch slots past n, as the
    target's do."""
    model = self.model()
    width = drafter.accepted_bound(context, shape.depth) + 1
    root, ds = self._root(model, self.synced(state, context, width), context)

    def level_logits(level, tokens, ds):
      return model.score_tree(ds, tokens[:, level.fed], level.attention)

    proposal, ds = tree_draft.expand(
      shape, settings.sampler, root, level_logits, ds, context.keys
    )
    return proposal, self.next_state(state, ds)

"""An early-exit self-draft: the target's first k decoder layers.

The draft is the target itself cut after decoder layer k (CALM, LayerSkip):
its first k decoder layers, then its final layer norm and its output
projection. No training and no second set of weights: the draft's
parameters are the target's arrays (and, on the CPU kernel, the target's
packed copies of them).

What is shared with the target, and why it is exact to share:
  * the encoder output and the encoder-side keys and values of decoder
    layers 0..k-1: the draft reads the ones in the target's decode state
    (`DraftContext.target_state`); no encoder pass and no cross-attention
    projection runs for the draft, and none is stored twice. They are the
    same function of the same input, so they are equal;
  * the self-attention keys and values of layers 0..k-1 at committed
    inputs: they depend only on the inputs up to that position through
    layers 0..k-1, which the draft and the target share, so the target's
    are the draft's. Each iteration the draft copies the slots of the last
    K committed inputs from the target's cache into its own, where a
    separate draft model re-feeds them: a chain's first draft call feeds
    one input (the newest) instead of two, a tree's one instead of D + 1.
    K = 1 for a chain (the other inputs the previous iteration committed
    are its own draft steps' tokens, whose slots those steps wrote: it
    accepted no more than it drafted), and for a tree the most tokens the
    previous iteration accepted + 1 (`core.drafter.accepted_bound`: the
    depth + 1, or the previous tree's after a switch to a shallower tree;
    the slots after the previous root hold that tree's scratch nodes).

What is not shared: the draft keeps its own k-layer self-attention cache
(the slots of its speculative tokens, which the target must not see before
it verifies them); its draft steps run layers 0..k-1 again for the tokens
the target then verifies (reusing them inside the verification call,
LayerSkip's cache reuse, would need another target call signature).

Exactness: `q` is the sampler's distribution of the logits each token was
drawn from; the draft is any language model as far as the loop can tell.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.drafters import early_exit_t5gemma
from spec_decode.drafters import on_target
from spec_decode.models import t5_model
from spec_decode.models import t5gemma_model
from spec_decode.t5 import cache as cache_lib


@flax.struct.dataclass(kw_only=True)
class EarlyExitState:
  """The self-draft's own state.

  Attributes:
    cache: self-attention keys and values of layers 0..k-1 (`KVCache`).
  """

  cache: cache_lib.KVCache


@flax.struct.dataclass(kw_only=True)
class EarlyExit(on_target.EarlyExitDrafting):
  """The target's first `num_layers` decoder layers as its draft.

  Attributes:
    target: the target `Model`.
    num_layers: k, decoder layers the draft runs (static).
  """

  target: Any
  num_layers: int = flax.struct.field(pytree_node=False)

  @classmethod
  def of(cls, target: t5_model.Model, num_layers: int) -> 'EarlyExit':
    """The draft of `target`'s first `num_layers` decoder layers (a
    `T5GemmaEarlyExit` for a T5Gemma target: its cache is a ring).

    Raises:
      ValueError: `num_layers` is not in [1, the target's layers].
    """
    if isinstance(target, t5gemma_model.T5GemmaModel):
      return early_exit_t5gemma.T5GemmaEarlyExit.of(target, num_layers)
    layers = target.config.num_decoder_layers
    return cls(
      target=target,
      num_layers=on_target.check_num_layers(num_layers, layers),
    )

  def __repr__(self) -> str:
    return f'EarlyExit(num_layers={self.num_layers})'

  def for_drafting(self) -> 'EarlyExit':
    """Drafts with the target's drafting copy (bfloat16-packed layers on the
    CPU kernel, as a model draft does); only proposals can change."""
    copy = self.target.for_drafting()
    return self if copy is self.target else self.replace(target=copy)

  def model(self) -> t5_model.Model:
    """The draft as a `Model`: the target's arrays, k decoder layers."""
    return truncated(self.target, self.num_layers)

  # -- drafter protocol -------------------------------------------------------
  def init_draft(
    self, encoder_tokens: jax.Array, length: int
  ) -> EarlyExitState:
    cfg = self.target.config
    return EarlyExitState(
      cache=cache_lib.KVCache.zeros(
        self.num_layers,
        encoder_tokens.shape[0],
        length,
        cfg.num_heads,
        cfg.head_dim,
        cfg.dtype,
      )
    )

  def synced(self, state, context, width: int) -> t5_model.T5DecodeState:
    """The draft's decode state holding inputs 0..n-1: the target's
    encoder-side keys and values of layers 0..k-1, and the slots of the
    last `width` committed inputs copied from the target's cache (where a
    separate draft model re-feeds them: one for a chain, the most tokens
    the previous iteration accepted + 1 for a tree, module docstring)."""
    tstate = self.target_state(context)
    k = self.num_layers
    n = context.length
    start = jnp.maximum(n - width, 0)
    cols = start[:, None] + jnp.arange(width)[None]  # [B, W]

    def copy(own, theirs):
      # Slots >= n of the window are stale in the target; the draft
      # overwrites or masks them (its index is n).
      moved = jnp.take_along_axis(
        theirs, jnp.minimum(cols, theirs.shape[-1] - 1)[:, None, None], -1
      )
      return cache_lib.write(own, moved, start)

    cache = cache_lib.KVCache(
      keys=tuple(map(copy, state.cache.keys, tstate.cache.keys[:k])),
      values=tuple(map(copy, state.cache.values, tstate.cache.values[:k])),
      index=n,
    )
    cross = on_target.cross_of(tstate.cross, range(k))
    return t5_model.T5DecodeState(cross=cross, cache=cache)

  def next_state(self, state, ds) -> EarlyExitState:
    """Its own cache after a call: the slots its draft steps wrote."""
    del state
    return EarlyExitState(cache=ds.cache)


def truncated(target: t5_model.Model, num_layers: int) -> t5_model.Model:
  """`target` cut after decoder layer `num_layers` - 1: the same arrays
  (parameters and packed copies), the first `num_layers` decoder layers,
  the final norm and the output projection."""

  def keep(tree):
    if tree is None:
      return None
    dec = {
      name: sub
      for name, sub in tree['decoder'].items()
      if not name.startswith('layers_') or int(name[7:]) < num_layers
    }
    return {**tree, 'decoder': dec}

  config = target.config.replace(num_decoder_layers=num_layers)
  return t5_model.Model.tree_unflatten(
    (config, target.vocabulary, target.partitioner),
    (keep(target.params), keep(target.packed)),
  )

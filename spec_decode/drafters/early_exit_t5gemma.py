"""The early-exit self-draft of a T5Gemma target: its first k decoder
layers (`early_exit.py` is T5's; `EarlyExit.of` hands T5Gemma targets
here).

The draft is the target cut after decoder layer k: its first k decoder
layers, then its final norm and its (soft-capped) output projection, on the
target's own arrays.

What is shared with the target, and why it is exact to share: the encoder
output and the encoder-side keys and values of decoder layers 0..k-1, and
the self-attention keys and values of layers 0..k-1 at committed inputs
(they depend only on the inputs up to that position through the layers the
draft and the target share). Unlike T5's draft, this one keeps no cache of
its own: each call starts from the target's `RingKVCache` cut to layers
0..k-1 and rolled to the committed length n (its entries hold slots < n
from the target's last verification; a rollback only moves the index, and
an entry shows its slot only while the slot is below it). The draft writes
its speculative slots n, n + 1, ... into that copy, never into the
target's state, within the ring's margin of n as the target's own calls
do, so the ring's contract holds (`t5gemma/cache.py`). A ring has no "last
K slots" to copy cheaply, so the draft's first write copies the k layers'
buffers once per iteration (k / N of the target's cache, which the
target's verification reads whole anyway).

Exactness: `q` is the sampler's distribution of the logits each token was
drawn from; the draft is any language model as far as the loop can tell.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.drafters import on_target
from spec_decode.models import t5gemma_model
from spec_decode.t5gemma import cache as cache_lib


@flax.struct.dataclass(kw_only=True)
class T5GemmaEarlyExitState:
  """Nothing: every call starts from the target's decode state.

  Attributes:
    calls: `[B] int32`, draft calls per row (a leaf, so that the state is
      a pytree with the batch dimension the loops expect).
  """

  calls: jax.Array


@flax.struct.dataclass(kw_only=True)
class T5GemmaEarlyExit(on_target.EarlyExitDrafting):
  """A T5Gemma target's first `num_layers` decoder layers as its draft
  (`target` the `T5GemmaModel`, `num_layers` k static)."""

  target: Any
  num_layers: int = flax.struct.field(pytree_node=False)

  @classmethod
  def of(cls, target, num_layers: int) -> 'T5GemmaEarlyExit':
    """The draft of `target`'s first `num_layers` decoder layers (a
    ValueError unless `num_layers` is in [1, the target's layers])."""
    layers = target.config.decoder.num_layers
    return cls(
      target=target,
      num_layers=on_target.check_num_layers(num_layers, layers),
    )

  def __repr__(self) -> str:
    return f'EarlyExit(num_layers={self.num_layers}, T5Gemma)'

  def model(self) -> t5gemma_model.T5GemmaModel:
    """The draft as a `T5GemmaModel`: the target's arrays, k layers."""
    return truncated(self.target, self.num_layers)

  # -- drafter protocol -------------------------------------------------------
  def init_draft(self, encoder_tokens, length: int) -> T5GemmaEarlyExitState:
    del length
    return T5GemmaEarlyExitState(
      calls=jnp.zeros((encoder_tokens.shape[0],), jnp.int32)
    )

  def synced(
    self, state, context, width: int
  ) -> t5gemma_model.T5GemmaDecodeState:
    """The draft's decode state holding inputs 0..n-1: the target's, cut to
    layers 0..k-1, index n (all its slots: `width` is T5's copy width)."""
    del state, width
    tstate = self.target_state(context)
    k = self.num_layers
    cache = cache_lib.RingKVCache(
      keys=tstate.cache.keys[:k],
      values=tstate.cache.values[:k],
      slots=tstate.cache.slots,
      index=context.length,
    )
    cross = on_target.cross_of(tstate.cross, range(k))
    return t5gemma_model.T5GemmaDecodeState(cross=cross, cache=cache)

  def next_state(self, state, ds) -> T5GemmaEarlyExitState:
    """The draft's writes went to a copy of the target's cache: only the
    call count moves."""
    del ds
    return state.replace(calls=state.calls + 1)


def truncated(target, num_layers: int) -> t5gemma_model.T5GemmaModel:
  """`target` cut after decoder layer `num_layers` - 1: the same arrays,
  the first `num_layers` decoder layers, the final norm and the head."""
  cfg = target.config
  params = dict(target.params)
  params['decoder'] = {
    name: sub
    for name, sub in params['decoder'].items()
    if not name.startswith('layers_') or int(name[7:]) < num_layers
  }
  dec = cfg.decoder
  decoder = type(dec)(
    **{
      **vars(dec),
      'num_layers': num_layers,
      'layer_types': dec.layer_types[:num_layers],
    }
  )
  return t5gemma_model.T5GemmaModel(
    cfg.replace(decoder=decoder),
    params,
    target.vocabulary,
    partitioner=target.partitioner,
  )

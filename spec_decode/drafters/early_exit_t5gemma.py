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

from spec_decode.core import drafter
from spec_decode.core import model_drafter
from spec_decode.core import tree_draft
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.models import t5gemma_model
from spec_decode.t5gemma import cache as cache_lib
from spec_decode.t5gemma import network


@flax.struct.dataclass(kw_only=True)
class T5GemmaEarlyExitState:
  """Nothing: every call starts from the target's decode state.

  Attributes:
    calls: `[B] int32`, draft calls per row (a leaf, so that the state is
      a pytree with the batch dimension the loops expect).
  """

  calls: jax.Array


@flax.struct.dataclass(kw_only=True)
class T5GemmaEarlyExit:
  """A T5Gemma target's first `num_layers` decoder layers as its draft.

  Attributes:
    target: the target `T5GemmaModel`.
    num_layers: k, decoder layers the draft runs (static).
  """

  target: Any
  num_layers: int = flax.struct.field(pytree_node=False)

  uses_target_features = False
  uses_target_state = True

  @classmethod
  def of(cls, target, num_layers: int) -> 'T5GemmaEarlyExit':
    """The draft of `target`'s first `num_layers` decoder layers.

    Raises:
      ValueError: `num_layers` is not in [1, the target's layers].
    """
    layers = target.config.decoder.num_layers
    if isinstance(num_layers, bool) or not 1 <= int(num_layers) <= layers:
      raise ValueError(
        f'num_layers must be in [1, {layers}] (the target has {layers} '
        f'decoder layers), got {num_layers!r}'
      )
    return cls(target=target, num_layers=int(num_layers))

  @property
  def vocab_size(self) -> int:
    return self.target.vocab_size

  @property
  def vocabulary(self) -> Any:
    return self.target.vocabulary

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

  def _synced(self, context) -> t5gemma_model.T5GemmaDecodeState:
    """The draft's decode state holding inputs 0..n-1: the target's, cut to
    layers 0..k-1, index n."""
    tstate = context.target_state
    if tstate is None:
      raise ValueError(
        'EarlyExit needs DraftContext.target_state (the loops fill it for '
        'drafters with uses_target_state)'
      )
    k = self.num_layers
    cache = cache_lib.RingKVCache(
      keys=tstate.cache.keys[:k],
      values=tstate.cache.values[:k],
      slots=tstate.cache.slots,
      index=context.length,
    )
    cross = network.CrossKV(
      keys=tstate.cross.keys[:k],
      values=tstate.cross.values[:k],
      encoder_valid=tstate.cross.encoder_valid,
    )
    return t5gemma_model.T5GemmaDecodeState(cross=cross, cache=cache)

  def _root(self, model, ds, context):
    """Feeds the newest input n: logits `[B, V]` of token n + 1."""
    newest = jnp.take_along_axis(context.inputs, context.length[:, None], 1)
    logits, ds = model.score(ds, newest)
    return logits[:, 0], ds

  def propose(
    self,
    state: T5GemmaEarlyExitState,
    context: drafter.DraftContext,
    settings: DecodeSettings,
  ) -> tuple[drafter.Proposal, T5GemmaEarlyExitState]:
    """G tokens, one k-layer call each (the first feeds input n)."""
    model = self.model()
    first, ds = self._root(model, self._synced(context), context)

    def step(ds, prev):
      logits, ds = model.score(ds, prev[:, None])
      return logits[:, 0], ds

    proposal, _ = model_drafter.draft_chain(
      step, ds, first, context.keys, settings.sampler, settings.dynamic_gamma
    )
    return proposal, state.replace(calls=state.calls + 1)

  def propose_tree(
    self,
    state: T5GemmaEarlyExitState,
    context: drafter.DraftContext,
    settings: DecodeSettings,
    shape,
  ) -> tuple[drafter.TreeProposal, T5GemmaEarlyExitState]:
    """The tree level by level (`tree_draft.expand`) after the newest
    input; its nodes go in scratch slots past n, as the target's do."""
    model = self.model()
    root, ds = self._root(model, self._synced(context), context)

    def level_logits(d, fed, tokens, ds):
      _, attention = shape.draft_attention(d)
      return model.score_tree(ds, tokens[:, fed], attention)

    proposal, _ = tree_draft.expand(
      shape, settings.sampler, root, level_logits, ds, context.keys
    )
    return proposal, state.replace(calls=state.calls + 1)


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

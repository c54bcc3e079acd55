"""An EAGLE-style feature draft for a T5Gemma target (`feature.py` is
T5's; `FeatureDraft.init` hands T5Gemma targets here).

The same draft as `feature.py`'s, with T5Gemma's layers: a fusion
`fc([embedding; feature])` (`[2D] -> [D]`), `num_layers` T5Gemma decoder
layers (RoPE, GQA, the sliding window of the target layer each copies,
version 1's cross-attention or version 2's merged attention) and a final
RMSNorm, so its output lives where the target's features do; the target's
embedding and soft-capped head (frozen). Draft layer i reads the target's
encoder-side keys and values of its decoder layer `cross_layers[i]` from
the target's decode state (no encoder runs for the draft).

Drafting is `feature.py`'s: the loop hands the target's features of the
last K inputs; the draft re-feeds the inputs committed since its last call
(the last A + 1, A the most tokens the previous iteration accepted) with
the target's features, then drafts over its own predicted features.

Its cache keeps every slot of its own layers (no ring): the re-feed moves
its index back up to G slots behind inputs it drafted at, further than a
ring of margin G + 1 may move (`t5gemma/cache.py`'s contract), and the
draft has one or two layers against the target's many, so a cache that
grows with the output is small next to the target's global layers.

Exactness: `q` is the sampler's distribution of the logits each token was
drawn from, whatever the features. Not here yet: training (`spec_decode
train`'s feature drafts are T5's) and save/load.
"""

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.core import drafter
from spec_decode.core import model_drafter
from spec_decode.core import tree_draft
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.t5gemma import cache as cache_lib
from spec_decode.t5gemma import network
from spec_decode.t5gemma.config import BOS_ID
from spec_decode.t5gemma.config import T5GemmaConfig
from spec_decode.t5gemma.modules import Dense
from spec_decode.t5gemma.modules import RMSNorm

# A ring margin no call reaches: every ring entry count is the buffer's
# length (`cache.ring_size`), so the draft's cache never wraps.
_NO_RING = 1 << 30


class T5GemmaFeatureNet(nn.Module):
  """Fusion, T5Gemma decoder layers, final norm.

  `config` is the target's with the decoder stack cut to the draft's
  layers (`net_config`).
  """

  config: T5GemmaConfig

  def setup(self):
    cfg, s = self.config, self.config.decoder
    self.fc = Dense(cfg, s.emb_dim, ('mlp', 'embed'))
    self.layers = [network.DecoderLayer(cfg, t) for t in s.layer_types]
    self.norm = RMSNorm(cfg, s.rms_eps)

  def __call__(self, features, embedded, cross, cache=None, tree=None):
    """Predicted features `[B, T, D]` float32 of inputs `[B, T]`.

    Args:
      features: `[B, T, D]` the feature of the input before each one.
      embedded: `[B, T, D]` the inputs' token embeddings.
      cross: per draft layer, the target's encoder-side keys and values.
      cache: None (teacher forcing: positions 0..T-1) or the draft's
        `RingKVCache` (index advanced by T; a tree leaves it).
      tree: a `core.tree_shape.TreeAttention` (with a cache).

    Returns:
      The predicted features and the new cache (None without one).
    """
    dtype = self.config.dtype
    x = self.fc(
      jnp.concatenate([embedded.astype(dtype), features.astype(dtype)], -1)
    )
    x, cache = network.run_layers(
      self.config, self.layers, x, cross, cache, tree
    )
    return self.norm(x).astype(jnp.float32), cache


@flax.struct.dataclass(kw_only=True)
class T5GemmaFeatureState:
  """The draft's own state.

  Attributes:
    cache: its layers' keys and values (`RingKVCache` that never wraps).
  """

  cache: cache_lib.RingKVCache


@flax.struct.dataclass(kw_only=True)
class T5GemmaFeatureDraft:
  """An EAGLE-style draft on a frozen T5Gemma target (module docstring).

  Attributes:
    params: the draft network's parameters (`T5GemmaFeatureNet`).
    target: the target `T5GemmaModel`.
    net_config: the network's `T5GemmaConfig` (static).
    cross_layers: the target decoder layer each draft layer copies and
      whose encoder-side keys and values it reads (static).
  """

  params: Any
  target: Any
  net_config: T5GemmaConfig = flax.struct.field(pytree_node=False)
  cross_layers: tuple[int, ...] = flax.struct.field(pytree_node=False)

  uses_target_features = True
  uses_recent_features = True
  uses_target_state = True

  @property
  def num_layers(self) -> int:
    return self.net_config.decoder.num_layers

  @property
  def vocab_size(self) -> int:
    return self.target.vocab_size

  @property
  def vocabulary(self) -> Any:
    return self.target.vocabulary

  @property
  def net(self) -> T5GemmaFeatureNet:
    return T5GemmaFeatureNet(self.net_config)

  def __repr__(self) -> str:
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.params))
    return (
      f'FeatureDraft(T5Gemma, num_layers={self.num_layers}, '
      f'cross_layers={self.cross_layers}, {n:,} parameters)'
    )

  @classmethod
  def init(
    cls,
    target,
    num_layers: int = 1,
    seed: int = 0,
    from_target: bool = True,
    cross_layers: tuple[int, ...] | None = None,
  ) -> 'T5GemmaFeatureDraft':
    """A fresh draft for `target`.

    Args:
      target: the target `T5GemmaModel`.
      num_layers: draft decoder layers.
      seed: initialization seed.
      from_target: start each draft layer (and the final norm) as a copy
        of the target layer it reads; the fusion `fc` is random either way.
      cross_layers: target layers read by each draft layer (default the
        last `num_layers`).
    """
    layers = target.config.decoder.num_layers
    if num_layers < 1:
      raise ValueError(f'num_layers must be >= 1, got {num_layers}')
    if cross_layers is None:
      first = max(layers - num_layers, 0)
      cross_layers = tuple(
        min(first + i, layers - 1) for i in range(num_layers)
      )
    cross_layers = tuple(int(j) for j in cross_layers)
    if len(cross_layers) != num_layers or not all(
      0 <= j < layers for j in cross_layers
    ):
      raise ValueError(
        f'cross_layers must name {num_layers} target decoder layers in '
        f'[0, {layers}), got {cross_layers}'
      )
    cfg = net_config(target.config, cross_layers)
    params = _init_params(cfg, seed)
    if from_target:
      dec = target.params['decoder']
      params = dict(params)
      params['norm'] = dec['norm']
      for i, j in enumerate(cross_layers):
        params[f'layers_{i}'] = dec[f'layers_{j}']
      params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
    return cls(
      params=params, target=target, net_config=cfg, cross_layers=cross_layers
    )

  # -- the network ------------------------------------------------------------
  def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
    """The target's embeddings of `tokens`, position 0 read as BOS (the
    loops feed T5's start id 0 there, as the target reads it)."""
    return self.target.embed(jnp.where(positions == 0, BOS_ID, tokens))

  def cross(self, target_state: Any) -> network.CrossKV:
    c = target_state.cross
    return network.CrossKV(
      keys=tuple(c.keys[j] for j in self.cross_layers),
      values=tuple(c.values[j] for j in self.cross_layers),
      encoder_valid=c.encoder_valid,
    )

  def apply_net(self, features, embedded, cross, cache=None, tree=None):
    return self.net.apply(
      {'params': self.params}, features, embedded, cross, cache, tree
    )

  def logits(self, features: jax.Array) -> jax.Array:
    """The target's soft-capped head of features `[..., D]`."""
    return self.target.project(features)

  def teacher_forced(self, encoder_tokens, decoder_inputs, target_features):
    """Predicted features `[B, T, D]` of inputs 0..T-1, each from the
    target's feature of the input before it."""
    tstate = self.target.init_state(jnp.asarray(encoder_tokens), 1)
    prev = jnp.pad(target_features[:, :-1], ((0, 0), (1, 0), (0, 0)))
    pos = jnp.broadcast_to(
      jnp.arange(decoder_inputs.shape[1]), decoder_inputs.shape
    )
    embedded = self.embed(jnp.asarray(decoder_inputs), pos)
    return self.apply_net(prev, embedded, self.cross(tstate))[0]

  # -- drafter protocol -------------------------------------------------------
  def init_draft(self, encoder_tokens, length: int) -> T5GemmaFeatureState:
    cfg = self.net_config
    return T5GemmaFeatureState(
      cache=cache_lib.RingKVCache.zeros(
        cfg.decoder, encoder_tokens.shape[0], length, _NO_RING, cfg.dtype
      )
    )

  def _catch_up(self, state, context, cross, depth: int):
    """`feature.FeatureDraft._catch_up` on this network: the predicted
    feature `[B, D]` of input n and the cache holding inputs 0..n."""
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
        f'feature window holds {k}'
      )
    start = jnp.maximum(n - w + 1, 0)
    cols = start[:, None] + jnp.arange(w)[None]
    width = context.inputs.shape[1]
    tokens = jnp.take_along_axis(
      context.inputs, jnp.minimum(cols, width - 1), axis=1
    )
    # The window's entry j is input n - K + j; input t reads input t - 1.
    fidx = jnp.clip(cols - 1 - (n[:, None] - k), 0, k - 1)
    feats = jnp.take_along_axis(window, fidx[..., None], axis=1)
    cache = state.cache.rollback(start)
    hidden, cache = self.apply_net(
      feats, self.embed(tokens, cols), cross, cache
    )
    rows = jnp.arange(n.shape[0])
    return hidden[rows, n - start], cache.rollback(n + 1)

  def propose(
    self,
    state: T5GemmaFeatureState,
    context: drafter.DraftContext,
    settings: DecodeSettings,
  ) -> tuple[drafter.Proposal, T5GemmaFeatureState]:
    """Tokens n+1..n+G (module docstring)."""
    cross = self.cross(context.target_state)
    h, cache = self._catch_up(state, context, cross, settings.gamma)

    def step(carry, prev):
      cache, h = carry
      # Inputs past n sit at positions >= 1: never read as BOS.
      embedded = self.target.embed(prev[:, None])
      out, cache = self.apply_net(h[:, None], embedded, cross, cache)
      h = out[:, 0]
      return self.logits(h), (cache, h)

    proposal, (cache, _) = model_drafter.draft_chain(
      step,
      (cache, h),
      self.logits(h),
      context.keys,
      settings.sampler,
      settings.dynamic_gamma,
    )
    return proposal, T5GemmaFeatureState(cache=cache)

  def propose_tree(
    self,
    state: T5GemmaFeatureState,
    context: drafter.DraftContext,
    settings: DecodeSettings,
    shape,
  ) -> tuple[drafter.TreeProposal, T5GemmaFeatureState]:
    """The tree level by level; a node reads its parent's predicted
    feature."""
    cross = self.cross(context.target_state)
    h, cache = self._catch_up(state, context, cross, shape.depth)
    hidden = (
      jnp.zeros((h.shape[0], shape.num_nodes + 1, h.shape[-1]), jnp.float32)
      .at[:, 0]
      .set(h)
    )
    parents = shape.parents

    def level_logits(d, fed, tokens, carry):
      cache, hidden = carry
      _, attention = shape.draft_attention(d)
      embedded = self.target.embed(tokens[:, fed])
      out, cache = self.apply_net(
        hidden[:, parents[fed]], embedded, cross, cache, attention
      )
      return self.logits(out), (cache, hidden.at[:, fed].set(out))

    proposal, (cache, _) = tree_draft.expand(
      shape,
      settings.sampler,
      self.logits(h),
      level_logits,
      (cache, hidden),
      context.keys,
    )
    return proposal, T5GemmaFeatureState(cache=cache)


def net_config(
  target_config: T5GemmaConfig, cross_layers: tuple[int, ...]
) -> T5GemmaConfig:
  """The network's config: the target's, its decoder cut to the layers
  `cross_layers` names (their layer types), a cache that never wraps."""
  dec = target_config.decoder
  decoder = type(dec)(
    **{
      **vars(dec),
      'num_layers': len(cross_layers),
      'layer_types': tuple(dec.layer_types[j] for j in cross_layers),
    }
  )
  return target_config.replace(decoder=decoder, ring_margin=_NO_RING)


def _init_params(cfg: T5GemmaConfig, seed: int) -> Any:
  s, b = cfg.decoder, 1
  shape = (b, 1, s.num_kv_heads, s.head_dim)
  kv = tuple(jnp.zeros(shape, cfg.dtype) for _ in range(s.num_layers))
  cross = network.CrossKV(
    keys=kv, values=kv, encoder_valid=jnp.ones((b, 1), bool)
  )
  x = jnp.zeros((b, 1, s.emb_dim), jnp.float32)
  variables = T5GemmaFeatureNet(cfg).init(jax.random.key(seed), x, x, cross)
  return nn.meta.unbox(variables['params'])

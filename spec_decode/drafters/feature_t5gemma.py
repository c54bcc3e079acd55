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

Drafting is `feature.py`'s (one loop for both, `on_target.py`): the loop
hands the target's features of the last K inputs; the draft re-feeds the
inputs committed since its last call (the last A + 1, A the most tokens
the previous iteration accepted) with the target's features, then drafts
over its own predicted features.

Its cache keeps every slot of its own layers (no ring): the re-feed moves
its index back up to G slots behind inputs it drafted at, further than a
ring of margin G + 1 may move (`t5gemma/cache.py`'s contract), and the
draft has one or two layers against the target's many, so a cache that
grows with the output is small next to the target's global layers.

Exactness: `q` is the sampler's distribution of the logits each token was
drawn from, whatever the features.

Training is T5's (`train/feature.py`: the same loss and recipe through
`teacher_forced_from`). Checkpoint (`save`/`load`): `on_target.py`'s
format, the target's `T5GemmaConfig` in `feature_draft.json`; load with
the target, `FeatureDraft.load(path, target)` (which hands T5Gemma targets
here), after the checks that the draft is a T5Gemma one and its target's
shape is this target's.
"""

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.drafters import on_target
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
class T5GemmaFeatureDraft(on_target.FeatureDrafting):
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

  @property
  def num_layers(self) -> int:
    return self.net_config.decoder.num_layers

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
    cross_layers = on_target.cross_layers_for(
      num_layers, target.config.decoder.num_layers, cross_layers
    )
    cfg = net_config(target.config, cross_layers)
    params = _init_params(cfg, seed)
    if from_target:
      dec = target.params['decoder']
      params = dict(params)
      params['norm'] = dec['norm']
      for i, j in enumerate(cross_layers):
        # The draft's own arrays only: not the encoder-side key and value
        # projections (it reads the target's keys and values).
        params[f'layers_{i}'] = _like(params[f'layers_{i}'], dec[f'layers_{j}'])
      params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
    return cls(
      params=params, target=target, net_config=cfg, cross_layers=cross_layers
    )

  def with_params(self, params: Any) -> 'T5GemmaFeatureDraft':
    return self.replace(params=jax.tree.map(jnp.asarray, params))

  # -- the network ------------------------------------------------------------
  def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
    """The target's embeddings of `tokens`, position 0 read as BOS (the
    loops feed T5's start id 0 there, as the target reads it)."""
    return self.target.embed(jnp.where(positions == 0, BOS_ID, tokens))

  def apply_net(self, features, embedded, cross, cache=None, tree=None):
    return self.net.apply(
      {'params': self.params}, features, embedded, cross, cache, tree
    )

  def run_tokens(self, features, tokens, positions, cross, cache, tree=None):
    """`apply_net` on token ids for the shared drafting loop
    (`on_target`); `positions` None: past the newest committed input,
    never position 0 (never read as BOS)."""
    if positions is None:
      embedded = self.target.embed(tokens)
    else:
      embedded = self.embed(tokens, positions)
    return self.apply_net(features, embedded, cross, cache, tree)

  def logits(self, features: jax.Array) -> jax.Array:
    """The target's soft-capped head of features `[..., D]`."""
    return self.target.project(features)

  def teacher_forced(self, encoder_tokens, decoder_inputs, target_features):
    """Predicted features `[B, T, D]` of inputs 0..T-1, each from the
    target's feature of the input before it."""
    tstate = self.target.init_state(jnp.asarray(encoder_tokens), 1)
    return self.teacher_forced_from(
      self.cross(tstate), decoder_inputs, target_features
    )

  def teacher_forced_from(self, cross, decoder_inputs, target_features):
    """`teacher_forced` given the draft layers' keys and values (input 0
    read as BOS)."""
    prev = jnp.pad(target_features[:, :-1], ((0, 0), (1, 0), (0, 0)))
    inputs = jnp.asarray(decoder_inputs)
    pos = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    return self.apply_net(prev, self.embed(inputs, pos), cross)[0]

  # -- drafter protocol -------------------------------------------------------
  def init_draft(self, encoder_tokens, length: int) -> T5GemmaFeatureState:
    cfg = self.net_config
    return T5GemmaFeatureState(
      cache=cache_lib.RingKVCache.zeros(
        cfg.decoder, encoder_tokens.shape[0], length, _NO_RING, cfg.dtype
      )
    )

  # -- checkpoints ------------------------------------------------------------
  def save(self, path: str) -> None:
    """Writes the draft network to a new directory `path` (module
    docstring); the target is not saved.

    Raises:
      FileExistsError: `path` exists and is not empty.
    """
    on_target.save_feature_draft(
      self,
      path,
      {'num_layers': self.num_layers, 'cross_layers': list(self.cross_layers)},
    )

  @classmethod
  def load(cls, path: str, target) -> 'T5GemmaFeatureDraft':
    """Reads a draft written by `save`, for the `T5GemmaModel` `target`.

    Raises:
      FileNotFoundError: `path` holds no feature draft.
      ValueError: it is a T5 draft, or was trained for a target of another
        shape (checked before any weights are read).
    """
    info = on_target.read_feature_info(path, target.config)
    _check_target(info['target_config'], target.config, path)
    cross_layers = on_target.cross_layers_for(
      info['num_layers'], target.config.decoder.num_layers,
      info['cross_layers'],
    )  # fmt: skip
    cfg = net_config(target.config, cross_layers)
    abstract = jax.eval_shape(lambda: _init_params(cfg, 0))
    return cls(
      params=on_target.restore_params(path, abstract),
      target=target,
      net_config=cfg,
      cross_layers=cross_layers,
    )


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


# The target's fields a trained draft depends on: its width and heads (the
# draft's layers are the target's shape and read its keys), its vocabulary
# and head, and its decoder layers (each draft layer reads one, of its type).
_SHAPE_FIELDS = ('version', 'vocab_size', 'final_logit_softcap')
_STACK_FIELDS = (
  'emb_dim',
  'mlp_dim',
  'num_heads',
  'num_kv_heads',
  'head_dim',
  'num_layers',
  'layer_types',
  'sliding_window',
)


def _check_target(saved: dict, config: T5GemmaConfig, path: str) -> None:
  here = config.to_dict()
  pairs = [(k, saved.get(k), here[k]) for k in _SHAPE_FIELDS] + [
    (f'decoder.{k}', saved['decoder'].get(k), here['decoder'][k])
    for k in _STACK_FIELDS
  ]
  on_target.check_target(
    path,
    [
      f'{k} {a} != {b}'
      for k, a, b in pairs
      if (list(a) if isinstance(a, tuple | list) else a)
      != (list(b) if isinstance(b, tuple | list) else b)
    ],
  )


def _like(like: Any, source: Any) -> Any:
  """`source`'s entries at the keys of the nested dict `like`."""
  if not isinstance(like, dict):
    return source
  return {k: _like(v, source[k]) for k, v in like.items()}


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

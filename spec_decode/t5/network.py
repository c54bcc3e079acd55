"""T5 encoder-decoder (v1.1 and original) in Flax linen, with T5X's names.

Parameter paths and shapes match T5X's `examples/t5/network.py`, so a T5X
checkpoint maps onto this tree one to one: attention kernels are stored 2-D
(`[emb, heads * head_dim]`), as T5X's `DenseGeneral` stores them. Every
parameter carries logical axis names (T5X's: `embed`, `joined_kv`, `mlp`,
`vocab`, `heads`, `relpos_buckets`) for partitioning.

The decoder runs in two modes:
  * `cache=None`: teacher forcing over the whole target (training, scoring).
  * with a `KVCache`: `T >= 1` new tokens per row are written at the row's own
    index, attend to every valid slot before them, and advance the index.
Cross-attention keys and values are computed once per input
(`precompute_cross_attention`) and reused by every decoder call.

Small-K CPU kernel: when the variables carry a `'packed'` collection (built
by `spec_decode.models.packing.pack_decoder`), `Dense` and `Embed.attend`
multiply by the packed copy of their weights with
`spec_decode.kernels.ops.matmul` (the XLA FFI kernel on the CPU backend)
instead of `dot.dot` (`jnp.dot`, float32 summed in blocks of
`config.cpu_sum_block` on the CPU: see `dot.py`). The
kernel's row results are bitwise independent of how many rows are
multiplied together (any K: the packed path never switches to another
algorithm, and it sums D in fixed blocks of 128), so these layers compute a
token's projections identically when 1 or gamma + 1 tokens are scored.
(XLA's norms and attention einsums are not bitwise row-stable across shapes;
whole-network logits agree to float32 rounding.) Layers without a packed
copy (the encoder, cross-attention keys and values) use `dot.dot`.
"""

import functools
import operator
from typing import Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.core.tree_shape import TreeAttention
from spec_decode.kernels import ops as kernel_ops
from spec_decode.layers import dot as dot_lib
from spec_decode.layers import params as params_lib
from spec_decode.t5 import cache as cache_lib
from spec_decode.t5 import long_attention
from spec_decode.t5.config import T5Config
from spec_decode.t5.relpos import RelativePositionBiases
from spec_decode.t5.relpos import relative_position_bucket  # noqa: F401

_MASK_VALUE = -1e10
# Name of the Flax collection holding packed weights (`kernel_ops.Packed`).
PACKED = 'packed'
# Rows above which the packed path would switch to einsum: never, so that a
# row's projections do not depend on the batch size or the number of tokens.
_PACKED_MAX_K = 1 << 62


def _kernel_init(scale: float = 1.0, distribution: str = 'normal'):
  return nn.initializers.variance_scaling(scale, 'fan_in', distribution)


def _packed_matmul(x: jax.Array, packed: kernel_ops.Packed) -> jax.Array:
  return kernel_ops.matmul(x, packed, max_k=_PACKED_MAX_K)


class Dense(nn.Module):
  """Bias-free projection with a 2-D kernel `[in, out]` (T5X layout).

  With a `'packed'` variable `kernel` (the same weights in the small-K
  kernel's layout) it multiplies by that instead; `params` is unchanged.
  """

  config: T5Config
  features: int
  kernel_axes: tuple[str, str]
  init: Callable = _kernel_init(distribution='truncated_normal')
  dtype: jnp.dtype | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = self.dtype or self.config.dtype
    kernel = params_lib.param(
      self, 'kernel', self.init, (x.shape[-1], self.features), self.kernel_axes
    )
    if self.has_variable(PACKED, 'kernel'):
      return _packed_matmul(
        x.astype(dtype), self.get_variable(PACKED, 'kernel')
      )
    return dot_lib.dot(
      x.astype(dtype), kernel.astype(dtype), self.config.cpu_sum_block
    )


class RMSNorm(nn.Module):
  """T5's LayerNorm: no mean subtraction, no bias; statistics in float32."""

  config: T5Config

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = params_lib.param(
      self, 'scale', nn.initializers.ones, (x.shape[-1],), ('embed',)
    )
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + self.config.layer_norm_epsilon)
    return y.astype(self.config.dtype) * scale.astype(self.config.dtype)


class Embed(nn.Module):
  """Token embedding shared by encoder, decoder and (tied) logits."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.embedding = params_lib.embedding(self, cfg.vocab_size, cfg.emb_dim)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    return jnp.take(self.embedding, tokens, axis=0).astype(self.config.dtype)

  def attend(self, x: jax.Array) -> jax.Array:
    """Tied logits `x @ embedding.T`, float32 (packed `attend` if present)."""
    if self.has_variable(PACKED, 'attend'):
      return _packed_matmul(
        x.astype(jnp.float32), self.get_variable(PACKED, 'attend')
      )
    return dot_lib.dot(
      x.astype(jnp.float32),
      self.embedding.astype(jnp.float32).T,
      self.config.cpu_sum_block,
    )


class Attention(nn.Module):
  """Multi-head attention; T5 folds 1/sqrt(head_dim) into the query init."""

  config: T5Config

  def setup(self):
    cfg = self.config
    inner = cfg.num_heads * cfg.head_dim
    q_init = _kernel_init(1.0 / cfg.head_dim)
    proj = functools.partial(Dense, cfg, inner, ('embed', 'joined_kv'))
    self.query = proj(init=q_init)
    self.key = proj(init=_kernel_init())
    self.value = proj(init=_kernel_init())
    self.out = Dense(
      cfg, cfg.emb_dim, ('joined_kv', 'embed'), init=_kernel_init()
    )

  def _heads(self, x: jax.Array) -> jax.Array:
    cfg = self.config
    return x.reshape(x.shape[:-1] + (cfg.num_heads, cfg.head_dim))

  def project_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`[B, S, D]` -> keys and values `[B, H, Dh, S]` (T5X's cache layout).

    Heads-major with the length minor is the layout XLA:CPU's batched dot
    takes for both attention products; stored as `[B, S, H, Dh]`, every
    call would transpose the whole cache (twice per layer).
    """
    to_cache = lambda y: jnp.transpose(self._heads(y), (0, 2, 3, 1))
    return to_cache(self.key(x)), to_cache(self.value(x))

  def __call__(
    self, x: jax.Array, keys: jax.Array, values: jax.Array, bias: jax.Array
  ) -> jax.Array:
    """Attends `x [B, T, D]` to `keys/values [B, H, Dh, L]`.

    Args:
      x: queries' inputs `[B, T, D]`.
      keys: `[B, H, Dh, L]`.
      values: `[B, H, Dh, L]`.
      bias: additive, broadcastable to `[B, H, T, L]`; carries the mask.

    Returns:
      `[B, T, D]`.
    """
    cfg = self.config
    q = self._heads(self.query(x))
    k = keys
    if cfg.float32_attention_logits:
      q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    logits = jnp.einsum('bqhd,bhdk->bhqk', q, k)
    logits = logits + bias.astype(logits.dtype)
    weights = jax.nn.softmax(logits.astype(jnp.float32)).astype(cfg.dtype)
    out = jnp.einsum('bhqk,bhdk->bqhd', weights, values.astype(cfg.dtype))
    return self.out(out.reshape(out.shape[:2] + (-1,)))


_ACTIVATIONS = {
  'relu': jax.nn.relu,
  'gelu': functools.partial(jax.nn.gelu, approximate=True),
  'gelu_exact': functools.partial(jax.nn.gelu, approximate=False),
  'silu': jax.nn.silu,
  'swish': jax.nn.silu,
  'linear': lambda x: x,
}


class MlpBlock(nn.Module):
  """Gated (v1.1: gelu * linear) or plain (relu) feed-forward block."""

  config: T5Config

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    cfg = self.config
    acts = cfg.mlp_activations
    init = _kernel_init(distribution='truncated_normal')
    hidden = []
    for i, act in enumerate(acts):
      name = 'wi' if len(acts) == 1 else f'wi_{i}'
      h = Dense(cfg, cfg.mlp_dim, ('embed', 'mlp'), init=init, name=name)(x)
      hidden.append(_ACTIVATIONS[act](h))
    h = functools.reduce(operator.mul, hidden)
    h = _dropout(self, h, deterministic)
    return Dense(cfg, cfg.emb_dim, ('mlp', 'embed'), init=init, name='wo')(h)


def _dropout(module: nn.Module, x: jax.Array, deterministic: bool) -> jax.Array:
  """T5 dropout, shared across the length axis; a no-op at inference."""
  rate = module.config.dropout_rate
  if deterministic or rate == 0.0:
    return x
  shape = x.shape[:-2] + (1,) + x.shape[-1:]
  keep = jax.random.bernoulli(module.make_rng('dropout'), 1.0 - rate, shape)
  return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


class EncoderLayer(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x, bias, deterministic=True, pos=None, long=None):
    """`bias`: the mask (plus the stack's relative positions); `pos [B, S]`
    with per-layer biases; `long`: a LongT5 `LongLayout` (bias unused)."""
    cfg = self.config
    h = RMSNorm(cfg, name='pre_attention_layer_norm')(x)
    attn = Attention(cfg, name='attention')
    if long is not None:
      norm = None
      if long.side_bias is not None:
        norm = RMSNorm(cfg, name='global_input_layer_norm')
      y = long_attention.attend(cfg, attn, h, long, norm)
    else:
      if cfg.per_layer_relpos_bias:
        bias = bias + RelativePositionBiases(cfg, True, name='relpos_bias')(
          pos, pos
        )
      k, v = attn.project_kv(h)
      y = attn(h, k, v, bias)
    x = x + _dropout(self, y, deterministic)
    h = RMSNorm(cfg, name='pre_mlp_layer_norm')(x)
    return x + _dropout(
      self, MlpBlock(cfg, name='mlp')(h, deterministic), deterministic
    )


class DecoderLayer(nn.Module):
  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = RMSNorm(cfg)
    self.self_attention = Attention(cfg)
    self.pre_cross_attention_layer_norm = RMSNorm(cfg)
    self.encoder_decoder_attention = Attention(cfg)
    self.pre_mlp_layer_norm = RMSNorm(cfg)
    self.mlp = MlpBlock(cfg)
    if cfg.per_layer_relpos_bias:
      self.relpos_bias = RelativePositionBiases(cfg, False)

  def cross_kv(self, encoded):
    return self.encoder_decoder_attention.project_kv(encoded)

  def __call__(
    self,
    x,
    self_bias,
    cross_k,
    cross_v,
    cross_bias,
    cache_kv,
    index,
    deterministic=True,
    positions=None,
  ):
    """One layer; with `cache_kv=(k, v)` writes this call's keys at `index`.

    With per-layer biases `self_bias` is the mask only and `positions` the
    `(q_pos, k_pos)` the layer's own table is read at.

    Returns:
      The layer output `[B, T, D]` and the updated `(keys, values)` (this
      call's own keys and values when there is no cache).
    """
    if positions is not None:
      self_bias = self_bias + self.relpos_bias(*positions)
    h = self.pre_self_attention_layer_norm(x)
    k, v = self.self_attention.project_kv(h)
    if cache_kv is not None:
      k = cache_lib.write(cache_kv[0], k, index)
      v = cache_lib.write(cache_kv[1], v, index)
    x = x + _dropout(
      self, self.self_attention(h, k, v, self_bias), deterministic
    )
    h = self.pre_cross_attention_layer_norm(x)
    x = x + _dropout(
      self,
      self.encoder_decoder_attention(h, cross_k, cross_v, cross_bias),
      deterministic,
    )
    h = self.pre_mlp_layer_norm(x)
    x = x + _dropout(self, self.mlp(h, deterministic), deterministic)
    return x, (k, v)


def run_decoder_layers(layers, x, biases, cross, cache, tree, **layer_kwargs):
  """Runs decoder layers over `x [B, T, D]`: the network's and the feature
  draft's stacks, each layer against its cross keys and values and its
  cache slots.

  Args:
    layers: `DecoderLayer`s (called inside their parent module).
    x: the layers' input `[B, T, D]`.
    biases: `(self_bias, cross_bias)`, additive attention biases.
    cross: `CrossAttentionKV` (per-layer keys and values, valid mask).
    cache: the `KVCache` of these layers (new keys go at its index), or
      None (teacher forcing).
    tree: a `TreeAttention` (tree tokens go to scratch slots past
      `tree.offset`; the index does not advance) or None.
    **layer_kwargs: passed to every layer (`deterministic`, `positions`).

  Returns:
    The last layer's output, and the new cache (None without `cache`).
  """
  self_bias, cross_bias = biases
  index = None if cache is None else cache.index
  new_k, new_v = [], []
  for i, layer in enumerate(layers):
    kv = None if cache is None else (cache.keys[i], cache.values[i])
    x, (k, v) = layer(
      x,
      self_bias,
      cross.keys[i],
      cross.values[i],
      cross_bias,
      kv,
      index if tree is None else index + tree.offset,
      **layer_kwargs,
    )
    new_k.append(k)
    new_v.append(v)
  if cache is None:
    return x, None
  return x, cache_lib.KVCache(
    keys=tuple(new_k),
    values=tuple(new_v),
    index=index if tree is not None else index + x.shape[1],
  )


def _mask_to_bias(mask: jax.Array) -> jax.Array:
  return jnp.where(mask, 0.0, _MASK_VALUE).astype(jnp.float32)


class Encoder(nn.Module):
  config: T5Config
  shared_embedding: Embed

  @nn.compact
  def __call__(self, tokens: jax.Array, deterministic: bool = True):
    """`tokens [B, S]` (0 = padding) -> encoded `[B, S, D]`."""
    cfg = self.config
    valid = tokens > 0
    pos = jnp.broadcast_to(
      jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape
    )
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    bias, long = _mask_to_bias(mask), None
    if cfg.encoder_attention != 'full':
      glob = None
      if cfg.encoder_attention == 'transient-global':
        glob = RelativePositionBiases(cfg, True, name='global_relpos_bias')
      relpos = RelativePositionBiases(cfg, True, name='relpos_bias')
      long = long_attention.layout(cfg, valid, relpos, glob)
    elif not cfg.per_layer_relpos_bias:
      bias = bias + RelativePositionBiases(cfg, True, name='relpos_bias')(
        pos, pos
      )
    x = _dropout(self, self.shared_embedding(tokens), deterministic)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, name=f'layers_{i}')(
        x, bias, deterministic, pos, long
      )
    x = RMSNorm(cfg, name='encoder_norm')(x)
    return _dropout(self, x, deterministic)


@flax.struct.dataclass(kw_only=True)
class CrossAttentionKV:
  """Encoder-side keys and values, computed once per input.

  Attributes:
    keys: per decoder layer, `[B, H, Dh, S]`.
    values: per decoder layer, `[B, H, Dh, S]`.
    encoder_valid: `[B, S] bool`, False on encoder padding.
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  encoder_valid: jax.Array


class Decoder(nn.Module):
  config: T5Config
  shared_embedding: Embed

  def setup(self):
    cfg = self.config
    if not cfg.per_layer_relpos_bias:
      self.relpos_bias = RelativePositionBiases(cfg, False)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = RMSNorm(cfg)
    if not cfg.logits_via_embedding:
      self.logits_dense = Dense(
        cfg, cfg.vocab_size, ('embed', 'vocab'), dtype=jnp.float32
      )

  def project(self, x: jax.Array) -> jax.Array:
    """Final hidden states `[..., D]` (after the final norm) -> logits."""
    cfg = self.config
    if cfg.logits_via_embedding:
      return self.shared_embedding.attend(x) / jnp.sqrt(
        jnp.float32(cfg.emb_dim)
      )
    return self.logits_dense(x)

  def precompute_cross_attention(self, encoded, encoder_tokens):
    kv = [layer.cross_kv(encoded) for layer in self.layers]
    return CrossAttentionKV(
      keys=tuple(k for k, _ in kv),
      values=tuple(v for _, v in kv),
      encoder_valid=encoder_tokens > 0,
    )

  def __call__(
    self,
    tokens,
    cross: CrossAttentionKV,
    cache: cache_lib.KVCache | None = None,
    deterministic: bool = True,
    return_features: bool = False,
    tree: TreeAttention | None = None,
  ):
    """Decoder inputs `tokens [B, T]` -> float32 logits `[B, T, V]`.

    Without a cache the T tokens are the whole (teacher-forced) prefix, at
    positions 0..T-1. With a cache they go at positions `cache.index[b] + t`,
    and the updated cache (index advanced by T) is returned too.

    With `tree` (a `core.tree_shape.TreeAttention`; needs a cache) the tokens
    are tree nodes: written to scratch slots `index + tree.offset + t`, at
    positions `index + tree.positions[...]` (relative-position bias from a
    node's depth), attending to every committed slot and to the scratch
    slots `tree.mask` allows (their ancestors); the index is unchanged.

    Returns:
      `(logits, cache)`, `cache` None without one; with `return_features`,
      `(logits, features, cache)`, where `features [B, T, D] float32` is the
      final hidden state (after the final norm, before the vocabulary
      projection and the tied-logits scaling) that produced `logits`.
    """
    b, t = tokens.shape
    q_pos, k_pos, visible = cache_lib.self_attention_layout(cache, b, t, tree)
    self_bias, positions = _mask_to_bias(visible), (q_pos, k_pos)
    if not self.config.per_layer_relpos_bias:
      self_bias, positions = self_bias + self.relpos_bias(q_pos, k_pos), None
    cross_bias = _mask_to_bias(cross.encoder_valid[:, None, None, :])

    x = _dropout(self, self.shared_embedding(tokens), deterministic)
    x, new_cache = run_decoder_layers(
      self.layers,
      x,
      (self_bias, cross_bias),
      cross,
      cache,
      tree,
      deterministic=deterministic,
      positions=positions,
    )
    x = _dropout(self, self.decoder_norm(x), deterministic)
    logits = self.project(x)
    if return_features:
      return logits, x.astype(jnp.float32), new_cache
    return logits, new_cache


class Transformer(nn.Module):
  """T5 encoder-decoder; the root of the parameter tree, as in T5X."""

  config: T5Config

  def setup(self):
    self.token_embedder = Embed(self.config)
    self.encoder = Encoder(self.config, self.token_embedder)
    self.decoder = Decoder(self.config, self.token_embedder)

  def encode(self, encoder_tokens, deterministic: bool = True):
    return self.encoder(encoder_tokens, deterministic)

  def prepare_decoder(self, encoder_tokens) -> CrossAttentionKV:
    """Runs the encoder once and projects its keys and values once."""
    encoded = self.encoder(encoder_tokens, True)
    return self.decoder.precompute_cross_attention(encoded, encoder_tokens)

  def decode(
    self,
    tokens,
    cross,
    cache=None,
    deterministic: bool = True,
    return_features: bool = False,
    tree: TreeAttention | None = None,
  ):
    """See `Decoder.__call__`."""
    return self.decoder(
      tokens, cross, cache, deterministic, return_features, tree
    )

  def project(self, features: jax.Array) -> jax.Array:
    """See `Decoder.project`."""
    return self.decoder.project(features)

  def __call__(
    self,
    encoder_tokens,
    decoder_input_tokens,
    deterministic: bool = True,
    return_features: bool = False,
  ):
    """Teacher-forced logits `[B, T, V]` for `decoder_input_tokens [B, T]`.

    With `return_features`: `(logits, features)`, `features [B, T, D]`
    float32 the decoder's final hidden states (see `Decoder.__call__`).
    """
    encoded = self.encoder(encoder_tokens, deterministic)
    cross = self.decoder.precompute_cross_attention(encoded, encoder_tokens)
    out = self.decoder(
      decoder_input_tokens, cross, None, deterministic, return_features
    )
    if return_features:
      return out[0], out[1]
    return out[0]


def dummy_inputs() -> tuple[jax.Array, jax.Array]:
  """Encoder and decoder tokens `[1, 1]` for `Transformer.init`."""
  return jnp.ones((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32)


@functools.lru_cache(maxsize=32)
def logical_axes(config: T5Config):
  """Tree of logical `PartitionSpec`s matching the parameter tree."""
  boxed = jax.eval_shape(
    Transformer(config).init, jax.random.key(0), *dummy_inputs()
  )
  return nn.get_partition_spec(boxed)['params']

"""T5Gemma's building blocks in Flax linen: RMSNorm (1 + w), projections,
GeGLU, the scaled embedding and grouped-query attention with soft-capping.

Kernels are stored 2-D `[in, out]` (transformers' `[out, in]` transposed)
and carry logical axis names (`embed`, `heads` (H * Dh), `joined_kv`
(K * Dh), `mlp`, `vocab`) for partitioning. Attention keys and values are
laid out `[B, L, K, Dh]`.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from spec_decode.layers import dot as dot_lib
from spec_decode.layers import params as params_lib
from spec_decode.t5gemma import rope as rope_lib
from spec_decode.t5gemma.config import StackConfig
from spec_decode.t5gemma.config import T5GemmaConfig

# Masked scores: finite, so a row with every key masked (a padded query far
# from any real token) gets uniform weights instead of NaN.
_MASKED = -1e30


_normal = nn.initializers.normal(0.02)


class RMSNorm(nn.Module):
  """Gemma's RMSNorm: `x / rms(x) * (1 + scale)`, all in float32 (the
  scale starts at zero, so a fresh norm is the identity scaling)."""

  config: T5GemmaConfig
  eps: float

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = params_lib.param(
      self, 'scale', nn.initializers.zeros, (x.shape[-1],), (None,)
    )
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + self.eps)
    return (y * (1.0 + scale.astype(jnp.float32))).astype(self.config.dtype)


class Dense(nn.Module):
  """Bias-free projection, kernel `[in, out]`."""

  config: T5GemmaConfig
  features: int
  axes: tuple[str | None, str | None]

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = self.config.dtype
    kernel = params_lib.param(
      self, 'kernel', _normal, (x.shape[-1], self.features), self.axes
    )
    return dot_lib.dot(
      x.astype(dtype), kernel.astype(dtype), self.config.cpu_sum_block
    )


class Mlp(nn.Module):
  """GeGLU: `down(gelu_tanh(gate(x)) * up(x))`."""

  config: T5GemmaConfig
  stack: StackConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg, d, f = self.config, self.stack.emb_dim, self.stack.mlp_dim
    gate = Dense(cfg, f, ('embed', 'mlp'), name='gate')(x)
    up = Dense(cfg, f, ('embed', 'mlp'), name='up')(x)
    h = jax.nn.gelu(gate, approximate=True) * up
    return Dense(cfg, d, ('mlp', 'embed'), name='down')(h)


class Embed(nn.Module):
  """Token embedding scaled by `sqrt(D)`; also the tied output head.

  Version 2 also has `eoi_embedding [D]`, the (unscaled) embedding of the
  end-of-image id `config.eoi_token_index`.
  """

  config: T5GemmaConfig
  emb_dim: int
  with_eoi: bool = False

  def setup(self):
    cfg = self.config
    self.embedding = params_lib.embedding(self, cfg.vocab_size, self.emb_dim)
    if self.with_eoi:
      self.eoi_embedding = params_lib.param(
        self, 'eoi_embedding', nn.initializers.zeros, (self.emb_dim,), (None,)
      )

  def __call__(self, tokens: jax.Array) -> jax.Array:
    x = jnp.take(self.embedding, tokens, axis=0).astype(jnp.float32)
    x = x * jnp.float32(self.emb_dim**0.5)
    if self.with_eoi and self.config.eoi_token_index is not None:
      eoi = tokens == self.config.eoi_token_index
      x = jnp.where(eoi[..., None], self.eoi_embedding.astype(x.dtype), x)
    return x.astype(self.config.dtype)

  def attend(self, x: jax.Array) -> jax.Array:
    """Logits `x @ embedding.T`, float32."""
    return dot_lib.dot(
      x.astype(jnp.float32),
      self.embedding.astype(jnp.float32).T,
      self.config.cpu_sum_block,
    )


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
  """`cap * tanh(x / cap)`; the identity without a cap."""
  if cap is None:
    return x
  return jnp.tanh(x / cap) * cap


class Attention(nn.Module):
  """Grouped-query attention projections and the attention itself.

  Attributes:
    config: the model config.
    stack: the stack whose heads this is.
    kv_dim: width of the keys' and values' inputs (the encoder's, for
      version 1's cross-attention).
    qk_norm: RMS-normalize queries and keys per head (version 2).
  """

  config: T5GemmaConfig
  stack: StackConfig
  kv_dim: int
  qk_norm: bool = False

  def setup(self):
    cfg, s = self.config, self.stack
    heads, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    self.query = Dense(cfg, heads, ('embed', 'heads'))
    # Joined K * Dh: 'joined_kv', as T5's joined key/value heads (on
    # `model` under the standard rules); 'kv' alone is a head's Dh.
    self.key = Dense(cfg, kv, ('embed', 'joined_kv'))
    self.value = Dense(cfg, kv, ('embed', 'joined_kv'))
    self.out = Dense(cfg, s.emb_dim, ('heads', 'embed'))
    if self.qk_norm:
      self.query_norm = RMSNorm(cfg, s.rms_eps)
      self.key_norm = RMSNorm(cfg, s.rms_eps)

  def _split(self, x: jax.Array) -> jax.Array:
    return x.reshape(x.shape[:-1] + (-1, self.stack.head_dim))

  def queries(self, x: jax.Array, rotary=None) -> jax.Array:
    """`x [B, T, D]` -> queries `[B, T, H, Dh]` (normed, rotated)."""
    q = self._split(self.query(x))
    if self.qk_norm:
      q = self.query_norm(q)
    return q if rotary is None else rope_lib.apply(q, *rotary)

  def keys_values(self, x: jax.Array, rotary=None):
    """`x [B, S, kv_dim]` -> keys and values `[B, S, K, Dh]`; keys normed
    (version 2) and rotated when `rotary` (cos, sin) is given (never for
    cross keys)."""
    k = self._split(self.key(x))
    v = self._split(self.value(x))
    if self.qk_norm:
      k = self.key_norm(k)
    if rotary is not None:
      k = rope_lib.apply(k, *rotary)
    return k, v

  def attend(
    self,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    visible: jax.Array,
    softcap: float | None,
  ) -> jax.Array:
    """Softmax attention of `q [B, T, H, Dh]` over `k, v [B, L, K, Dh]`.

    Args:
      q: queries.
      k: keys.
      v: values.
      visible: `[B, 1, T, L] bool`, which keys each query sees.
      softcap: soft-cap of the scores, or None.

    Returns:
      The output projection `[B, T, D]`.
    """
    s, dtype = self.stack, self.config.dtype
    b, t = q.shape[:2]
    q = q.reshape(b, t, s.num_kv_heads, s.groups, s.head_dim)
    scores = jnp.einsum('btkgd,blkd->bkgtl', q, k.astype(dtype))
    scores = scores.astype(jnp.float32) * jnp.float32(
      s.query_pre_attn_scalar**-0.5
    )
    scores = soft_cap(scores, softcap)
    scores = jnp.where(visible[:, :, None], scores, _MASKED)
    weights = jax.nn.softmax(scores, axis=-1).astype(dtype)
    out = jnp.einsum('bkgtl,blkd->btkgd', weights, v.astype(dtype))
    return self.out(out.reshape(b, t, s.num_heads * s.head_dim))


def band(q_pos: jax.Array, k_pos: jax.Array, low: int, high: int):
  """`[B, 1, T, L]` bool: `low <= q - k <= high` per row."""
  d = q_pos[:, None, :, None] - k_pos[:, None, None, :]
  return (d >= low) & (d <= high)


sliding_causal = functools.partial(band, low=0)

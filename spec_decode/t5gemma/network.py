"""The T5Gemma and T5Gemma 2 encoder-decoder in Flax linen.

Parameter tree (`[in, out]` kernels):

  version 1: encoder/embedder, encoder/layers_i/{pre,post}_attention_norm,
    attention/{query,key,value,out}, {pre,post}_mlp_norm, mlp/{gate,up,down},
    encoder/norm; decoder/embedder (also the head unless `decoder/head`),
    decoder/layers_i/ as the encoder's plus cross_attention/... and
    {pre,post}_cross_norm; decoder/norm.
  version 2: embedder/{embedding,eoi_embedding} (encoder, decoder and head),
    attention/{query,key}_norm in every layer, and no cross_attention: the
    decoder's `attention` is merged (its queries see its own keys and the
    encoder's, projected by the same key and value kernels, in one softmax).

The decoder runs teacher-forced (`cache=None`: positions 0..T-1) or against
a `RingKVCache` (T new tokens per row at the row's index, or tree nodes in
scratch slots past it). Each layer type has its own visibility: a sliding
layer's query at position p sees keys p - W < k <= p (per position, so a
tree node's window is counted from its own depth), and its own RoPE base.
"""

import flax.linen as nn
import flax.struct
import flax.traverse_util
import jax
import jax.numpy as jnp

from spec_decode.layers import layout as layout_lib
from spec_decode.t5gemma import cache as cache_lib
from spec_decode.t5gemma import rope as rope_lib
from spec_decode.t5gemma.config import GLOBAL
from spec_decode.t5gemma.config import SLIDING
from spec_decode.t5gemma.config import StackConfig
from spec_decode.t5gemma.config import T5GemmaConfig
from spec_decode.t5gemma.modules import Attention
from spec_decode.t5gemma.modules import Dense
from spec_decode.t5gemma.modules import Embed
from spec_decode.t5gemma.modules import Mlp
from spec_decode.t5gemma.modules import RMSNorm
from spec_decode.t5gemma.modules import band
from spec_decode.t5gemma.modules import soft_cap


@flax.struct.dataclass(kw_only=True)
class CrossKV:
  """Encoder-side keys and values, computed once per input.

  Attributes:
    keys: per decoder layer `[B, S, K, Dh]` (version 2: key-normed).
    values: per decoder layer `[B, S, K, Dh]`.
    encoder_valid: `[B, S] bool`, False on encoder padding (id 0).
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  encoder_valid: jax.Array


def _rotary(stack: StackConfig, positions: jax.Array) -> dict:
  """Per layer type present, `(cos, sin)` at `positions [B, T]`."""
  return {
    t: rope_lib.tables(stack.rope(t), stack.head_dim, positions)
    for t in set(stack.layer_types)
  }


def encoder_visibility(config: T5GemmaConfig, valid: jax.Array) -> dict:
  """Per layer type, `[B, 1, S, S] bool` for encoder tokens `valid [B, S]`.

  Padding keys are hidden. Sliding layers see a band around the query:
  `|q - k| <= W` (version 1), `-(W // 2) <= q - k <= (W + 1) // 2 - 1`
  (version 2), as transformers masks them.
  """
  stack = config.encoder
  pos = jnp.broadcast_to(jnp.arange(valid.shape[1]), valid.shape)
  keys = valid[:, None, None, :]
  out = {GLOBAL: keys}
  w = stack.sliding_window
  if SLIDING in stack.layer_types:
    if config.version == 1:
      out[SLIDING] = keys & band(pos, pos, -w, w)
    else:
      out[SLIDING] = keys & band(pos, pos, -(w // 2), (w + 1) // 2 - 1)
  return out


class EncoderLayer(nn.Module):
  config: T5GemmaConfig
  layer_type: str

  @nn.compact
  def __call__(self, x, rotary, visible):
    cfg, s = self.config, self.config.encoder
    attn = Attention(cfg, s, s.emb_dim, cfg.qk_norm, name='attention')
    h = RMSNorm(cfg, s.rms_eps, name='pre_attention_norm')(x)
    q = attn.queries(h, rotary)
    k, v = attn.keys_values(h, rotary)
    softcap = s.attn_logit_softcap if cfg.version == 1 else None
    h = attn.attend(q, k, v, visible, softcap)
    x = x + RMSNorm(cfg, s.rms_eps, name='post_attention_norm')(h)
    h = RMSNorm(cfg, s.rms_eps, name='pre_mlp_norm')(x)
    h = Mlp(cfg, s, name='mlp')(h)
    return x + RMSNorm(cfg, s.rms_eps, name='post_mlp_norm')(h)


class Encoder(nn.Module):
  config: T5GemmaConfig
  shared_embedder: Embed | None = None

  def setup(self):
    cfg, s = self.config, self.config.encoder
    if self.shared_embedder is None:
      self.embedder = Embed(cfg, s.emb_dim)
    self.layers = [EncoderLayer(cfg, t) for t in s.layer_types]
    self.norm = RMSNorm(cfg, s.rms_eps)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    """`tokens [B, S]` (0 = padding) -> encoded `[B, S, D]`."""
    embed = self.shared_embedder or self.embedder
    valid = tokens != 0
    visible = encoder_visibility(self.config, valid)
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    rotary = _rotary(self.config.encoder, pos)
    x = embed(tokens)
    for layer in self.layers:
      t = layer.layer_type
      x = layer(x, rotary[t], visible[t])
    return self.norm(x)


class DecoderLayer(nn.Module):
  """One decoder layer: self (version 2: merged) attention, version 1's
  cross-attention, the GeGLU block; norms before and after each."""

  config: T5GemmaConfig
  layer_type: str

  def setup(self):
    cfg, s = self.config, self.config.decoder
    self.attention = Attention(cfg, s, s.emb_dim, cfg.qk_norm)
    self.pre_attention_norm = RMSNorm(cfg, s.rms_eps)
    self.post_attention_norm = RMSNorm(cfg, s.rms_eps)
    if not cfg.merged_attention:
      self.cross_attention = Attention(cfg, s, cfg.encoder.emb_dim)
      self.pre_cross_norm = RMSNorm(cfg, s.rms_eps)
      self.post_cross_norm = RMSNorm(cfg, s.rms_eps)
    self.pre_mlp_norm = RMSNorm(cfg, s.rms_eps)
    self.mlp = Mlp(cfg, s)
    self.post_mlp_norm = RMSNorm(cfg, s.rms_eps)

  def cross_kv(self, encoded: jax.Array):
    """Keys and values `[B, S, K, Dh]` of the encoder output (no RoPE)."""
    if self.config.merged_attention:
      return self.attention.keys_values(encoded)
    return self.cross_attention.keys_values(encoded)

  def __call__(self, x, rotary, visible, cross, cross_visible, kv, slots):
    """One layer over `x [B, T, D]`.

    Args:
      x: the input.
      rotary: `(cos, sin)` at the new tokens' positions.
      visible: `[B, 1, T, L]` self-attention visibility (L: the cache's
        entries, or T without a cache).
      cross: `(keys, values)` of the encoder, `[B, S, K, Dh]`.
      cross_visible: `[B, 1, 1, S]`.
      kv: this layer's `(keys, values)` ring buffers, or None.
      slots: `[B, T]` the slots this call writes (with `kv`).

    Returns:
      The output and `(keys, values)`: the written buffers, or this call's
      own keys and values without a cache.
    """
    s = self.config.decoder
    v1 = self.config.version == 1
    h = self.pre_attention_norm(x)
    q = self.attention.queries(h, rotary)
    k, v = self.attention.keys_values(h, rotary)
    if kv is not None:
      k = cache_lib.write(kv[0], slots, k)
      v = cache_lib.write(kv[1], slots, v)
    keys, values = k, v
    if self.config.merged_attention:
      keys = jnp.concatenate([k, cross[0].astype(k.dtype)], axis=1)
      values = jnp.concatenate([v, cross[1].astype(v.dtype)], axis=1)
      shape = visible.shape[:3] + cross_visible.shape[-1:]
      cross_vis = jnp.broadcast_to(cross_visible, shape)
      visible = jnp.concatenate([visible, cross_vis], axis=-1)
    softcap = s.attn_logit_softcap if v1 else None
    h = self.attention.attend(q, keys, values, visible, softcap)
    x = x + self.post_attention_norm(h)
    if v1:
      h = self.pre_cross_norm(x)
      cq = self.cross_attention.queries(h)
      h = self.cross_attention.attend(cq, *cross, cross_visible, softcap)
      x = x + self.post_cross_norm(h)
    h = self.mlp(self.pre_mlp_norm(x))
    return x + self.post_mlp_norm(h), (k, v)


def self_visibility(config: T5GemmaConfig, cache, batch: int, num_new, tree):
  """Positions and per-layer-type visibility of a decoder call.

  Returns:
    `q_pos [B, T]`, the slots written `[B, T]` (None without a cache), the
    new slot tables (None without a cache) and, per layer type,
    `visible [B, 1, T, L]`.
  """
  stack = config.decoder
  if cache is None:
    q_pos = jnp.broadcast_to(jnp.arange(num_new), (batch, num_new))
    k_pos, visible = q_pos, layout_lib.causal_mask(q_pos, q_pos)
    new_slots = tables = None
    k_pos_of = {t: k_pos for t in set(stack.layer_types)}
    vis_of = {t: visible for t in set(stack.layer_types)}
  else:
    offset = 0 if tree is None else tree.offset
    width = offset + num_new
    new_slots = layout_lib.query_positions(cache.index + offset, num_new)
    tables = cache.with_slots(new_slots)
    k_pos_of, vis_of = {}, {}
    for t, slots in tables.items():
      r = slots.shape[1]
      if t == SLIDING and width > config.ring_margin:
        if r == stack.sliding_window + config.ring_margin - 1:
          raise ValueError(
            f'a decoder call writes {width} slots but sliding layers keep '
            f'{config.ring_margin} past their window: raise '
            'T5GemmaConfig.ring_margin'
          )
      if tree is None:
        q_pos, k_pos, visible = layout_lib.chain_layout(
          cache.index, slots, num_new
        )
      else:
        q_pos, k_pos, visible = layout_lib.tree_slot_layout(
          cache.index, slots, tree
        )
      k_pos_of[t], vis_of[t] = k_pos, visible
  out = {}
  for t in set(stack.layer_types):
    vis = vis_of[t]
    if t == SLIDING:
      vis = vis & band(q_pos, k_pos_of[t], 0, stack.sliding_window - 1)
    out[t] = vis
  return q_pos, new_slots, tables, out


class Decoder(nn.Module):
  config: T5GemmaConfig
  shared_embedder: Embed | None = None

  def setup(self):
    cfg, s = self.config, self.config.decoder
    if self.shared_embedder is None:
      self.embedder = Embed(cfg, s.emb_dim)
    self.layers = [DecoderLayer(cfg, t) for t in s.layer_types]
    self.norm = RMSNorm(cfg, s.rms_eps)
    if not cfg.tie_head:
      self.head = Dense(cfg, cfg.vocab_size, ('embed', 'vocab'))

  def _embedder(self) -> Embed:
    return self.shared_embedder or self.embedder

  def project(self, x: jax.Array) -> jax.Array:
    """Final hidden states `[..., D]` -> soft-capped float32 logits."""
    if self.config.tie_head:
      logits = self._embedder().attend(x)
    else:
      logits = self.head(x.astype(jnp.float32)).astype(jnp.float32)
    return soft_cap(logits, self.config.final_logit_softcap)

  def precompute_cross(self, encoded, encoder_tokens) -> CrossKV:
    kv = [layer.cross_kv(encoded) for layer in self.layers]
    return CrossKV(
      keys=tuple(k for k, _ in kv),
      values=tuple(v for _, v in kv),
      encoder_valid=encoder_tokens != 0,
    )

  def __call__(self, tokens, cross: CrossKV, cache=None, tree=None):
    """Decoder inputs `tokens [B, T]` -> `(logits, features, cache)`.

    Without a cache the tokens are the whole teacher-forced prefix, input
    0 being the start token; with one they go at each row's index (or in
    the tree's scratch slots: `layers.layout.tree_slot_layout`), and an
    input at position 0 is read as BOS whatever id the loop fed (the loops
    feed T5's start id 0).

    Returns:
      `logits [B, T, V]` float32, `features [B, T, D]` float32 (after the
      final norm) and the new cache (None without one; with a tree the
      index is unchanged).
    """
    cfg = self.config
    b, t = tokens.shape
    q_pos = self_visibility(cfg, cache, b, t, tree)[0]
    tokens = jnp.where(q_pos == 0, cfg.bos_id, tokens)
    x = self._embedder()(tokens)
    x, cache = run_layers(cfg, self.layers, x, cross, cache, tree)
    features = self.norm(x)
    logits = self.project(features)
    return logits, features.astype(jnp.float32), cache

  def embed(self, tokens: jax.Array) -> jax.Array:
    """The decoder's scaled token embeddings `[..., D]` (ids as given)."""
    return self._embedder()(tokens)


def run_layers(config, layers, x, cross: CrossKV, cache=None, tree=None):
  """`DecoderLayer`s over embedded inputs `x [B, T, D]` (the decoder's, or
  a feature draft's): positions, visibility and RoPE from `cache` and
  `tree` as `Decoder.__call__` describes.

  Returns:
    The last layer's output `[B, T, D]` and the new cache (None without
    one; with a tree the index is unchanged).
  """
  b, t = x.shape[:2]
  q_pos, new_slots, tables, visible = self_visibility(config, cache, b, t, tree)
  rotary = _rotary(config.decoder, q_pos)
  cross_visible = cross.encoder_valid[:, None, None, :]
  new_k, new_v = [], []
  for i, layer in enumerate(layers):
    kv = None if cache is None else (cache.keys[i], cache.values[i])
    lt = layer.layer_type
    x, (k, v) = layer(
      x,
      rotary[lt],
      visible[lt],
      (cross.keys[i], cross.values[i]),
      cross_visible,
      kv,
      new_slots,
    )
    new_k.append(k)
    new_v.append(v)
  if cache is not None:
    cache = cache_lib.RingKVCache(
      keys=tuple(new_k),
      values=tuple(new_v),
      slots=tables,
      index=cache.index if tree is not None else cache.index + t,
    )
  return x, cache


class Transformer(nn.Module):
  """T5Gemma encoder-decoder; the root of the parameter tree."""

  config: T5GemmaConfig

  def setup(self):
    cfg = self.config
    shared = None
    if cfg.shared_embedding:
      self.embedder = Embed(cfg, cfg.decoder.emb_dim, with_eoi=True)
      shared = self.embedder
    self.encoder = Encoder(cfg, shared)
    self.decoder = Decoder(cfg, shared)

  def prepare_decoder(self, encoder_tokens) -> CrossKV:
    """Runs the encoder once and projects its keys and values once."""
    encoded = self.encoder(encoder_tokens)
    return self.decoder.precompute_cross(encoded, encoder_tokens)

  def decode(self, tokens, cross, cache=None, tree=None):
    """See `Decoder.__call__`."""
    return self.decoder(tokens, cross, cache, tree)

  def project(self, features: jax.Array) -> jax.Array:
    return self.decoder.project(features)

  def embed_decoder(self, tokens: jax.Array) -> jax.Array:
    return self.decoder.embed(tokens)

  def __call__(self, encoder_tokens, decoder_input_tokens):
    """Teacher-forced `(logits [B, T, V], features [B, T, D])`."""
    cross = self.prepare_decoder(encoder_tokens)
    logits, features, _ = self.decoder(decoder_input_tokens, cross)
    return logits, features


def param_specs(config: T5GemmaConfig) -> dict[str, tuple[tuple, tuple]]:
  """`'a/b/kernel'` -> `(logical axis names, shape)` of every parameter."""
  boxed = jax.eval_shape(
    Transformer(config).init, jax.random.key(0), *dummy_inputs()
  )['params']
  flat = flax.traverse_util.flatten_dict(boxed, sep='/')
  return {
    name: (tuple(box.names), tuple(box.value.shape))
    for name, box in flat.items()
  }


# Logical axes of the decode state's leaves by rank: keys and values
# `[B, L, K, Dh]` (the ring, the encoder's), slot tables and masks `[B, L]`,
# the index `[B]`.
STATE_AXES_BY_RANK = {
  1: ('batch',),
  2: ('batch', 'length'),
  4: ('batch', 'length', 'heads', 'kv'),
}


def dummy_inputs() -> tuple[jax.Array, jax.Array]:
  """Encoder and decoder tokens `[1, 1]` for `Transformer.init`."""
  return jnp.ones((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32)

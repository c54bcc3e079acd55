"""LongT5's encoder self-attention: local and transient-global (Guo et al.).

Local: the input is cut into blocks of `L = local_radius + 1` tokens; each
block's queries attend to its own block and the two beside it (`3L` keys),
and a key counts only within `local_radius` tokens of the query, so the cost
is linear in the input length. The relative-position bias is T5's
(bidirectional buckets of `key - query`) from the stack's table.

Transient global (`transient-global`): every `global_block_size` input tokens
are also summed into one global token (its block's aggregate, then an RMS
norm per layer, `global_input_layer_norm`); each query attends to its local
keys and to every global token of its row, with a second bias table
(`global_relpos_bias`) over `global block - query's block`. Tokens after the
last full block join it; rows shorter than one block have none.

Semantics and masks follow transformers' `LongT5LocalAttention` and
`LongT5TransientGlobalAttention` (flaxformer's LongT5). The decoder is T5's
and unchanged. Parameter names are ours (T5X has no LongT5): the q/k/v/out
projections are the layer's `attention`, as in T5.
"""

from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.t5.config import T5Config

_MASK_VALUE = -1e10


@flax.struct.dataclass(kw_only=True)
class LongLayout:
  """What every layer of a LongT5 encoder shares, computed once per input.

  Attributes:
    local_bias: `[B, nb, H, L, 3L]` float32: relative positions plus the
      locality and padding masks of each block's `3L` keys.
    block_ids: `[B, S] int32` global block of each token, -1 for none
      (transient-global only, else None).
    side_bias: `[B, nb, H, L, G]` float32 bias of each query on the `G`
      global tokens (transient-global only, else None).
  """

  local_bias: jax.Array
  block_ids: jax.Array | None = None
  side_bias: jax.Array | None = None


def _split(x: jax.Array, block_len: int) -> jax.Array:
  """`[B, S, ...]` -> `[B, nb, L, ...]`, zero-padded to whole blocks."""
  s = x.shape[1]
  nb = -(-s // block_len)
  pad = [(0, 0)] * x.ndim
  pad[1] = (0, nb * block_len - s)
  x = jnp.pad(x, pad)
  return x.reshape((x.shape[0], nb, block_len) + x.shape[2:])


def _three_blocks(x: jax.Array) -> jax.Array:
  """`[B, nb, L, ...]` -> `[B, nb, 3L, ...]`: previous, own, next block."""
  pad = [(0, 0)] * x.ndim
  pad[1] = (1, 1)
  x = jnp.pad(x, pad)
  return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)


def _mask_bias(mask: jax.Array) -> jax.Array:
  return jnp.where(mask, 0.0, _MASK_VALUE).astype(jnp.float32)


def global_block_ids(valid: jax.Array, block_size: int):
  """Each token's global block and which global tokens exist per row.

  Args:
    valid: `[B, S] bool`, False on padding.
    block_size: `global_block_size`.

  Returns:
    `block_ids [B, S] int32` (-1 for padding; tokens after the last full
    block join it; all -1 in a row without a full block) and `exists
    [B, G] bool` (`G = S // block_size`).
  """
  s = valid.shape[1]
  pos = jnp.arange(s, dtype=jnp.int32)
  ids = jnp.where(valid, pos // block_size, -1)
  ends = (pos % block_size == block_size - 1) & (ids >= 0)
  full = jnp.sum(ends, axis=-1, keepdims=True).astype(jnp.int32) - 1
  ids = jnp.where(ids < full, ids, full)
  g = jnp.arange(s // block_size, dtype=jnp.int32)
  exists = g[None, :] <= jnp.max(ids, axis=-1, keepdims=True)
  return ids, exists


def layout(
  config: T5Config,
  valid: jax.Array,
  relpos: Callable,
  global_relpos: Callable | None = None,
) -> LongLayout:
  """The masks and biases of a LongT5 encoder for `valid [B, S]`.

  Args:
    config: `encoder_attention` 'local' or 'transient-global'.
    valid: `[B, S] bool`.
    relpos: the stack's `RelativePositionBiases` (bidirectional).
    global_relpos: the global tokens' table (transient-global).
  """
  block = config.local_radius + 1
  q_pos = jnp.arange(block, 2 * block, dtype=jnp.int32)[None]
  k_pos = jnp.arange(3 * block, dtype=jnp.int32)[None]
  position = relpos(q_pos, k_pos).astype(jnp.float32)  # [1, H, L, 3L]
  q_valid = _split(valid, block)  # [B, nb, L]
  k_valid = _three_blocks(q_valid)  # [B, nb, 3L]
  near = jnp.abs(k_pos - q_pos[0][:, None]) < block  # [L, 3L]
  mask = q_valid[..., :, None] & k_valid[..., None, :] & near
  local_bias = position[:, None] + _mask_bias(mask)[:, :, None]
  if config.encoder_attention != 'transient-global':
    return LongLayout(local_bias=local_bias)
  ids, exists = global_block_ids(valid, config.global_block_size)
  g = jnp.broadcast_to(
    jnp.arange(exists.shape[1], dtype=jnp.int32), exists.shape
  )
  side = global_relpos(ids, g).astype(jnp.float32)  # [B, H, S, G]
  # A token sees the global tokens that exist (padding: those that do not).
  side_mask = valid[:, None, :, None] == exists[:, None, None, :]
  side = side + _mask_bias(side_mask)
  side = _split(jnp.moveaxis(side, 2, 1), block)  # [B, nb, L, H, G]
  return LongLayout(
    local_bias=local_bias,
    block_ids=ids,
    side_bias=jnp.moveaxis(side, 3, 2),
  )


def attend(
  config: T5Config,
  attention,
  x: jax.Array,
  long: LongLayout,
  global_norm: Callable | None = None,
) -> jax.Array:
  """Local or transient-global self-attention of the encoder layer.

  Args:
    config: the model's config.
    attention: the layer's `network.Attention` (its q/k/v/out projections).
    x: the normed layer input `[B, S, D]`.
    long: `layout(...)` of this input.
    global_norm: the layer's `global_input_layer_norm` (transient-global).

  Returns:
    `[B, S, D]`.
  """
  cfg = config
  b, s, _ = x.shape
  block = cfg.local_radius + 1
  heads = lambda y: y.reshape(y.shape[:-1] + (cfg.num_heads, cfg.head_dim))
  q = _split(heads(attention.query(x)), block)  # [B, nb, L, H, Dh]
  k = _three_blocks(_split(heads(attention.key(x)), block))
  v = _three_blocks(_split(heads(attention.value(x)), block))
  bias = long.local_bias
  if long.side_bias is not None:
    n_global = long.side_bias.shape[-1]
    one_hot = jax.nn.one_hot(
      jnp.where(long.block_ids >= 0, long.block_ids, n_global),
      n_global + 1,
      dtype=x.dtype,
    )[..., :n_global]
    aggregates = global_norm(jnp.einsum('bsd,bsg->bgd', x, one_hot))
    nb = q.shape[1]
    tile = lambda y: jnp.broadcast_to(y[:, None], (b, nb) + y.shape[1:])
    k = jnp.concatenate([k, tile(heads(attention.key(aggregates)))], axis=2)
    v = jnp.concatenate([v, tile(heads(attention.value(aggregates)))], axis=2)
    bias = jnp.concatenate([bias, long.side_bias], axis=-1)
  if cfg.float32_attention_logits:
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
  logits = jnp.einsum('bnqhd,bnkhd->bnhqk', q, k)
  logits = logits + bias.astype(logits.dtype)
  weights = jax.nn.softmax(logits.astype(jnp.float32)).astype(cfg.dtype)
  out = jnp.einsum('bnhqk,bnkhd->bnqhd', weights, v.astype(cfg.dtype))
  out = out.reshape((b, -1, cfg.num_heads * cfg.head_dim))[:, :s]
  return attention.out(out)

"""Functional key/value cache with a per-row write index.

Rows of a speculative batch accept different numbers of tokens, so every row
has its own index. Writes overwrite (T5X adds a one-hot slice instead, which
would corrupt a slot written again after a rollback). Rolling back a row is
setting its index: slots at or past it are invisible to attention, because
attention masks by position, and are overwritten by later writes.
"""

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.layers import layout

query_positions = layout.query_positions
causal_mask = layout.causal_mask


@flax.struct.dataclass(kw_only=True)
class KVCache:
  """Self-attention keys and values of every decoder layer.

  Attributes:
    keys: per layer, `[B, H, Dh, L]` (T5X's layout: the one XLA:CPU's
      attention dots read without transposing the cache); slot `t` (last
      axis) of row `b` holds the key of decoder input position `t`, valid
      for `t < index[b]`.
    values: per layer, `[B, H, Dh, L]`, like `keys`.
    index: `[B] int32`, number of valid slots per row (the next write slot).
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  index: jax.Array

  @classmethod
  def zeros(
    cls,
    num_layers: int,
    batch: int,
    length: int,
    num_heads: int,
    head_dim: int,
    dtype,
  ) -> 'KVCache':
    shape = (batch, num_heads, head_dim, length)
    return cls(
      keys=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
      values=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
      index=jnp.zeros((batch,), jnp.int32),
    )

  @property
  def length(self) -> int:
    return self.keys[0].shape[-1]

  def rollback(self, index: jax.Array) -> 'KVCache':
    """Keeps the first `index[b]` slots of row `b` valid; `index`: `[B]`."""
    return self.replace(index=jnp.asarray(index, jnp.int32))

  def commit_path(self, slots: jax.Array, count: jax.Array) -> 'KVCache':
    """Moves an accepted tree path from scratch slots to the next slots.

    Slot `index + slots[b, j]` is copied to `index + j` for `j < count[b]`
    (every layer, keys and values), and the index advances by `count`.
    Other scratch slots are left as they are: past the new index they are
    invisible and overwritten later, so rejected nodes leave no trace.

    Args:
      slots: `[B, K] int32` scratch offsets of the path (relative to the
        index), non-decreasing in j with `slots[b, j] >= j`.
      count: `[B] int32` in [0, K], path length per row.
    """
    width = slots.shape[1]
    j = jnp.arange(width, dtype=jnp.int32)[None]
    src = self.index[:, None] + jnp.where(j < count[:, None], slots, j)

    def move(buffer):
      moved = jnp.take_along_axis(buffer, src[:, None, None, :], axis=-1)
      return write(buffer, moved, self.index)

    return KVCache(
      keys=tuple(move(k) for k in self.keys),
      values=tuple(move(v) for v in self.values),
      index=self.index + jnp.asarray(count, jnp.int32),
    )

  def gather(self, rows: jax.Array) -> 'KVCache':
    """Row i becomes row `rows[i]` (keys, values and index); `rows`: `[B]`.

    Beam search reorders the cache by parent beam with it.
    """

    def take(x):
      return jnp.take(x, rows, axis=0)

    return KVCache(
      keys=tuple(map(take, self.keys)),
      values=tuple(map(take, self.values)),
      index=take(self.index),
    )


def write(buffer: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
  """Overwrites `new [B, ..., T]` into `buffer [B, ..., L]` at row offsets.

  Writes along the last axis (the cache's length axis). The caller
  guarantees `index[b] + T <= L` (dynamic_update_slice would otherwise clamp
  the offset and shift the write).

  One token into one row (B = T = 1: plain decoding and draft steps at batch
  1) is a select over the buffer instead. XLA:CPU makes that write a
  dynamic-update-slice and duplicates it into the attention dot that reads
  the buffer, copying the whole buffer four times per call (20 MB per T5
  v1.1 base decoder step); the select costs one pass. With more rows, or
  more tokens, the per-row update stays in place and is kept.
  """
  if buffer.shape[0] == 1 and new.shape[-1] == 1:
    slots = jnp.arange(buffer.shape[-1], dtype=index.dtype)
    hit = (slots == index[:, None]).reshape(
      (1,) * (buffer.ndim - 1) + (buffer.shape[-1],)
    )
    return jnp.where(hit, new.astype(buffer.dtype), buffer)
  return jax.vmap(
    lambda b, n, i: lax.dynamic_update_slice_in_dim(
      b, n.astype(b.dtype), i, axis=b.ndim - 1
    )
  )(buffer, new, index)


def tree_layout(index: jax.Array, length: int, tree):
  """Positions and visibility of a tree call (`core.tree_shape.TreeAttention`)
  in a cache of `length` slots (`layers.layout.tree_slot_layout`).

  Returns:
    `q_pos [B, T]`, `k_pos [B, L]` and `visible [B, 1, T, L] bool`.
  """
  slots = jnp.broadcast_to(
    jnp.arange(length, dtype=jnp.int32), (index.shape[0], length)
  )
  return layout.tree_slot_layout(index, slots, tree)


def self_attention_layout(cache, batch: int, num_new: int, tree=None):
  """Where `num_new` new tokens per row sit for self-attention.

  Without a cache (teacher forcing) they are positions 0..T-1 attending
  causally; with one, they follow each row's index (`query_positions`), or
  lie in the tree's scratch slots (`tree_layout`).

  Returns:
    `(q_pos [B, T], k_pos [B, L], visible [B, 1, T, L] bool)`.
  """
  if cache is None:
    q_pos = jnp.broadcast_to(
      jnp.arange(num_new, dtype=jnp.int32), (batch, num_new)
    )
    return q_pos, q_pos, causal_mask(q_pos, q_pos)
  if tree is not None:
    return tree_layout(cache.index, cache.length, tree)
  q_pos = query_positions(cache.index, num_new)
  k_pos = jnp.broadcast_to(
    jnp.arange(cache.length, dtype=jnp.int32), (batch, cache.length)
  )
  return q_pos, k_pos, causal_mask(q_pos, k_pos)

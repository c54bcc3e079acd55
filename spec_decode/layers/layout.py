"""Positions and visibility of a decoder call's keys, per row.

A decoder cache holds keys by slot: slot `s < index[b]` of row `b` is the
committed input `s`; slots at or past the index are scratch (a chain call
writes its T tokens at `index .. index + T - 1`, a tree call writes its
nodes at `index + offset + t`). A buffer entry holds one slot: entry `e` of
a plain cache holds slot `e`; a ring buffer's entry holds the newest slot
congruent to `e` (`t5gemma/cache.py`). Both give `slots [B, L]`, the slot
each entry holds after this call's writes (negative: never written), and
the functions here turn that into key positions and a visibility mask.
"""

import jax
import jax.numpy as jnp
import numpy as np


def query_positions(index: jax.Array, num_new: int) -> jax.Array:
  """Positions `[B, T]` of `T` new tokens written at `index [B]`."""
  return index[:, None] + jnp.arange(num_new, dtype=jnp.int32)[None, :]


def causal_mask(q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
  """`[B, 1, T, L]` bool: key position `<=` query position, per row."""
  return k_pos[:, None, None, :] <= q_pos[:, None, :, None]


def chain_layout(index: jax.Array, slots: jax.Array, num_new: int):
  """`num_new` tokens per row at slots `index .. index + T - 1`.

  Args:
    index: `[B] int32` committed slots per row.
    slots: `[B, L] int32` the slot each buffer entry holds (negative: none).
    num_new: T.

  Returns:
    `q_pos [B, T]`, `k_pos [B, L]` (an entry's position is its slot) and
    `visible [B, 1, T, L] bool`: written entries at or before the query.
  """
  q_pos = query_positions(index, num_new)
  visible = causal_mask(q_pos, slots) & (slots >= 0)[:, None, None, :]
  return q_pos, slots, visible


def tree_slot_layout(index: jax.Array, slots: jax.Array, tree):
  """Positions and visibility of a tree call (`core.tree_shape.TreeAttention`).

  Args:
    index: `[B] int32` committed slots per row.
    slots: `[B, L] int32` the slot each buffer entry holds (negative: none).
    tree: the call's `TreeAttention` (static), or an object with its
      fields whose `mask_array()` is `[B, T, offset + T]`, one mask per row
      (speculative beam search, `core.tree_shape.RowTreeAttention`).

  Returns:
    `q_pos [B, T]`, `k_pos [B, L]` (a scratch slot's position is that of
    the node it holds) and `visible [B, 1, T, L] bool`: every committed
    entry and the scratch slots `tree.mask` allows.
  """
  new_pos = jnp.asarray(tree.new_positions())
  q_pos = index[:, None] + new_pos[None]
  width = tree.offset + tree.num_new
  rel = slots - index[:, None]  # [B, L]
  in_tree = (rel >= 0) & (rel < width)
  rel_c = jnp.clip(rel, 0, width - 1)
  slot_pos = jnp.asarray(np.asarray(tree.positions, np.int32))[rel_c]
  k_pos = jnp.where(rel < 0, slots, index[:, None] + slot_pos)
  mask = jnp.asarray(tree.mask_array())
  if mask.ndim == 3:  # One mask per row `[B, T, width]` (beam trees).
    mask = jnp.take_along_axis(mask, rel_c[:, None, :], axis=2)
  else:
    mask = jnp.transpose(mask[:, rel_c], (1, 0, 2))  # [B, T, L]
  committed = (rel < 0) & (slots >= 0)
  visible = committed[:, None, :] | (in_tree[:, None, :] & mask)
  return q_pos, k_pos, visible[:, None]

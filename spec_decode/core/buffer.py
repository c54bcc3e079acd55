"""The decoder-input buffer every loop keeps, and appending a verified block.

Token buffer: `inputs [B, M + W + 2]` holds decoder inputs (`M` =
max_decode_len, `W` the widest block an iteration may write: gamma or a
tree's depth); `inputs[:, 0]` is the start id 0 and `inputs[:, k]` is output
token k (1-based). A row with `n` output tokens has its target state at
index `n`: it holds inputs `0..n-1`, and input `n` (the newest token) is fed
next. The chain loops and the tree loop share this layout and `commit_block`.
"""

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.core.decode_settings import DecodeSettings


def gather(inputs: jax.Array, positions: jax.Array) -> jax.Array:
  """`inputs [B, L]` at `positions [B, K]`: `[B, K]`."""
  return jnp.take_along_axis(inputs, positions, axis=1)


def commit_block(
  state: Any,
  block: jax.Array,
  num_new: jax.Array,
  settings: DecodeSettings,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Appends up to `num_new [B]` tokens of `block [B, W]` per active row.

  `state` is any loop state with `inputs [B, M + W + 2]` (`W` >= the
  block's width), `length [B]` and `done [B]` (the chain and the tree loops
  share this). Tokens after an EOS and past M are dropped. Returns the new
  inputs, lengths, done flags and the number of tokens actually kept `[B]`.
  """
  width = block.shape[1]
  offsets = jnp.arange(width)[None, :]
  is_eos = (block == settings.eos_id) & (offsets < num_new[:, None])
  first_eos = jnp.where(
    jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, width
  )
  room = settings.max_decode_len - state.length
  kept = jnp.minimum(jnp.minimum(num_new, first_eos), room)
  kept = jnp.where(state.done, 0, kept)
  start = state.length + 1
  old = jax.vmap(lambda buf, s: lax.dynamic_slice_in_dim(buf, s, width))(
    state.inputs, start
  )
  block = jnp.where(offsets < kept[:, None], block, old)
  inputs = jax.vmap(
    lambda buf, blk, s: lax.dynamic_update_slice_in_dim(buf, blk, s, axis=0)
  )(state.inputs, block, start)
  length = state.length + kept
  hit_eos = jnp.any(
    (block == settings.eos_id) & (offsets < kept[:, None]), axis=1
  )
  done = state.done | hit_eos | (length >= settings.max_decode_len)
  return inputs, length, done, kept

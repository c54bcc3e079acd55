"""The decoder's self-attention cache: global layers whole, sliding layers a
ring buffer of their window.

A sliding layer's query at position p reads keys p - W < k <= p only, so its
cache keeps `R = W + margin - 1` entries (`config.ring_margin`: the most
slots one call writes) and slot `s` lives in entry `s % R`: memory grows
with the window, never with the output. A global layer keeps every slot
(`R = length`, the same arithmetic). Every entry also records the slot it
holds (`slots`, -1 when empty), so visibility is exact: an entry shows a
committed slot (< index), or a scratch slot this call or this tree wrote,
never a stale write a rollback left behind (`layers/layout.py` reads it).

Contract (what keeps the ring exact): every write of a row lands within
`margin` slots of the index it had when written, and a row's index never
moves back past an index it already had when it wrote past it. The decoding
loops keep it: a rollback only drops tokens of the call before it. A slot a
query still needs (>= its position - W + 1) is then never overwritten.
"""

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.t5gemma.config import GLOBAL
from spec_decode.t5gemma.config import SLIDING
from spec_decode.t5gemma.config import StackConfig


def ring_size(stack: StackConfig, layer_type: str, length: int, margin: int):
  """Entries a layer type keeps for `length` decoder inputs."""
  if layer_type == GLOBAL:
    return length
  return min(length, stack.sliding_window + margin - 1)


@flax.struct.dataclass(kw_only=True)
class RingKVCache:
  """Keys and values of every decoder layer, by ring entry.

  Attributes:
    keys: per layer `[B, R, K, Dh]` (R: that layer type's `ring_size`);
      keys after RoPE and QK-norm.
    values: per layer `[B, R, K, Dh]`.
    slots: per layer type (`GLOBAL`, `SLIDING`), `[B, R] int32`: the slot
      each entry holds, -1 when none (every layer of a type writes the same
      slots).
    index: `[B] int32`, committed slots per row (the next write slot).
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  slots: dict[str, jax.Array]
  index: jax.Array

  @classmethod
  def zeros(
    cls, stack: StackConfig, batch: int, length: int, margin: int, dtype
  ) -> 'RingKVCache':
    def sized(t):
      return ring_size(stack, t, length, margin)

    def buffer(t):
      return jnp.zeros(
        (batch, sized(t), stack.num_kv_heads, stack.head_dim), dtype
      )

    types = sorted(set(stack.layer_types))
    return cls(
      keys=tuple(buffer(t) for t in stack.layer_types),
      values=tuple(buffer(t) for t in stack.layer_types),
      slots={t: jnp.full((batch, sized(t)), -1, jnp.int32) for t in types},
      index=jnp.zeros((batch,), jnp.int32),
    )

  def rollback(self, index: jax.Array) -> 'RingKVCache':
    """Keeps the first `index[b]` slots of row `b`; later entries become
    invisible (their recorded slot is at or past the index)."""
    return self.replace(index=jnp.asarray(index, jnp.int32))

  def with_slots(self, new_slots: jax.Array) -> dict[str, jax.Array]:
    """The `slots` tables after writing slots `new_slots [B, T]`."""
    return {t: _scatter(s, new_slots, new_slots) for t, s in self.slots.items()}

  def commit_path(self, slots: jax.Array, count: jax.Array) -> 'RingKVCache':
    """Moves an accepted tree path from scratch slots to the next slots.

    Slot `index + slots[b, j]` is copied to `index + j` for `j < count[b]`
    (every layer, keys and values), and the index advances by `count`.

    Args:
      slots: `[B, K] int32` scratch offsets of the path (relative to the
        index), non-decreasing in j with `slots[b, j] >= j`.
      count: `[B] int32` in [0, K], path length per row.
    """
    width = slots.shape[1]
    j = jnp.arange(width, dtype=jnp.int32)[None]
    src = self.index[:, None] + jnp.where(j < count[:, None], slots, j)
    dest = self.index[:, None] + j

    def move(buffer):
      r = buffer.shape[1]
      moved = jnp.take_along_axis(buffer, (src % r)[:, :, None, None], axis=1)
      return _scatter(buffer, dest, moved)

    return RingKVCache(
      keys=tuple(move(k) for k in self.keys),
      values=tuple(move(v) for v in self.values),
      slots={t: _scatter(s, dest, dest) for t, s in self.slots.items()},
      index=self.index + jnp.asarray(count, jnp.int32),
    )

  def gather(self, rows: jax.Array) -> 'RingKVCache':
    """Row i becomes row `rows[i]`; `rows`: `[B]` (beam reordering)."""
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), self)


def write(buffer: jax.Array, new_slots: jax.Array, new: jax.Array):
  """Writes `new [B, T, ...]` at slots `new_slots [B, T]` of a ring
  `buffer [B, R, ...]` (entry `slot % R`; T <= R, so entries are distinct)."""
  return _scatter(buffer, new_slots, new)


def _scatter(buffer: jax.Array, new_slots: jax.Array, new: jax.Array):
  r = buffer.shape[1]
  if new_slots.shape[1] > r:
    raise ValueError(
      f'a decoder call writes {new_slots.shape[1]} slots into a ring of {r}'
      ' entries: raise T5GemmaConfig.ring_margin'
    )
  entries = new_slots % r
  return jax.vmap(lambda b, e, n: b.at[e].set(n.astype(b.dtype)))(
    buffer, entries, new
  )


__all__ = ['GLOBAL', 'SLIDING', 'RingKVCache', 'ring_size', 'write']

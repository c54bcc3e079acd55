"""The draft's proposal in speculative beam search: one tree per live beam.

Each live beam (a model row) gets its own token tree, grown by the draft's
own beam search started from that beam alone: depth 1 holds the draft's c
best non-EOS next tokens after the beam; each deeper level holds the c best
non-EOS children of each of the W best nodes of the level above ("best":
the draft's log-probability of the path from the beam). Why this shape:
a replayed step needs every new live beam of the target to be a node, and
a new live beam extends one current beam by one token. So each beam's own
likely children are what must be proposed, not the draft's K best sequences
over all beams (which must all agree with the target's at once). EOS is
never a node: a sequence ending in EOS is finished and never extended.

With W >= K and c >= K and the target's log-probs as the draft's, every
step is covered: a new live beam (p, t) is among the K best non-EOS
extensions of all beams, so t is among p's K best non-EOS children, and
p's subtree holds at most K new live beams, each among its K best nodes at
that depth (the live beams of one subtree are its best extensions).

Shapes: `R` model rows (batch rows x beams), `V` vocabulary, `G` = gamma
levels, `N` nodes per tree (`TreeLayout.num_nodes`), node 0 the root.
"""

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spec_decode.core import drafter
from spec_decode.core.tree_shape import RowTreeAttention


@dataclasses.dataclass(frozen=True)
class TreeLayout:
  """Static sizes of the per-beam trees.

  Level d (1..G) holds `sizes[d - 1]` nodes, stored at node ids
  `offsets[d - 1] ..`: child r of kept node i of level d - 1 is node
  `offsets[d - 1] + i * children + r` (level 0 keeps the root alone).
  Level d < G keeps `kept[d - 1]` nodes (the W best, fewer if it has
  fewer); level G keeps none.

  Attributes:
    gamma: G >= 1 levels.
    width: W >= 1 nodes kept per level.
    children: c >= 1 children per kept node.
  """

  gamma: int
  width: int
  children: int

  @functools.cached_property
  def kept(self) -> tuple[int, ...]:
    out, parents = [], 1
    for _ in range(self.gamma - 1):
      out.append(min(self.width, parents * self.children))
      parents = out[-1]
    return tuple(out)

  @functools.cached_property
  def sizes(self) -> tuple[int, ...]:
    return tuple(k * self.children for k in (1,) + self.kept)

  @functools.cached_property
  def offsets(self) -> tuple[int, ...]:
    return tuple(1 + int(x) for x in np.cumsum((0,) + self.sizes[:-1]))

  @property
  def num_nodes(self) -> int:
    """N: nodes besides the root."""
    return sum(self.sizes)

  @functools.cached_property
  def depths(self) -> tuple[int, ...]:
    """`[N + 1]` each node's depth (the root's 0)."""
    return (0,) + tuple(
      d + 1 for d, n in enumerate(self.sizes) for _ in range(n)
    )


@flax.struct.dataclass(kw_only=True)
class BeamTrees:
  """The draft's trees, one per model row.

  Attributes:
    tokens: `[R, N + 1] int32` node tokens (column 0: the root, unused).
    first_child: `[R, N + 1] int32` node id of each node's first child
      (its children are that id + 0 .. c - 1); -1: no children.
    mask: `[R, N + 1, N + 1] bool` node t's ancestors and itself.
  """

  tokens: jax.Array
  first_child: jax.Array
  mask: jax.Array


def _best_children(logits: jax.Array, eos_id: int, c: int):
  """The c best non-EOS next tokens `[..., c]` and their log-probs."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  log_probs = log_probs.at[..., eos_id].set(-jnp.inf)
  values, tokens = lax.top_k(log_probs, c)
  return tokens.astype(jnp.int32), values


def check_logits(draft: Any, call: str, logits: Any, dims: str, *sizes):
  """Raises unless the draft's `call` returned float logits of shape
  `sizes + (V,)` (`dims` names the axes; V: the draft's vocabulary),
  naming the draft's class and the call (`core.drafter.check_array`)."""
  vocab = draft.vocab_size
  names = dims[1:-1].split(', ')
  meaning = f'{dims}: ' + ', '.join(
    f'{d} = {n}' for d, n in zip(names, sizes + (vocab,), strict=True)
  )
  drafter.check_array(
    f'{type(draft).__name__}.{call} returned logits', logits,
    sizes + (vocab,), jnp.floating, meaning,
  )  # fmt: skip


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
  """`x[r, idx[r, j], ...]` for `x [R, N, ...]`, `idx [R, J]`."""
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


def grow(
  draft: Any,
  state: Any,
  root_logits: jax.Array,
  layout: TreeLayout,
  eos_id: int,
) -> BeamTrees:
  """Grows every row's tree with one draft call per level below the first.

  Args:
    draft: a `protocol.TreeLanguageModel`.
    state: its state with each row's root fed (index one past the root:
      a node at depth d sits at relative position d - 1).
    root_logits: `[R, V]` the draft's logits after the root.
    layout: the trees' sizes.
    eos_id: end-of-sequence id (never a node).

  Returns:
    The `BeamTrees` (the draft's state is only written in scratch slots).
  """
  rows = root_logits.shape[0]
  c = layout.children
  size = layout.num_nodes + 1
  tokens, cum = _best_children(root_logits, eos_id, c)
  level_tokens, level_kept = [tokens], []
  # Ancestor-or-self rows of the fed (kept) nodes over the fed slots.
  fed_mask = jnp.zeros((rows, 0, 0), bool)
  fed_slot = None  # [R, kept] fed slot of the previous level's kept nodes.
  positions: tuple[int, ...] = ()
  for d, width in enumerate(layout.kept, start=1):
    _, kept = lax.top_k(cum, width)  # Ties: the lower node first.
    level_kept.append(kept)
    offset = fed_mask.shape[2]
    if fed_slot is None:
      parent_rows = jnp.zeros((rows, width, offset), bool)
    else:
      parent_rows = _take(fed_mask, _take(fed_slot, kept // c))
    own = jnp.broadcast_to(jnp.eye(width, dtype=bool), (rows, width, width))
    new_rows = jnp.concatenate([parent_rows, own], axis=2)
    fed_mask = jnp.concatenate(
      [jnp.pad(fed_mask, ((0, 0), (0, 0), (0, width))), new_rows], axis=1
    )
    fed_slot = offset + jnp.broadcast_to(jnp.arange(width), (rows, width))
    positions += (d - 1,) * width
    attention = RowTreeAttention(
      positions=positions, mask=new_rows, offset=offset
    )
    logits, state = draft.score_tree(state, _take(tokens, kept), attention)
    check_logits(draft, 'score_tree', logits, '[R, T, V]', rows, width)
    tokens, values = _best_children(logits, eos_id, c)
    cum = (_take(cum, kept)[:, :, None] + values).reshape(rows, width * c)
    tokens = tokens.reshape(rows, width * c)
    level_tokens.append(tokens)
  return _tables(layout, level_tokens, level_kept, rows, size)


def _tables(layout, level_tokens, level_kept, rows, size) -> BeamTrees:
  """Node tokens, first children and the ancestor mask from the levels."""
  c = layout.children
  all_tokens = jnp.concatenate(
    [jnp.zeros((rows, 1), jnp.int32)] + level_tokens, axis=1
  )
  first = [jnp.full((rows, 1), layout.offsets[0], jnp.int32)]
  root = jax.nn.one_hot(0, size, dtype=bool)
  anc = [jnp.broadcast_to(root, (rows, 1, size))]
  for d, n in enumerate(layout.sizes):
    base = layout.offsets[d]
    ids = base + jnp.arange(n)
    if d == 0:
      parent = jnp.zeros((rows, n), jnp.int32)
    else:
      prev_kept = level_kept[d - 1]  # Level-d parents, as level indices.
      parent = layout.offsets[d - 1] + _take(
        prev_kept, jnp.broadcast_to(jnp.arange(n) // c, (rows, n))
      )
    anc_d = _take(jnp.concatenate(anc, axis=1), parent)
    anc.append(anc_d | jax.nn.one_hot(ids, size, dtype=bool)[None])
    fc = jnp.full((rows, n), -1, jnp.int32)
    if d < len(layout.kept):
      kept = level_kept[d]
      fc = fc.at[jnp.arange(rows)[:, None], kept].set(
        layout.offsets[d + 1] + jnp.arange(kept.shape[1]) * c
      )
    first.append(fc)
  return BeamTrees(
    tokens=all_tokens,
    first_child=jnp.concatenate(first, axis=1),
    mask=jnp.concatenate(anc, axis=1),
  )

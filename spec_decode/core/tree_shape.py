"""Token-tree shapes and their static tables (parents, depths, masks).

A tree is static: it is part of the jit cache key, and every table below is
a numpy constant of the compiled program. Nodes are numbered breadth first:
node 0 is the root (the newest decoder input, already known), nodes
1..N are the proposed tokens, sorted by depth and then by their path of
child ranks. A node's rank is its place among its siblings: the rank-0
child is the drafter's first choice, rank 1 its second, and so on.

Dynamic trees (`DynamicTree`, EAGLE-2 style): the number of nodes per
depth is static, but which node is whose child is chosen per row at run
time from the draft's own confidence (`core.tree_draft`); the loop reads
the parents the drafter proposed (`TreeProposal.parents`) and builds the
same tables per row (`TreeTables.from_parents`).

Shapes given to `generate(tree=...)`:
  * Medusa's "choices": a list of paths of child ranks, e.g.
    `[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]` (every prefix of a path
    must be listed; the ranks of a node's children are 0..k-1);
  * a per-depth branching tuple `(3, 2, 1, 1)`: every node at depth d - 1
    gets `b_d` children (3 + 6 + 6 + 6 = 21 nodes here);
  * `(1,) * gamma` is the chain of the ordinary speculative loop.
"""

import dataclasses
import functools
from typing import Any
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# More nodes than this are never useful in one target call (and would make
# the ancestor mask and the per-node q large).
MAX_NODES = 256


@dataclasses.dataclass(frozen=True)
class TreeAttention:
  """How a tree call's new tokens sit in a cache (static, hashable).

  A language model's state holds `index[b]` committed inputs per row. A tree
  call writes its T new tokens into scratch slots `index + offset + t`
  (slots `index .. index + offset - 1` hold this tree's earlier nodes) and
  leaves `index` unchanged.

  Attributes:
    positions: `[offset + T]` position of every scratch slot relative to
      `index` (a token at depth d of a tree rooted at input `index` is at
      position `index + d`).
    offset: scratch slots written by earlier calls of this tree.
    mask: `[T][offset + T]` bools: new token t attends to scratch slot j.
      Every committed slot (< index) is always visible.
  """

  positions: tuple[int, ...]
  offset: int
  mask: tuple[tuple[bool, ...], ...]

  @property
  def num_new(self) -> int:
    return len(self.mask)

  def new_positions(self) -> np.ndarray:
    """`[T] int32` relative positions of the new tokens."""
    return np.asarray(self.positions[self.offset :], np.int32)

  def mask_array(self) -> np.ndarray:
    """`[T, offset + T] bool`."""
    return np.asarray(self.mask, bool).reshape(self.num_new, -1)


@dataclasses.dataclass(frozen=True, eq=False)
class RowTreeAttention:
  """A tree call whose ancestor mask differs per model row.

  Duck-types `TreeAttention` for `layers.layout.tree_slot_layout`: the
  positions are static (a node's depth), the mask is a traced array
  (speculative beam search's per-beam trees, dynamic trees).

  Attributes:
    positions: `[offset + T]` position of every scratch slot relative to
      the row's index.
    mask: `[R, T, offset + T] bool` per model row: new token t attends to
      scratch slot u.
    offset: scratch slots written by earlier calls of this tree.
  """

  positions: tuple[int, ...]
  mask: jax.Array
  offset: int = 0

  @property
  def num_new(self) -> int:
    return len(self.positions) - self.offset

  def new_positions(self) -> np.ndarray:
    return np.asarray(self.positions[self.offset :], np.int32)

  def mask_array(self) -> jax.Array:
    return self.mask


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """A static token tree (see the module docstring).

  Attributes:
    paths: the N nodes as paths of child ranks, breadth-first order.
  """

  paths: tuple[tuple[int, ...], ...]

  def __post_init__(self):
    _validate(self.paths)

  # -- sizes -------------------------------------------------------------------
  @property
  def num_nodes(self) -> int:
    """N, proposed tokens (the root not counted)."""
    return len(self.paths)

  @property
  def depth(self) -> int:
    """D, the longest path (tokens accepted at most per call)."""
    return max(len(p) for p in self.paths)

  @property
  def width(self) -> int:
    """W, the most children of one node."""
    return int(self.children.shape[1])

  @property
  def is_chain(self) -> bool:
    return all(r == 0 for p in self.paths for r in p)

  # -- tables over nodes 0..N (0 = root) ---------------------------------------
  @functools.cached_property
  def _index(self) -> dict[tuple[int, ...], int]:
    index = {(): 0}
    index.update({p: i + 1 for i, p in enumerate(self.paths)})
    return index

  @functools.cached_property
  def parents(self) -> np.ndarray:
    """`[N + 1] int32`, -1 for the root."""
    return np.asarray(
      [-1] + [self._index[p[:-1]] for p in self.paths], np.int32
    )

  @functools.cached_property
  def depths(self) -> np.ndarray:
    """`[N + 1] int32`, 0 for the root."""
    return np.asarray([0] + [len(p) for p in self.paths], np.int32)

  @functools.cached_property
  def ranks(self) -> np.ndarray:
    """`[N + 1] int32` place among siblings (0 for the root)."""
    return np.asarray([0] + [p[-1] for p in self.paths], np.int32)

  @functools.cached_property
  def children(self) -> np.ndarray:
    """`[N + 1, W] int32`: `children[u, r]` is u's rank-r child, or -1."""
    count = np.bincount(self.parents[1:], minlength=self.num_nodes + 1)
    table = np.full((self.num_nodes + 1, max(int(count.max()), 1)), -1)
    for i, p in enumerate(self.paths):
      table[self._index[p[:-1]], p[-1]] = i + 1
    return table.astype(np.int32)

  @functools.cached_property
  def ancestors(self) -> np.ndarray:
    """`[N + 1, N + 1] bool`: j is u's ancestor or u itself."""
    mask = np.zeros((self.num_nodes + 1,) * 2, bool)
    for u in range(self.num_nodes + 1):
      v = u
      while v >= 0:
        mask[u, v] = True
        v = self.parents[v]
    return mask

  @functools.cached_property
  def principal(self) -> np.ndarray:
    """`[N + 1] bool`: the node lies on the all-rank-0 path (the chain)."""
    return np.asarray([True] + [not any(p) for p in self.paths])

  @functools.cached_property
  def path_nodes(self) -> np.ndarray:
    """`[N + 1, D + 1] int32`: the nodes from the root down to u, then u
    repeated (row u, entry j is u's ancestor at depth min(j, depth(u)))."""
    table = np.zeros((self.num_nodes + 1, self.depth + 1), np.int32)
    for u in range(self.num_nodes + 1):
      chain = [u]
      while self.parents[chain[-1]] >= 0:
        chain.append(int(self.parents[chain[-1]]))
      chain = chain[::-1]
      table[u] = chain + [u] * (self.depth + 1 - len(chain))
    return table

  # -- attention layouts -------------------------------------------------------
  def target_attention(self) -> TreeAttention:
    """The verification call: the root (input `index`) and the N nodes."""
    anc = self.ancestors
    return TreeAttention(
      positions=tuple(int(d) for d in self.depths),
      offset=0,
      mask=tuple(tuple(bool(x) for x in row) for row in anc),
    )

  @functools.cached_property
  def internal(self) -> np.ndarray:
    """Node ids (>= 1) that have children, breadth first."""
    has = np.zeros(self.num_nodes + 1, bool)
    has[self.parents[1:]] = True
    return np.flatnonzero(has[1:]) + 1

  def draft_attention(self, depth: int) -> tuple[np.ndarray, TreeAttention]:
    """A model draft's call feeding the internal nodes at `depth` >= 1.

    The draft holds the root as a committed input, so its index is one past
    the root: a node at depth d is at relative position d - 1. Its scratch
    slots hold the internal nodes only (leaves are never fed).

    Returns:
      The node ids fed `[T]` and their `TreeAttention`.
    """
    internal = self.internal
    fed = internal[self.depths[internal] == depth]
    upto = internal[self.depths[internal] <= depth]
    offset = len(upto) - len(fed)
    mask = self.ancestors[np.ix_(fed, upto)]
    return fed, TreeAttention(
      positions=tuple(int(self.depths[u]) - 1 for u in upto),
      offset=offset,
      mask=tuple(tuple(bool(x) for x in row) for row in mask),
    )


# Candidate children per node of a dynamic tree unless given (`DynamicTree`).
DYNAMIC_WIDTH = 8


@dataclasses.dataclass(frozen=True)
class DynamicTree:
  """A dynamic tree's static sizes (module docstring, `core.tree_draft`).

  Depth d holds `levels[d - 1]` nodes, node ids in breadth-first blocks
  (depth 1 first); which node of depth d - 1 is each one's parent, and so
  each node's rank among its siblings, is chosen per row at run time.

  Attributes:
    levels: (L_1, ..., L_D) nodes per depth; N = their sum.
    width: W, the most children of one node.
  """

  levels: tuple[int, ...]
  width: int = DYNAMIC_WIDTH

  def __post_init__(self):
    levels, width = self.levels, self.width
    if (
      not isinstance(levels, tuple)
      or not levels
      or any(
        isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1
        for x in levels
      )
    ):
      raise ValueError(
        f'DynamicTree levels must be a non-empty tuple of ints >= 1, '
        f'got {levels!r}'
      )
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
      raise ValueError(f'DynamicTree width must be an int >= 1, got {width!r}')
    if sum(levels) > MAX_NODES:
      raise ValueError(
        f'a tree has at most {MAX_NODES} nodes, got {sum(levels)} ({levels})'
      )
    for d, size in enumerate(levels):
      room = width * (levels[d - 1] if d else 1)
      if size > room:
        raise ValueError(
          f'DynamicTree depth {d + 1} has {size} nodes, more than width '
          f'{width} x {room // width} parents allow'
        )

  @classmethod
  def budget(
    cls, nodes: int, depth: int, width: int = DYNAMIC_WIDTH
  ) -> 'DynamicTree':
    """`nodes` split evenly over `depth` levels (the first levels take
    the remainder), as EAGLE-2 keeps the same number of nodes per level.

    Raises:
      ValueError: fewer nodes than levels, or a level wider than `width`.
    """
    for name, x in (('nodes', nodes), ('depth', depth)):
      if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(
          f'a dynamic tree {name} must be an int >= 1, got {x!r}'
        )
    if nodes < depth:
      raise ValueError(
        f'a dynamic tree needs at least one node per level: {nodes} nodes, '
        f'depth {depth}'
      )
    base, extra = divmod(int(nodes), int(depth))
    return cls(tuple(base + (d < extra) for d in range(depth)), width)

  @classmethod
  def like(cls, shape: TreeShape, width: int = DYNAMIC_WIDTH) -> 'DynamicTree':
    """The nodes per depth of a static `shape` (at least `shape.width`
    children per node)."""
    counts = np.bincount(shape.depths[1:])[1:]
    return cls(tuple(int(c) for c in counts), max(width, shape.width))

  @property
  def num_nodes(self) -> int:
    return sum(self.levels)

  @property
  def depth(self) -> int:
    return len(self.levels)

  @functools.cached_property
  def depths(self) -> np.ndarray:
    """`[N + 1] int32`, 0 for the root (static, as `TreeShape.depths`)."""
    return np.repeat(
      np.arange(self.depth + 1, dtype=np.int32), (1,) + self.levels
    )

  def level_ids(self, depth: int) -> np.ndarray:
    """Node ids at `depth` (0: the root)."""
    return np.flatnonzero(self.depths == depth).astype(np.int32)


@flax.struct.dataclass(kw_only=True)
class TreeTables:
  """A tree's tables (`TreeShape`'s) per row, `[B, ...]`, for the loop and
  the verifier: a static shape's broadcast (`of_shape`), or a dynamic
  tree's from the parents its drafter chose (`from_parents`).

  Attributes:
    parents: `[B, N + 1] int32`, -1 for the root.
    ranks: `[B, N + 1] int32` place among siblings (0 for the root).
    children: `[B, N + 1, W] int32` u's rank-r child, or -1.
    ancestors: `[B, N + 1, N + 1] bool` j is u's ancestor or u itself.
    path_nodes: `[B, N + 1, D + 1] int32` (`TreeShape.path_nodes`).
    principal: `[B, N + 1] bool` u lies on the all-rank-0 path.
  """

  parents: jax.Array
  ranks: jax.Array
  children: jax.Array
  ancestors: jax.Array
  path_nodes: jax.Array
  principal: jax.Array

  @classmethod
  def of_shape(cls, shape: TreeShape, batch: int) -> 'TreeTables':
    def rows(table):
      return jnp.broadcast_to(jnp.asarray(table), (batch,) + table.shape)

    return cls(
      parents=rows(shape.parents),
      ranks=rows(shape.ranks),
      children=rows(shape.children),
      ancestors=rows(shape.ancestors),
      path_nodes=rows(shape.path_nodes),
      principal=rows(shape.principal),
    )

  @classmethod
  def from_parents(cls, tree: DynamicTree, parents: jax.Array) -> 'TreeTables':
    """The tables of `tree` whose node i + 1 has parent `parents[:, i]`
    (`[B, N]`, a node of the depth above). Siblings rank in node-id order.
    """
    n, d = tree.num_nodes, tree.depth
    batch = parents.shape[0]
    ids = jnp.arange(n + 1, dtype=jnp.int32)
    par = jnp.concatenate(
      [jnp.full((batch, 1), -1, jnp.int32), parents.astype(jnp.int32)], 1
    )
    elder = (par[:, :, None] == par[:, None, :]) & (
      ids[None, None] < ids[None, :, None]
    )
    ranks = jnp.sum(elder, axis=2).astype(jnp.int32)
    drop = (par < 0) | (ranks >= tree.width)
    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], par.shape)
    children = jnp.full((batch, n + 1, tree.width), -1, jnp.int32)
    children = children.at[
      rows, jnp.where(drop, n + 1, par), jnp.minimum(ranks, tree.width - 1)
    ].set(jnp.broadcast_to(ids, par.shape), mode='drop')
    # up[:, u, k]: u's ancestor k levels up (the root past the top).
    up = [jnp.broadcast_to(ids, par.shape)]
    safe = jnp.maximum(par, 0)
    for _ in range(d):
      up.append(jnp.take_along_axis(safe, up[-1], axis=1))
    up = jnp.stack(up, axis=2)  # [B, N + 1, D + 1]
    depths = tree.depths
    back = np.maximum(depths[:, None] - np.arange(d + 1)[None], 0)
    path = jnp.take_along_axis(up, jnp.asarray(back)[None], axis=2)
    ancestors = jnp.max(jax.nn.one_hot(up, n + 1, dtype=jnp.int32), 2) > 0
    principal = jnp.all(
      jnp.take_along_axis(ranks, path.reshape(batch, -1), 1).reshape(path.shape)
      == 0,
      axis=2,
    )
    return cls(
      parents=par,
      ranks=ranks,
      children=children,
      ancestors=ancestors,
      path_nodes=path,
      principal=principal,
    )


def is_dynamic(tree: Any) -> bool:
  return isinstance(tree, DynamicTree)


def _validate(paths: Any) -> None:
  if not paths:
    raise ValueError('a tree needs at least one node')
  if len(paths) > MAX_NODES:
    raise ValueError(f'a tree has at most {MAX_NODES} nodes, got {len(paths)}')
  seen = set()
  for p in paths:
    if not isinstance(p, tuple) or not p:
      raise ValueError(f'tree paths must be non-empty tuples, got {p!r}')
    if any(
      isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0
      for r in p
    ):
      raise ValueError(f'child ranks must be ints >= 0, got path {list(p)}')
    if p in seen:
      raise ValueError(f'tree path {list(p)} is listed twice')
    seen.add(p)
  for p in paths:
    if len(p) > 1 and p[:-1] not in seen:
      raise ValueError(
        f'tree path {list(p)} needs its parent {list(p[:-1])} in the tree'
      )
    if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in seen:
      raise ValueError(
        f'tree path {list(p)} needs its elder sibling '
        f'{list(p[:-1] + (p[-1] - 1,))} (child ranks are 0..k-1)'
      )
  if list(paths) != sorted(paths, key=lambda p: (len(p), p)):
    raise ValueError('tree paths must be sorted by depth, then by ranks')


def from_branching(branching: Sequence[int]) -> TreeShape:
  """Every node at depth d - 1 gets `branching[d - 1]` children."""
  paths, level = [], [()]
  for b in branching:
    level = [p + (r,) for p in level for r in range(b)]
    paths.extend(level)
  return TreeShape(tuple(paths))


def from_paths(paths: Sequence[Sequence[int]]) -> TreeShape:
  """Medusa's choices (any order; sorted breadth first here)."""
  tup = [tuple(int(r) for r in p) for p in paths]
  return TreeShape(tuple(sorted(tup, key=lambda p: (len(p), p))))


def chain(gamma: int) -> TreeShape:
  return from_branching((1,) * gamma)


def parse(tree: Any) -> TreeShape:
  """A `TreeShape` from what `generate(tree=...)` accepts (not 'auto').

  Raises:
    ValueError: naming what is wrong with `tree`.
  """
  if isinstance(tree, TreeShape):
    return tree
  if isinstance(tree, (str, bytes)) or not isinstance(tree, Sequence):
    raise ValueError(
      "tree must be a list of child-rank paths, a branching tuple or 'auto', "
      f'got {tree!r}'
    )
  if not tree:
    raise ValueError('tree must not be empty')
  if all(isinstance(b, (int, np.integer)) for b in tree):
    if any(isinstance(b, bool) or b < 1 for b in tree):
      raise ValueError(f'branching factors must be ints >= 1, got {tree!r}')
    return from_branching(tuple(int(b) for b in tree))
  if not all(
    isinstance(p, Sequence) and not isinstance(p, (str, bytes)) for p in tree
  ):
    raise ValueError(
      'tree must be all ints (branching) or all paths (lists of ranks), '
      f'got {tree!r}'
    )
  for p in tree:
    if any(
      isinstance(r, bool) or not isinstance(r, (int, np.integer)) for r in p
    ):
      raise ValueError(f'child ranks must be ints, got path {list(p)!r}')
  return from_paths(tree)

"""Growing a token tree from a drafter's next-token logits.

Shared by the drafters that propose trees (`ModelDrafter`, `NGram`): a
drafter supplies the logits after the root and, level by level, after the
internal nodes of the previous level; `expand` draws every node's children.

Children of one node, in rank order (so a chain-shaped tree draws exactly
what the chain loop draws):
  * greedy: the top-k ids by logit (ties: lower id first), distinct;
  * sampling: draws without replacement from the sampler's distribution q:
    child 0 from q, child r from q with children 0..r-1 removed and
    renormalized (that renormalized q is the child's `q`). A child is not
    proposed (`valid` False) when no mass is left (e.g. top-k or top-p kept
    fewer ids than the node has children).

Keys: node u at depth d draws with the drafter's key for depth d
(`DraftContext.keys[:, d - 1]`), folded with u unless u lies on the
all-rank-0 path; every node's draw is independent of the verifier's.

Dynamic trees (`tree_shape.DynamicTree`, EAGLE-2 style; `expand` with one):
depth d has a static number of nodes L_d, and each row chooses their
parents from the draft's own confidence. A node's cumulative confidence
c_u is the product, along its path, of the draft's probability of each
token (the sampler's q; greedy: the temperature-1 softmax). A candidate
child slot (u, r), u at depth d - 1 and r < W, scores c_u times the r-th
largest probability of u's distribution, known before any child of u is
drawn; the L_d best slots (ties: lower u, then lower r) give each u its
k_u children, ranks 0..k_u - 1, and those children are then drawn exactly
as a static tree's (above: top-k, or draws without replacement in rank
order), with keys of their own (u's place in its level and r). So which
nodes a row gets depends only on the draft's distributions and its draws
at shallower depths, never on a node's own draw or on the verifier's:
the condition under which recursive rejection is exact for any shape
(`tree/verification.py`, docs/guarantees.md). EAGLE-2's last step, keeping
the N drawn nodes of highest c over all depths, would read each node's own
draw (and, sampling without replacement, its elder siblings'), which
biases what is kept at t > 0; here the per-depth choice is that rerank,
made over the slots before their draws.
"""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spec_decode.core import sampling
from spec_decode.core.drafter import TreeProposal
from spec_decode.core.tree_shape import DynamicTree
from spec_decode.core.tree_shape import RowTreeAttention
from spec_decode.core.tree_shape import TreeShape

_MASS_FLOOR = 1e-12


def fold_node_keys(
  shape, depth_keys: jax.Array, principal: jax.Array | None = None
) -> jax.Array:
  """Keys `[B, N]` of nodes 1..N from per-depth keys `[B, D]`.

  `principal`: `[B, N]` which nodes lie on the all-rank-0 path, for a
  dynamic tree (default: the static `shape`'s).
  """
  per_node = depth_keys[:, shape.depths[1:] - 1]
  ids = jnp.arange(1, shape.num_nodes + 1, dtype=jnp.uint32)
  folded = jax.vmap(jax.vmap(jax.random.fold_in))(
    per_node, jnp.broadcast_to(ids, per_node.shape)
  )
  if principal is None:
    principal = jnp.asarray(shape.principal[1:])[None]
  principal = principal[..., None]
  return jax.random.wrap_key_data(
    jnp.where(
      principal,
      jax.random.key_data(per_node),
      jax.random.key_data(folded),
    ),
    impl=jax.random.key_impl(depth_keys),
  )


def draw_children(
  sampler: sampling.Sampler, logits: jax.Array, keys: jax.Array
) -> tuple[jax.Array, jax.Array | None, jax.Array]:
  """k children of each of R parents (module docstring).

  Args:
    sampler: the loop's sampler.
    logits: `[R, V]` the drafter's logits after each parent.
    keys: `[R, k]` one key per child.

  Returns:
    tokens `[R, k] int32`, q `[R, k, V]` (None when greedy), valid `[R, k]`.
  """
  k = keys.shape[1]
  rows = jnp.arange(logits.shape[0])
  tokens, qs, valid = [], [], []
  if sampler.is_greedy:
    cur = logits.astype(jnp.float32)
    for _ in range(k):
      x = sampling.argmax(cur)
      valid.append(cur[rows, x] > -jnp.inf)
      tokens.append(x)
      cur = cur.at[rows, x].set(-jnp.inf)
    return jnp.stack(tokens, 1), None, jnp.stack(valid, 1)
  probs = sampler.probs(logits)
  for r in range(k):
    if r == 0:
      q = probs  # Exactly the chain loop's draw.
      ok = jnp.ones(rows.shape, bool)
    else:
      mass = jnp.sum(probs, axis=-1, keepdims=True)
      ok = mass[:, 0] > _MASS_FLOOR
      q = probs / jnp.maximum(mass, _MASS_FLOOR)
    x = jax.vmap(sampling.sample)(keys[:, r], q)
    tokens.append(x)
    qs.append(q)
    valid.append(ok)
    probs = probs.at[rows, x].set(0.0)
  return jnp.stack(tokens, 1), jnp.stack(qs, 1), jnp.stack(valid, 1)


@dataclasses.dataclass(frozen=True)
class Level:
  """The nodes of one depth that a drafter's `level_logits` feeds (their
  children come next).

  Attributes:
    depth: d >= 1, the fed nodes' depth.
    fed: `[T]` their node ids (static).
    attention: their draft call's `TreeAttention` (a static tree's
      `draft_attention`) or `RowTreeAttention` (a dynamic tree: all nodes of
      depths 1..d in scratch slots in node-id order, the fed ones last).
    parents: `[T]` (static) or `[B, T]` their parents' node ids.
    paths: `[T, d]` (static) or `[B, T, d]` the node ids of each fed node's
      path, depth 1 first.
  """

  depth: int
  fed: np.ndarray
  attention: object
  parents: object
  paths: object

  def at_parents(self, x: jax.Array) -> jax.Array:
    """`x [B, N + 1, ...]` at the fed nodes' parents: `[B, T, ...]`."""
    return _gather_nodes(x, self.parents)

  def path_tokens(self, tokens: jax.Array) -> jax.Array:
    """The tokens `[B, T, d]` of each fed node's path."""
    batch, t = tokens.shape[0], len(self.fed)
    flat = _gather_nodes(tokens, _flat_ids(self.paths, t * self.depth))
    return flat.reshape(batch, t, self.depth)


def _flat_ids(ids, size: int):
  if isinstance(ids, np.ndarray):
    return ids.reshape(size)
  return ids.reshape(ids.shape[0], size)


def _gather_nodes(x: jax.Array, ids) -> jax.Array:
  """`x [B, N + 1, ...]` at node ids `[T]` (static) or `[B, T]`."""
  if isinstance(ids, np.ndarray):
    return x[:, ids]
  idx = ids.reshape(ids.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


# `level_logits(level: Level, tokens [B, N + 1], carry)` -> (logits
# [B, T, V] after each fed node, carry).
LevelLogits = Callable


def expand(
  shape: TreeShape,
  sampler: sampling.Sampler,
  root_logits: jax.Array,
  level_logits: LevelLogits,
  carry,
  depth_keys: jax.Array,
) -> tuple[TreeProposal, object]:
  """Draws every node of `shape`, level by level.

  Args:
    shape: the tree.
    sampler: the loop's sampler.
    root_logits: `[B, V]` the drafter's logits after the root.
    level_logits: gives the logits after the fed nodes of a depth (a
      `Level`: a static tree's internal nodes there, a dynamic tree's
      every node there), from the tokens drawn so far (`[B, N + 1]`,
      column 0 the root, unused).
    carry: threaded through `level_logits` (e.g. a model's decode state).
    depth_keys: `[B, D]` the drafter's keys per depth.

  Returns:
    The `TreeProposal` and the final carry.
  """
  if isinstance(shape, DynamicTree):
    return _expand_dynamic(
      shape, sampler, root_logits, level_logits, carry, depth_keys
    )
  batch, vocab = root_logits.shape
  n = shape.num_nodes
  keys = fold_node_keys(shape, depth_keys)
  tokens = jnp.zeros((batch, n + 1), jnp.int32)
  valid = jnp.ones((batch, n + 1), bool)
  q = None if sampler.is_greedy else jnp.zeros((batch, n + 1, vocab))
  for depth in range(1, shape.depth + 1):
    if depth == 1:
      parents = np.zeros((1,), np.int32)
      logits = root_logits[:, None]
    else:
      fed, attention = shape.draft_attention(depth - 1)
      parents = fed
      level = Level(
        depth=depth - 1,
        fed=fed,
        attention=attention,
        parents=shape.parents[fed],
        paths=shape.path_nodes[fed][:, 1:depth],
      )
      logits, carry = level_logits(level, tokens, carry)
    kids = shape.children[parents]  # [T, W] static
    width = int((kids >= 0).sum(1).max())
    kids = kids[:, :width]
    has = kids >= 0
    safe = kids.clip(0)
    num_par = kids.shape[0]
    child_keys = keys[:, (safe - 1).clip(0).reshape(-1)].reshape(
      batch * num_par, width
    )
    toks, qs, ok = draw_children(
      sampler, logits.reshape(batch * num_par, vocab), child_keys
    )
    toks = toks.reshape(batch, num_par, width)
    ok = ok.reshape(batch, num_par, width)
    ok &= valid[:, parents][..., None]
    flat = safe[has]  # Static ids of the children that exist.
    tokens = tokens.at[:, flat].set(toks[:, has])
    valid = valid.at[:, flat].set(ok[:, has])
    if q is not None:
      qs = qs.reshape(batch, num_par, width, vocab)
      q = q.at[:, flat].set(qs[:, has])
  return (
    TreeProposal(
      tokens=tokens[:, 1:],
      q=None if q is None else q[:, 1:],
      valid=valid[:, 1:],
    ),
    carry,
  )


def _allocate(prior: jax.Array, size: int) -> tuple[jax.Array, jax.Array]:
  """Parents and ranks of a level's `size` nodes (module docstring).

  Args:
    prior: `[B, T, W]` the score of rank r under fed node t, non-increasing
      in r.
    size: L, the level's nodes.

  Returns:
    `[B, L]` each node's parent (its place t among the fed nodes) and rank,
    ordered by parent, then rank.
  """
  batch, t, w = prior.shape
  _, pick = lax.top_k(prior.reshape(batch, t * w), size)
  count = jnp.sum(jax.nn.one_hot(pick // w, t, dtype=jnp.int32), axis=1)
  end = jnp.cumsum(count, axis=1)  # [B, T]
  slots = jnp.arange(size)
  parent = jnp.sum(end[:, None, :] <= slots[None, :, None], axis=2)
  start = jnp.take_along_axis(end - count, parent, axis=1)
  return parent.astype(jnp.int32), (slots[None] - start).astype(jnp.int32)


def _slot_keys(depth_key, principal, width: int) -> jax.Array:
  """Keys `[B, T, W]` of rank r under fed node t: the depth's key folded
  with t W + r + 1, unfolded for rank 0 under a principal node (so a
  chain-shaped dynamic tree draws what the chain loop draws)."""
  batch, t = principal.shape
  ids = jnp.arange(1, t * width + 1, dtype=jnp.uint32).reshape(t, width)
  folded = jax.vmap(
    lambda k: jax.vmap(jax.vmap(lambda i: jax.random.fold_in(k, i)))(ids)
  )(depth_key)
  plain = jax.random.key_data(depth_key)[:, None, None]
  unfolded = principal[:, :, None] & (jnp.arange(width) == 0)[None, None]
  data = jnp.where(unfolded[..., None], plain, jax.random.key_data(folded))
  return jax.random.wrap_key_data(data, impl=jax.random.key_impl(depth_key))


def _draw_slots(sampler, logits, top_ids, parent, rank, keys):
  """The level's tokens `[B, L]`, q `[B, L, V]` (None when greedy) and
  valid `[B, L]`: rank r under parent t is the static tree's rank-r child
  of t (`draw_children`)."""
  batch, t, vocab = logits.shape
  if sampler.is_greedy:
    w = top_ids.shape[2]
    x = jnp.take_along_axis(
      top_ids.reshape(batch, t * w), parent * w + rank, axis=1
    )
    picked = jnp.take_along_axis(
      _gather_nodes(logits, parent), x[..., None], axis=2
    )[..., 0]
    return x, None, picked > -jnp.inf
  probs = sampler.probs(logits)
  size = parent.shape[1]
  tokens = jnp.zeros((batch, size), jnp.int32)
  valid = jnp.zeros((batch, size), bool)
  q = jnp.zeros((batch, size, vocab), jnp.float32)
  for r in range(min(keys.shape[2], size)):
    if r == 0:
      q_r, ok = probs, jnp.ones((batch, t), bool)  # The chain's draw.
    else:
      mass = jnp.sum(probs, axis=-1)
      ok = mass > _MASS_FLOOR
      q_r = probs / jnp.maximum(mass, _MASS_FLOOR)[..., None]
    x = jax.vmap(sampling.sample)(
      keys[:, :, r].reshape(-1), q_r.reshape(batch * t, vocab)
    ).reshape(batch, t)
    here = rank == r
    tokens = jnp.where(here, jnp.take_along_axis(x, parent, 1), tokens)
    valid = jnp.where(here, jnp.take_along_axis(ok, parent, 1), valid)
    q = jnp.where(here[..., None], _gather_nodes(q_r, parent), q)
    probs = probs * (1.0 - jax.nn.one_hot(x, vocab, dtype=probs.dtype))
  return tokens, q, valid


def _expand_dynamic(
  tree: DynamicTree,
  sampler: sampling.Sampler,
  root_logits: jax.Array,
  level_logits: LevelLogits,
  carry,
  depth_keys: jax.Array,
) -> tuple[TreeProposal, object]:
  """`expand` for a dynamic tree (module docstring); the proposal carries
  every node's parent."""
  batch, vocab = root_logits.shape
  n, w = tree.num_nodes, tree.width
  tokens = jnp.zeros((batch, n + 1), jnp.int32)
  valid = jnp.ones((batch, n + 1), bool)
  parents = jnp.zeros((batch, n + 1), jnp.int32)
  conf = jnp.ones((batch, n + 1), jnp.float32)
  principal = jnp.ones((batch, n + 1), bool)
  ancestors = jnp.broadcast_to(
    jnp.eye(n + 1, dtype=bool), (batch, n + 1, n + 1)
  )
  paths = jnp.zeros((batch, n + 1, tree.depth), jnp.int32)
  q = None if sampler.is_greedy else jnp.zeros((batch, n + 1, vocab))
  fed, logits = np.zeros((1,), np.int32), root_logits[:, None]
  for depth in range(1, tree.depth + 1):
    if depth > 1:
      fed = tree.level_ids(depth - 1)
      upto = np.arange(1, int(fed[-1]) + 1)
      level = Level(
        depth=depth - 1,
        fed=fed,
        attention=RowTreeAttention(
          positions=tuple(int(x) - 1 for x in tree.depths[upto]),
          mask=ancestors[:, fed][:, :, upto],
          offset=len(upto) - len(fed),
        ),
        parents=parents[:, fed],
        paths=paths[:, fed, : depth - 1],
      )
      logits, carry = level_logits(level, tokens, carry)
    logits = logits.astype(jnp.float32)
    ids = tree.level_ids(depth)
    score = (
      jax.nn.softmax(logits) if sampler.is_greedy else sampler.probs(logits)
    )
    k = min(w, vocab)
    top_p, top_ids = lax.top_k(logits if sampler.is_greedy else score, k)
    if sampler.is_greedy:
      top_p = jnp.take_along_axis(score, top_ids, axis=2)
    live = conf[:, fed] * valid[:, fed]
    parent, rank = _allocate(live[..., None] * top_p, len(ids))
    keys = None
    if not sampler.is_greedy:
      keys = _slot_keys(depth_keys[:, depth - 1], principal[:, fed], k)
    x, q_l, ok = _draw_slots(sampler, logits, top_ids, parent, rank, keys)
    node = jnp.asarray(fed)[parent]  # [B, L] parents' node ids
    ok &= jnp.take_along_axis(valid, node, 1)
    p_x = jnp.take_along_axis(_gather_nodes(score, parent), x[..., None], 2)
    tokens = tokens.at[:, ids].set(x)
    valid = valid.at[:, ids].set(ok)
    parents = parents.at[:, ids].set(node)
    conf = conf.at[:, ids].set(
      jnp.take_along_axis(conf, node, 1) * p_x[..., 0] * ok
    )
    principal = principal.at[:, ids].set(
      jnp.take_along_axis(principal, node, 1) & (rank == 0)
    )
    own = jnp.asarray(np.eye(n + 1, dtype=bool)[ids])[None]
    ancestors = ancestors.at[:, ids].set(own | _gather_nodes(ancestors, node))
    paths = paths.at[:, ids].set(
      _gather_nodes(paths, node).at[:, :, depth - 1].set(jnp.asarray(ids))
    )
    if q is not None:
      q = q.at[:, ids].set(q_l)
  return (
    TreeProposal(
      tokens=tokens[:, 1:],
      q=None if q is None else q[:, 1:],
      valid=valid[:, 1:],
      parents=parents[:, 1:],
    ),
    carry,
  )

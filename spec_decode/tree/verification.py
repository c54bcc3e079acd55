"""Exact verification of a token tree: pure functions over fixed logits.

Shapes: `B` rows, `N` proposed nodes (node ids 1..N; 0 is the root, the
newest input), `D` depth, `W` most children of a node, `V` vocabulary.

Greedy (argmax): walk down from the root; at node u accept the child whose
token is the target's argmax after u's path (siblings are distinct, so at
most one matches). The next token is the target's argmax at the last
accepted node: exactly what argmax decoding emits.

Sampling: recursive rejection over siblings (SpecInfer's multi-step
speculative sampling, in the general form of Sequoia / EAGLE-2). Standing
at node u with target distribution p' = p_u, its children c_1..c_k are
tried in rank order; child i was drawn from `q_i`, the drafter's
distribution given u's path and the siblings drawn before it (q_u itself
for independent draws, q_u without c_1..c_{i-1} renormalized for draws
without replacement, a point mass for a deterministic proposal). Child i
is accepted when `r_i q_i(x_i) < p'(x_i)`; then the walk moves to it with
p' = p_{c_i}. Otherwise `p' <- norm(max(0, p' - q_i))` and the next sibling
is tried. When no child is accepted (or u has none) the next token is drawn
from p'. Why the output is p_u exactly (induction over the siblings left):
one step returns x_i with probability min(q_i, p')(x), and otherwise leaves
a residual norm(max(0, p' - q_i)) that does not depend on which x_i was
drawn; by induction the remaining siblings then return a draw of that
residual whatever their own q's are, as long as each child is drawn from
its q given everything before it and independently of the verifier's
uniforms. Together: min(q_i, p') + (1 - beta_i) * residual = p'. Down the
tree the same argument holds at every accepted node, whose subtree was
drawn from the drafter given that node's path. docs/decoding.md has the
full statement.

Dynamic trees (`core.tree_shape.DynamicTree`): the same walk over each
row's own tables (`TreeTables`, from the parents its drafter chose); the
argument above holds for any shape that depends on nothing the verifier
draws and on no node's own draw (`core.tree_draft`).

Keys: node u at depth d uses the row's keys for output position n + d
(`verify_block`'s purposes), folded once more with u's id unless u lies on
the all-rank-0 path; so a chain-shaped tree draws exactly what the chain
loop draws.
"""

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.core import sampling
from spec_decode.core import tree_draft
from spec_decode.core import verified_block
from spec_decode.core.tree_shape import TreeShape
from spec_decode.core.tree_shape import TreeTables

# As in `verify.next_distribution`: below this mass a residual is empty.
_RESIDUAL_FLOOR = 1e-12


@flax.struct.dataclass(kw_only=True)
class TreeVerifyResult:
  """Outcome of one tree verification.

  Attributes:
    accepted: `[B] int32` in [0, D], tokens accepted (the depth of `node`).
    node: `[B] int32` the last accepted node (0: none accepted).
    path: `[B, D + 1] int32` the nodes from the root to `node`, then `node`
      repeated (`TreeShape.path_nodes`).
    next_token: `[B] int32` the target's token after the accepted path (a
      residual draw, or a draw from p at `node` when nothing was rejected
      there).
    tried: `[B, N] bool` node i + 1 was tested (its parent accepted, its
      elder siblings rejected, and it was proposed).
    beta: `[B, D] float32` at depth d: sum_x min(p, q) of the rank-0 child
      of the node reached at depth d - 1 (greedy: 1 where its token is the
      target's argmax); the chain loop's beta. Meaningful where that child
      was tried.
  """

  accepted: jax.Array
  node: jax.Array
  path: jax.Array
  next_token: jax.Array
  tried: jax.Array
  beta: jax.Array

  def accepted_nodes(self, num_nodes: int) -> jax.Array:
    """`[B, N] bool` the nodes on the accepted path (the root excluded)."""
    hit = jax.nn.one_hot(self.path[:, 1:], num_nodes + 1, dtype=jnp.int32)
    on_path = jnp.max(hit, axis=1)[:, 1:] > 0
    return on_path


def node_keys(
  shape: TreeShape,
  row_keys: jax.Array,
  length: jax.Array,
  purpose: int,
  principal: jax.Array | None = None,
) -> jax.Array:
  """Keys `[B, N]` of the nodes of a tree rooted after `length [B]` tokens.

  Node u at depth d gets `fold_in(fold_in(row_key, n + d), purpose)`, folded
  with u once more unless it is on the all-rank-0 path (`principal [B, N]`
  for a dynamic tree).
  """
  positions = length[:, None] + 1 + jnp.arange(shape.depth)[None]
  return tree_draft.fold_node_keys(
    shape, sampling.position_keys(row_keys, positions, purpose), principal
  )


def _with_root(x: jax.Array, root_value) -> jax.Array:
  """Prepends a root column to `x [B, N, ...]`."""
  pad = jnp.full(x.shape[:1] + (1,) + x.shape[2:], root_value, x.dtype)
  return jnp.concatenate([pad, x], axis=1)


def verify_greedy(
  shape: TreeShape,
  target_tokens: jax.Array,
  tokens: jax.Array,
  valid: jax.Array,
  tables: TreeTables | None = None,
) -> TreeVerifyResult:
  """Argmax verification.

  Args:
    shape: the tree (a `TreeShape`, or a `DynamicTree` with `tables`).
    target_tokens: `[B, N + 1]` the target's argmax after each node's path
      (node 0: after the root).
    tokens: `[B, N]` proposed tokens of nodes 1..N.
    valid: `[B, N] bool` which nodes were proposed.
    tables: the rows' tables (default: the static shape's).
  """
  batch = tokens.shape[0]
  rows = jnp.arange(batch)
  tok = _with_root(tokens, 0)
  ok = _with_root(valid, True)
  tables = tables or TreeTables.of_shape(shape, batch)
  children = tables.children
  cur = jnp.zeros((batch,), jnp.int32)
  alive = jnp.ones((batch,), bool)
  tried = jnp.zeros((batch, shape.num_nodes + 1), bool)
  betas = []
  for _ in range(shape.depth):
    want = target_tokens[rows, cur]
    kids = children[rows, cur]
    found = jnp.zeros((batch,), bool)
    nxt = cur
    beta0 = jnp.zeros((batch,), jnp.float32)
    for r in range(children.shape[2]):
      c = kids[:, r]
      safe = jnp.maximum(c, 0)
      test = alive & ~found & (c > 0) & ok[rows, safe]
      match = test & (tok[rows, safe] == want)
      tried |= test[:, None] & (
        jnp.arange(shape.num_nodes + 1) == safe[:, None]
      )
      if r == 0:
        beta0 = (tok[rows, safe] == want).astype(jnp.float32)
      nxt = jnp.where(match, c, nxt)
      found |= match
    betas.append(beta0)
    alive &= found
    cur = nxt
  accepted = jnp.asarray(shape.depths)[cur]
  return TreeVerifyResult(
    accepted=accepted,
    node=cur,
    path=tables.path_nodes[rows, cur],
    next_token=target_tokens[rows, cur],
    tried=tried[:, 1:],
    beta=jnp.stack(betas, axis=1),
  )


def verify_sampling(
  shape: TreeShape,
  p: jax.Array,
  q: jax.Array,
  tokens: jax.Array,
  valid: jax.Array,
  uniforms: jax.Array,
  residual_keys: jax.Array,
  bonus_keys: jax.Array,
  tables: TreeTables | None = None,
) -> TreeVerifyResult:
  """Recursive rejection over siblings (module docstring).

  Args:
    shape: the tree (a `TreeShape`, or a `DynamicTree` with `tables`).
    p: `[B, N + 1, V]` target distributions after each node's path.
    q: `[B, N, V]` the distribution each node's token was drawn from.
    tokens: `[B, N]` proposed tokens.
    valid: `[B, N] bool` which nodes were proposed (others are skipped).
    uniforms: `[B, N]` in [0, 1), one per node.
    residual_keys: `[B, D + 1]` key of the final draw after a = 0..D
      accepted tokens when something was rejected or not proposed there.
    bonus_keys: `[B, D + 1]`; entry D draws after a full-depth path.
    tables: the rows' tables (default: the static shape's).
  """
  batch = tokens.shape[0]
  rows = jnp.arange(batch)
  tok = _with_root(tokens, 0)
  ok = _with_root(valid, True)
  u_all = _with_root(uniforms, 0.0)
  tables = tables or TreeTables.of_shape(shape, batch)
  children = tables.children
  cur = jnp.zeros((batch,), jnp.int32)
  alive = jnp.ones((batch,), bool)
  pcur = p[:, 0]
  tried = jnp.zeros((batch, shape.num_nodes + 1), bool)
  betas = []
  for _ in range(shape.depth):
    kids = children[rows, cur]
    found = jnp.zeros((batch,), bool)
    nxt = cur
    beta0 = jnp.zeros((batch,), jnp.float32)
    for r in range(children.shape[2]):
      c = kids[:, r]
      safe = jnp.maximum(c, 0)
      test = alive & ~found & (c > 0) & ok[rows, safe]
      x = tok[rows, safe]
      q_i = q[rows, jnp.maximum(safe - 1, 0)]
      p_x = pcur[rows, x]
      q_x = q_i[rows, x]
      accept = test & (u_all[rows, safe] * (1.0 * q_x) < p_x)
      if r == 0:
        beta0 = jnp.sum(jnp.minimum(pcur, q_i), axis=-1)
      residual = jnp.maximum(pcur - 1.0 * q_i, 0.0)
      mass = jnp.sum(residual, axis=-1, keepdims=True)
      residual = jnp.where(
        mass > _RESIDUAL_FLOOR,
        residual / jnp.maximum(mass, _RESIDUAL_FLOOR),
        pcur,
      )
      pcur = jnp.where((test & ~accept)[:, None], residual, pcur)
      tried |= test[:, None] & (
        jnp.arange(shape.num_nodes + 1) == safe[:, None]
      )
      nxt = jnp.where(accept, c, nxt)
      found |= accept
    betas.append(beta0)
    pcur = jnp.where(found[:, None], p[rows, nxt], pcur)
    alive &= found
    cur = nxt
  accepted = jnp.asarray(shape.depths)[cur]
  use_bonus = (accepted == shape.depth)[:, None]
  key_data = jnp.where(
    use_bonus,
    jax.random.key_data(bonus_keys[rows, accepted]),
    jax.random.key_data(residual_keys[rows, accepted]),
  )
  keys = jax.random.wrap_key_data(
    key_data, impl=jax.random.key_impl(bonus_keys)
  )
  return TreeVerifyResult(
    accepted=accepted,
    node=cur,
    path=tables.path_nodes[rows, cur],
    next_token=jax.vmap(sampling.sample)(keys, pcur),
    tried=tried[:, 1:],
    beta=jnp.stack(betas, axis=1),
  )


def verify_tree(
  shape: TreeShape,
  sampler: sampling.Sampler,
  logits: jax.Array,
  tokens: jax.Array,
  q: jax.Array | None,
  valid: jax.Array,
  row_keys: jax.Array,
  length: jax.Array,
  tables: TreeTables | None = None,
) -> TreeVerifyResult:
  """Verifies a proposal against the target's logits `[B, N + 1, V]`.

  The draws use the row keys at output positions n + 1.. (`length` = n):
  node uniforms with `verified_block.ACCEPT`, the final draw with
  `RESIDUAL` at n + a + 1, or `SAMPLE` at n + D + 1 after a full-depth path.
  `tables`: the rows' tables (a dynamic tree's; default the shape's).
  """
  if sampler.is_greedy:
    return verify_greedy(shape, sampling.argmax(logits), tokens, valid, tables)
  if q is None:
    q = jax.nn.one_hot(tokens, logits.shape[-1], dtype=jnp.float32)
  uniforms = jax.vmap(
    jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))
  )(
    node_keys(
      shape,
      row_keys,
      length,
      verified_block.ACCEPT,
      None if tables is None else tables.principal[:, 1:],
    )
  )
  positions = length[:, None] + 1 + jnp.arange(shape.depth + 1)[None]
  return verify_sampling(
    shape,
    sampler.probs(logits),
    q,
    tokens,
    valid,
    uniforms,
    sampling.position_keys(row_keys, positions, verified_block.RESIDUAL),
    sampling.position_keys(row_keys, positions, verified_block.SAMPLE),
    tables,
  )

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
"""

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.core import sampling
from spec_decode.core.drafter import TreeProposal
from spec_decode.core.tree_shape import TreeShape

_MASS_FLOOR = 1e-12


def fold_node_keys(shape: TreeShape, depth_keys: jax.Array) -> jax.Array:
  """Keys `[B, N]` of nodes 1..N from per-depth keys `[B, D]`."""
  per_node = depth_keys[:, shape.depths[1:] - 1]
  ids = jnp.arange(1, shape.num_nodes + 1, dtype=jnp.uint32)
  folded = jax.vmap(jax.vmap(jax.random.fold_in))(
    per_node, jnp.broadcast_to(ids, per_node.shape)
  )
  principal = jnp.asarray(shape.principal[1:])[None, :, None]
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


# `level_logits(depth, fed [T] node ids, tokens [B, N + 1], carry)` ->
# (logits [B, T, V] after each fed node, carry).
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
    level_logits: gives the logits after the internal nodes of a depth
      (`shape.draft_attention(depth)[0]`), from the tokens drawn so far
      (`[B, N + 1]`, column 0 the root, unused).
    carry: threaded through `level_logits` (e.g. a model's decode state).
    depth_keys: `[B, D]` the drafter's keys per depth.

  Returns:
    The `TreeProposal` and the final carry.
  """
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
      fed, _ = shape.draft_attention(depth - 1)
      parents = fed
      logits, carry = level_logits(depth - 1, fed, tokens, carry)
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

"""Tree verification on fixed distributions (no models).

Exactness test (sampling). Tree (2, 2): width 2 at two depths, 6 nodes.
The target is a bigram table: p after the root is P0, after a node with
token x it is T[x]. The drafter draws each node's two children without
replacement from its own bigram table Q (rank 1 from Q with rank 0 removed,
renormalized, which is the q it reports). Over B = 60,000 independent
verifications (one batch), the emitted tokens (accepted path + next token)
must follow the target: the first token ~ P0, and each later token given
the one before ~ T[previous]. One G-test over all these cells (first-token
cells, and for every previous token the next-token cells; expected counts
from the observed number of conditioning events), degrees of freedom =
cells - groups; it fails below p = 1e-3, its false-alarm rate.

Negative control: the same proposals, but the rank-1 child reports q
without removing its elder sibling (a plausible bug: treating draws
without replacement as independent). The same test at the same B must
reject it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from spec_decode.core import sampling
from spec_decode.core import tree_shape as tree_lib
from spec_decode.tree import verification as tree_verification

V, B = 5, 60_000
FALSE_ALARM = 1e-3
SHAPE = tree_lib.from_branching((2, 2))


def _tables(seed):
  rng = np.random.default_rng(seed)
  p0 = rng.dirichlet(np.ones(V))
  t = rng.dirichlet(np.ones(V), size=V)
  # The draft is confidently different from the target: rejections, and
  # accepted rank-1 siblings, are both common.
  q0 = rng.dirichlet(np.full(V, 0.5))
  q = rng.dirichlet(np.full(V, 0.5), size=V)
  return p0, t, q0, q


def _propose(q0, q, rng, honest):
  """Tokens `[B, 6]` and the q each reports `[B, 6, V]`."""
  tokens = np.zeros((B, SHAPE.num_nodes + 1), np.int64)
  qs = np.zeros((B, SHAPE.num_nodes + 1, V))
  dist = {0: np.broadcast_to(q0, (B, V))}
  for u in range(SHAPE.num_nodes + 1):
    kids = [c for c in SHAPE.children[u] if c > 0]
    if not kids:
      continue
    base = dist[u] if u == 0 else q[tokens[:, u]]
    gumbel = np.log(base) + rng.gumbel(size=base.shape)
    order = np.argsort(-gumbel, axis=1)  # Without replacement.
    for r, c in enumerate(kids):
      tokens[:, c] = order[:, r]
      if r == 0 or not honest:
        qs[:, c] = base
      else:
        rest = base.copy()
        rest[np.arange(B), order[:, 0]] = 0.0
        qs[:, c] = rest / rest.sum(1, keepdims=True)
  return tokens, qs


def _verify(p0, t, tokens, qs, seed):
  rng = np.random.default_rng(seed + 1)
  p = np.concatenate([p0[None, None].repeat(B, 0), t[tokens[:, 1:]]], 1)
  keys = jax.random.split(jax.random.key(seed), 2 * B * (SHAPE.depth + 1))
  keys = keys.reshape(2, B, SHAPE.depth + 1)
  res = jax.jit(tree_verification.verify_sampling, static_argnums=0)(
    SHAPE,
    jnp.asarray(p, jnp.float32),
    jnp.asarray(qs[:, 1:], jnp.float32),
    jnp.asarray(tokens[:, 1:], jnp.int32),
    jnp.ones((B, SHAPE.num_nodes), bool),
    jnp.asarray(rng.random((B, SHAPE.num_nodes)), jnp.float32),
    keys[0],
    keys[1],
  )
  return jax.tree.map(np.asarray, res)


def _emitted(res, tokens):
  """Per row: the accepted path's tokens, then the next token."""
  out = []
  for b in range(B):
    a = res.accepted[b]
    path = res.path[b, 1 : a + 1]
    out.append(list(tokens[b, path]) + [int(res.next_token[b])])
  return out


def _g_test(seqs, p0, t) -> float:
  first = np.zeros(V)
  pairs = np.zeros((V, V))
  for s in seqs:
    first[s[0]] += 1
    for x, y in zip(s[:-1], s[1:], strict=True):
      pairs[x, y] += 1
  obs = [first]
  exp = [first.sum() * p0]
  for x in range(V):
    if pairs[x].sum() > 0:
      obs.append(pairs[x])
      exp.append(pairs[x].sum() * t[x])
  obs, exp = np.concatenate(obs), np.concatenate(exp)
  assert np.all(exp[obs > 0] > 0), 'a token with target probability 0'
  keep = exp > 0
  obs, exp = obs[keep], exp[keep]
  nz = obs > 0
  g = 2.0 * np.sum(obs[nz] * np.log(obs[nz] / exp[nz]))
  dof = keep.sum() - (1 + sum(pairs[x].sum() > 0 for x in range(V)))
  return float(stats.chi2.sf(g, dof))


@pytest.fixture(scope='module')
def tables():
  return _tables(0)


def test_recursive_rejection_samples_the_target(tables):
  p0, t, q0, q = tables
  tokens, qs = _propose(q0, q, np.random.default_rng(1), honest=True)
  res = _verify(p0, t, tokens, qs, seed=2)
  # Both ranks are accepted at both depths, and rows stop at every depth.
  on_path = res.accepted_nodes(SHAPE.num_nodes)
  assert on_path[:, 1].mean() > 0.05 and on_path[:, 3].mean() > 0.02
  assert set(np.unique(res.accepted)) == {0, 1, 2}
  assert _g_test(_emitted(res, tokens), p0, t) > FALSE_ALARM


def test_negative_control_sibling_q_without_removal_is_detected(tables):
  p0, t, q0, q = tables
  tokens, qs = _propose(q0, q, np.random.default_rng(1), honest=False)
  res = _verify(p0, t, tokens, qs, seed=2)
  assert _g_test(_emitted(res, tokens), p0, t) < FALSE_ALARM


def test_greedy_walks_the_argmax_path():
  shape = tree_lib.from_branching((2, 2))  # Nodes 1, 2; 3-4 under 1; 5-6.
  # Target argmax after nodes 0..6.
  target = jnp.asarray([[7, 9, 4, 1, 1, 1, 8], [7, 9, 4, 1, 1, 1, 8]])
  tokens = jnp.asarray([[6, 7, 3, 9, 5, 4], [6, 7, 3, 9, 5, 4]])
  valid = jnp.ones((2, 6), bool).at[1, 5].set(False)
  res = tree_verification.verify_greedy(shape, target, tokens, valid)
  # Row 0: rank 1 (node 2, token 7) matches 7; under it node 6 (token 4)
  # matches the argmax 4 after node 2; next token: argmax after node 6.
  np.testing.assert_array_equal(res.accepted, [2, 1])
  np.testing.assert_array_equal(res.node, [6, 2])
  np.testing.assert_array_equal(res.path[0], [0, 2, 6])
  np.testing.assert_array_equal(res.next_token, [8, 4])
  # Row 1: node 6 was not proposed, so node 2 is the end.
  np.testing.assert_array_equal(
    res.tried[0], [True, True, False, False, True, True]
  )
  np.testing.assert_array_equal(
    res.tried[1], [True, True, False, False, True, False]
  )


def test_sampling_rejects_a_zero_probability_node_even_at_uniform_zero():
  shape = tree_lib.from_branching((2,))
  p = jnp.asarray([[[0.0, 1.0, 0.0], [1, 0, 0], [1, 0, 0]]], jnp.float32)
  q = jnp.asarray([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], jnp.float32)
  keys = jax.random.split(jax.random.key(0), 2).reshape(1, 2)
  res = tree_verification.verify_sampling(
    shape,
    p,
    q,
    jnp.asarray([[0, 1]]),
    jnp.ones((1, 2), bool),
    jnp.zeros((1, 2)),
    keys,
    keys,
  )
  # Node 1 (token 0, p = 0) rejected; node 2 (token 1, p' = 1) accepted.
  np.testing.assert_array_equal(res.node, [2])
  np.testing.assert_array_equal(res.next_token, [0])


def test_node_keys_follow_the_chain_on_the_principal_path():
  shape = tree_lib.from_branching((2, 1))
  row_keys = jax.random.split(jax.random.key(3), 2)
  length = jnp.asarray([4, 7])
  keys = tree_verification.node_keys(shape, row_keys, length, 1)
  chain = sampling.position_keys(
    row_keys, length[:, None] + 1 + jnp.arange(2)[None], 1
  )
  data = jax.random.key_data
  # Node 1 (rank 0, depth 1) and node 3 (its child) are the chain's keys.
  np.testing.assert_array_equal(data(keys[:, 0]), data(chain[:, 0]))
  np.testing.assert_array_equal(data(keys[:, 2]), data(chain[:, 1]))
  assert not np.array_equal(data(keys[:, 1]), data(chain[:, 0]))

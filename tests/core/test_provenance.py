"""core/provenance: the codes of a verified block, writing them, reading."""

import jax.numpy as jnp
import numpy as np

from spec_decode.core import provenance as prov

A, R, B = prov.ACCEPTED, prov.REPLACED, prov.BONUS
T, S = prov.TARGET, prov.START


def test_chain_block_codes_and_rejected_token():
  draft = jnp.array([[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]])
  accepted = jnp.array([0, 2, 3, 1])
  # Row 3 proposed one token (a draft that stopped early): all accepted.
  num = jnp.array([3, 3, 3, 1])
  codes, rejected = prov.chain_block(accepted, num, draft)
  np.testing.assert_array_equal(
    codes,
    [
      [R | S, R, R, R],
      [A | S, A, R, R],
      [A | S, A, A, B],
      [A | S, B, B, B],
    ],
  )
  np.testing.assert_array_equal(
    rejected, [[5, -1, -1, -1], [-1, -1, 7, -1], [-1] * 4, [-1] * 4]
  )


def test_record_writes_the_kept_entries_at_each_rows_position():
  rec = prov.Record.zeros(2, 8)
  codes = jnp.array([[A | S, A, B], [R | S, R, R]], jnp.int8)
  rejected = jnp.array([[-1, -1, -1], [9, -1, -1]])
  rec = rec.write(jnp.array([0, 3]), jnp.array([3, 1]), codes, rejected)
  np.testing.assert_array_equal(
    rec.codes, [[0, A | S, A, B, 0, 0, 0, 0], [0, 0, 0, 0, R | S, 0, 0, 0]]
  )
  np.testing.assert_array_equal(rec.rejected[1], [-1] * 4 + [9] + [-1] * 3)
  # A later block lands after the kept ones; nothing kept writes nothing.
  rec = rec.write(jnp.array([3, 4]), jnp.array([1, 0]), prov.target_block(2))
  np.testing.assert_array_equal(rec.codes[0, 4], T | S)
  np.testing.assert_array_equal(rec.codes[1, 5], 0)


def test_host_view_splits_iterations():
  rec = prov.Record.zeros(1, 8)
  rec = rec.write(
    jnp.array([0]),
    jnp.array([2]),
    jnp.array([[A | S, R]], jnp.int8),
    jnp.array([[-1, 4]]),
  )
  rec = rec.write(jnp.array([2]), jnp.array([1]), prov.target_block(1))
  p = prov.Provenance.of(rec, 5)
  assert p.codes.shape == (1, 5)
  assert p.kinds(0) == [A, R, T]
  assert p.iterations(0) == [[(0, A, -1), (1, R, 4)], [(2, T, -1)]]
  plain = prov.Provenance.plain(np.array([2, 0]), 3)
  assert plain.iterations(0) == [[(0, T, -1)], [(1, T, -1)]]
  assert plain.iterations(1) == []


def test_tree_block_codes_ranks_and_the_rejected_child():
  from spec_decode.core import tree_shape  # pylint: disable=g-import-not-at-top

  shape = tree_shape.from_branching((2, 1))  # 1:[0] 2:[1] 3:[0,0] 4:[1,0]
  # Per-row tables (a dynamic tree's differ by row).
  children = jnp.broadcast_to(shape.children, (3,) + shape.children.shape)
  ranks = jnp.broadcast_to(shape.ranks, (3,) + shape.ranks.shape)
  tokens = jnp.array([[11, 12, 13, 14]] * 3)
  # Row 0: node 2 (rank 1) accepted, its child 4 tried and rejected.
  # Row 1: nodes 1 and 3 accepted (a leaf: the bonus token).
  # Row 2: nothing accepted, both depth-1 nodes tried.
  path = jnp.array([[0, 2, 2], [0, 1, 3], [0, 0, 0]])
  tried = jnp.array(
    [
      [True, True, False, True],
      [True, False, True, False],
      [True] * 2 + [False] * 2,
    ]
  )
  codes, rejected, rank = prov.tree_block(
    jnp.array([1, 2, 0]), path, tried, tokens, children, ranks
  )
  np.testing.assert_array_equal(
    codes, [[A | S, R, R], [A | S, A, B], [R | S, R, R]]
  )
  np.testing.assert_array_equal(
    rejected, [[-1, 14, -1], [-1, -1, -1], [11, -1, -1]]
  )
  np.testing.assert_array_equal(rank, [[1, 0, 0], [0, 0, 0], [0, 0, 0]])

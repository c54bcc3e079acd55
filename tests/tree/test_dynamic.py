"""Dynamic trees (EAGLE-2 style): the tables, the allotment, the loop.

Greedy identity (batch 8, ragged acceptance) for model drafts, n-grams and
Medusa heads (feature draft and early exit: their own test files), a
chain-shaped dynamic tree against the chain loop (greedy and t = 1, token
for token), tree='dynamic'. The whole-sequence distribution test:
`test_dynamic_distribution.py`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.core import sampling
from spec_decode.core import tree_draft
from spec_decode.core import tree_shape as tree_lib
from spec_decode.drafters import Copy
from spec_decode.drafters import Heads
from spec_decode.drafters import NGram

M = 12
DYNAMIC = tree_lib.DynamicTree((3, 3, 2), width=3)


@pytest.fixture(scope='module')
def enc():
  return encoder_batch(8, 7, 16, seed=3)


@pytest.fixture(scope='module')
def plain(target, enc):
  return sd.generate(target, enc, max_decode_len=M)


def test_tables_from_parents_match_a_static_shape():
  shape = tree_lib.from_branching((2, 2, 1))
  dyn = tree_lib.DynamicTree.like(shape, width=2)
  assert dyn.levels == (2, 4, 4)
  got = tree_lib.TreeTables.from_parents(
    dyn, jnp.asarray(np.tile(shape.parents[1:], (2, 1)))
  )
  want = tree_lib.TreeTables.of_shape(shape, 2)
  for name in ('parents', 'ranks', 'children', 'ancestors', 'path_nodes'):
    np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
  np.testing.assert_array_equal(got.principal, want.principal)


def test_tables_follow_each_rows_parents():
  tree = tree_lib.DynamicTree((2, 2), width=2)
  # Row 0: both depth-2 nodes under node 1; row 1: one under each.
  tables = tree_lib.TreeTables.from_parents(
    tree, jnp.asarray([[0, 0, 1, 1], [0, 0, 1, 2]])
  )
  np.testing.assert_array_equal(
    tables.ranks, [[0, 0, 1, 0, 1], [0, 0, 1, 0, 0]]
  )
  np.testing.assert_array_equal(tables.children[0, 1], [3, 4])
  np.testing.assert_array_equal(tables.children[1, 2], [4, -1])
  np.testing.assert_array_equal(tables.path_nodes[1, 4], [0, 2, 4])
  np.testing.assert_array_equal(
    tables.principal, [[1, 1, 0, 1, 0], [1, 1, 0, 1, 0]]
  )
  assert bool(tables.ancestors[1, 4, 2]) and not bool(tables.ancestors[0, 4, 2])


def test_the_allotment_follows_the_drafts_confidence():
  """Depth 2's nodes go to the depth-1 node whose path is likelier, ranks
  0..k-1, and the children are the top-k of their parent (greedy)."""
  tree = tree_lib.DynamicTree((2, 3), width=3)
  vocab = 6
  root = jnp.log(jnp.asarray([[0.05, 0.7, 0.2, 0.03, 0.01, 0.01]]))
  after = {  # The draft's distribution after each token.
    1: [0.3, 0.05, 0.25, 0.2, 0.1, 0.1],
    2: [0.9, 0.02, 0.02, 0.02, 0.02, 0.02],
  }

  def level_logits(level, tokens, carry):
    fed = tokens[:, level.fed]  # [1, 2]
    table = jnp.log(jnp.asarray([after.get(t, [1 / vocab] * vocab)
                                 for t in range(vocab)]))  # fmt: skip
    return table[fed], carry

  keys = jax.random.split(jax.random.key(0), 2).reshape(1, 2)
  prop, _ = tree_draft.expand(
    tree, sampling.Sampler(), root, level_logits, None, keys
  )
  # Depth 1: tokens 1 (0.7) and 2 (0.2). Depth 2's slots: node 1 offers
  # 0.7 x (0.3, 0.25, 0.2) = 0.21, 0.175, 0.14, node 2 0.2 x 0.9 = 0.18
  # first: the best three give node 1 ranks 0 and 1 (tokens 0, 2) and
  # node 2 rank 0 (token 0), though node 2's first choice is the surest.
  np.testing.assert_array_equal(prop.tokens, [[1, 2, 0, 2, 0]])
  np.testing.assert_array_equal(prop.parents, [[0, 0, 1, 1, 2]])
  assert bool(jnp.all(prop.valid))


def test_dynamic_tree_sizes_are_checked():
  with pytest.raises(ValueError, match='width'):
    tree_lib.DynamicTree((3, 2), width=2)
  with pytest.raises(ValueError, match='levels'):
    tree_lib.DynamicTree((2, 0))
  with pytest.raises(ValueError, match='at least one node per level'):
    tree_lib.DynamicTree.budget(2, 3)
  assert tree_lib.DynamicTree.budget(8, 3).levels == (3, 3, 2)


@pytest.mark.parametrize('name', ['model', 'bigram', 'trigram', 'heads'])
def test_greedy_dynamic_tree_equals_greedy_plain(
  target, near_draft, enc, plain, name
):
  corpus = sd.generate(
    target, encoder_batch(64, 7, 16, seed=1), max_decode_len=M
  ).tokens
  draft = {
    'model': lambda: near_draft,
    'bigram': lambda: NGram.fit(corpus, n=2, vocab_size=16),
    'trigram': lambda: NGram.fit(corpus, n=3, vocab_size=16),
    'heads': lambda: Heads.init(target, num_heads=3, init_scale=0.3, seed=4),
  }[name]()
  out = sd.generate(target, enc, draft=draft, tree=DYNAMIC, max_decode_len=M)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  hist = out.stats.row_accepted_histogram
  assert len({tuple(h) for h in hist}) > 2  # Rows accepted differently.
  assert out.tree['levels'] == [3, 3, 2]
  # A node off the principal path was accepted somewhere (rank > 0).
  assert np.any(out.provenance.rank > 0)


def test_dynamic_tree_needs_fewer_calls_than_the_chain(target, near_draft, enc):
  chain = sd.generate(target, enc, draft=near_draft, gamma=3, max_decode_len=M)
  out = sd.generate(target, enc, draft=near_draft, tree=DYNAMIC,
                    max_decode_len=M)  # fmt: skip
  assert out.stats.tokens_per_call > chain.stats.tokens_per_call


@pytest.mark.parametrize('kw', [dict(), dict(temperature=1.0)])
def test_chain_shaped_dynamic_tree_equals_the_chain_loop(
  target, near_draft, enc, kw
):
  """One node per depth: the rank-0 child of the one node above, drawn
  with the chain's keys (greedy and t = 1, token for token)."""
  chain = sd.generate(target, enc, draft=near_draft, gamma=3,
                      max_decode_len=M, seed=5, **kw)  # fmt: skip
  tree = sd.generate(
    target, enc, draft=near_draft, tree=tree_lib.DynamicTree((1, 1, 1)),
    max_decode_len=M, seed=5, **kw,
  )  # fmt: skip
  np.testing.assert_array_equal(tree.tokens, chain.tokens)
  np.testing.assert_array_equal(
    tree.stats.row_accepted_histogram, chain.stats.row_accepted_histogram
  )
  np.testing.assert_array_equal(tree.provenance.codes, chain.provenance.codes)


def test_tree_dynamic_takes_tree_autos_budget(target, near_draft, enc, plain):
  out = sd.generate(target, enc, draft=near_draft, tree='dynamic',
                    max_decode_len=M)  # fmt: skip
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  chosen = out.tree['auto']
  levels = np.bincount([len(p) for p in chosen['paths']])[1:].tolist()
  assert chosen['dynamic_levels'] == levels == out.tree['levels']


def test_copy_refuses_a_dynamic_tree(target, enc):
  with pytest.raises(ValueError, match='static trees only'):
    sd.generate(target, enc, draft=Copy(vocab_size=16), tree=DYNAMIC,
                max_decode_len=M)  # fmt: skip

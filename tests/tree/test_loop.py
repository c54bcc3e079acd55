"""The tree loop: greedy identity, chain-shaped trees, errors, statistics."""

import numpy as np
import pytest
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.core import tree_shape as tree_lib
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.inputs import row_keys
from spec_decode.tree import loop as tree_loop

M = 12
TREES = {
  'branching_3_2_1': (3, 2, 1),
  'medusa_paths': [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0]],
}


@pytest.fixture(scope='module')
def enc():
  return encoder_batch(8, 7, 16, seed=3)


@pytest.fixture(scope='module')
def plain(target, enc):
  return sd.generate(target, enc, max_decode_len=M)


@pytest.fixture(scope='module')
def greedy_runs(target, near_draft, enc):
  """Greedy decodes by name (each compiles once for the module)."""
  cache = {}

  def get(name):
    if name not in cache:
      kw = dict(gamma=3) if name == 'chain' else dict(tree=TREES[name])
      cache[name] = sd.generate(
        target, enc, draft=near_draft, max_decode_len=M, seed=5, **kw
      )
    return cache[name]

  return get


@pytest.mark.accel
@pytest.mark.parametrize('name', sorted(TREES))
def test_greedy_tree_equals_greedy_plain(greedy_runs, plain, name):
  out = greedy_runs(name)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  # Ragged: rows accepted different numbers of tokens, and siblings of
  # rank > 0 were accepted somewhere.
  hist = out.stats.row_accepted_histogram
  assert len({tuple(h) for h in hist}) > 3
  assert np.nansum(out.tree['rank_acceptance'][:, 1:]) > 0
  assert len(set(plain.lengths.tolist())) > 1


def test_wider_tree_needs_fewer_target_calls(greedy_runs):
  chain = greedy_runs('chain')  # gamma 3: as deep as the trees.
  for name in TREES:
    assert greedy_runs(name).stats.target_calls < chain.stats.target_calls
    assert greedy_runs(name).stats.tokens_per_call > chain.stats.tokens_per_call


@pytest.mark.parametrize(
  'kw',
  # Sampling: top-k and top-p on (the plain t = 1 path is the same code;
  # its exactness is `test_tree_distribution.py`'s). The sampled variant
  # compiles two more loops: `make test-slow`.
  [
    pytest.param(dict(), id='greedy'),
    pytest.param(
      dict(temperature=0.7, top_k=3, top_p=0.8),
      id='top_k_top_p',
      marks=pytest.mark.slow,
    ),
  ],
)
def test_chain_shaped_tree_equals_the_chain_loop(
  target, near_draft, enc, greedy_runs, kw
):
  if kw:
    chain = sd.generate(target, enc, draft=near_draft, gamma=3,
                        max_decode_len=M, seed=5, **kw)  # fmt: skip
  else:
    chain = greedy_runs('chain')
  tree = sd.generate(target, enc, draft=near_draft, tree=(1, 1, 1),
                     max_decode_len=M, seed=5, **kw)  # fmt: skip
  np.testing.assert_array_equal(tree.tokens, chain.tokens)
  np.testing.assert_array_equal(
    tree.stats.row_accepted_histogram, chain.stats.row_accepted_histogram
  )
  np.testing.assert_allclose(tree.stats.alpha, chain.stats.alpha, rtol=1e-5)
  # The same provenance: accepted, replaced (and the rejected draft token,
  # the rank-0 child), bonus, iteration starts.
  np.testing.assert_array_equal(tree.provenance.codes, chain.provenance.codes)
  np.testing.assert_array_equal(
    tree.provenance.rejected, chain.provenance.rejected
  )
  if kw:  # Sampling accepted and rejected in the same batch.
    assert 0.05 < chain.stats.alpha < 0.95


@pytest.mark.parametrize('name', sorted(TREES))
def test_provenance_records_the_accepted_path(greedy_runs, name):
  """Greedy trees: every iteration starts once, accepted nodes match the
  counters and carry their sibling rank, a replaced token differs from
  the draft's rejected child."""
  from spec_decode.core import provenance as prov  # pylint: disable=g-import-not-at-top

  out = greedy_runs(name)
  p = out.provenance
  width = tree_lib.parse(TREES[name]).width
  ranks_seen = set()
  for r in range(out.tokens.shape[0]):
    n = out.lengths[r]
    kinds = np.asarray(p.kinds(r))
    assert len(kinds) == n
    assert len(p.iterations(r)) == out.stats.row_iterations[r]
    acc = kinds == prov.ACCEPTED
    assert acc.sum() == out.stats.row_position_accepts[r].sum()
    rep = kinds == prov.REPLACED
    assert (p.rejected[r, :n][rep] != out.tokens[r, :n][rep]).all()
    assert (p.rejected[r, :n][~rep] == -1).all()
    assert (p.rank[r, :n][~acc] == 0).all()
    ranks_seen |= set(p.rank[r, :n][acc].tolist())
  assert max(ranks_seen) > 0 and max(ranks_seen) < width


def test_table_draft_trees(target, enc, plain):
  table = sd.TableLM.random(16, seed=2)
  out = sd.generate(target, enc, draft=table, tree=(2, 2), max_decode_len=M)
  np.testing.assert_array_equal(out.tokens, plain.tokens)


def test_tree_shapes_parse_and_tables():
  shape = tree_lib.parse((2, 2))
  assert shape.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1))
  np.testing.assert_array_equal(shape.parents, [-1, 0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(shape.depths, [0, 1, 1, 2, 2, 2, 2])
  np.testing.assert_array_equal(shape.children[1], [3, 4])
  assert shape.ancestors[5].tolist() == [True, False, True, False, False,
                                         True, False]  # fmt: skip
  assert tree_lib.parse([[1], [0]]) == tree_lib.parse((2,))
  assert tree_lib.parse((1, 1, 1)).is_chain
  assert not shape.is_chain
  np.testing.assert_array_equal(shape.path_nodes[6], [0, 2, 6])


@pytest.mark.parametrize(
  'bad,match',
  [
    ([[0, 0]], 'parent'),
    ([[0], [2]], 'elder sibling'),
    ([[0], [0]], 'twice'),
    ((2, 0), '>= 1'),
    ('wide', 'auto'),
    ([[0], [-1]], '>= 0'),
    ([], 'empty'),
  ],
)
def test_bad_trees_are_clear_errors(bad, match):
  with pytest.raises(ValueError, match=match):
    tree_lib.parse(bad)


def test_generate_rejects_trees_it_cannot_verify(target, near_draft, enc):
  with pytest.raises(ValueError, match='needs a draft'):
    sd.generate(target, enc, tree=(2,))
  with pytest.raises(ValueError, match='chains only'):
    sd.generate(target, enc, draft=near_draft, tree=(2,), lenience=0.5)
  with pytest.raises(ValueError, match='chains only'):
    sd.generate(target, enc, draft=near_draft, tree=(2,), dynamic_gamma=True)
  with pytest.raises(ValueError, match='parent'):
    sd.generate(target, enc, draft=near_draft, tree=[[0, 0]])


@pytest.mark.parametrize('width, gamma', [(3, 3), (4, 3), (3, 2)])
def test_the_loop_is_as_wide_and_drafts_as_deep_as_its_tree(
  target, near_draft, enc, width, gamma
):
  shape = tree_lib.from_branching((2, 1, 1, 1))  # depth 4
  settings = DecodeSettings(max_decode_len=M, width=width, gamma=gamma)
  keys = row_keys(0, enc.shape[0])
  with pytest.raises(
    ValueError,
    match=rf'== the tree depth \(4\), got width {width}, gamma {gamma}',
  ):
    tree_loop.Iteration.create(target, near_draft, enc, keys, settings, shape)
  sized = tree_loop.settings_for(settings, shape)
  assert (sized.width, sized.gamma, sized.buffer_len) == (4, 4, M + 6)
  it = tree_loop.Iteration.create(target, near_draft, enc, keys, sized, shape)
  assert it.settings is sized

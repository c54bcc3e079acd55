"""Every drafter's trees: greedy identity at batch 8 with ragged acceptance.

(Model drafts and TableLM: `tests/tree/test_loop.py`.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.core import drafter
from spec_decode.core import tree_shape as tree_lib
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.drafters import Copy
from spec_decode.drafters import Heads
from spec_decode.drafters import NGram

M = 12
TREE = (3, 2, 1)


@pytest.fixture(scope='module')
def inputs():
  return encoder_batch(8, 7, 16, seed=0)


@pytest.fixture(scope='module')
def plain(target, inputs):
  return sd.generate(target, inputs, max_decode_len=M)


@pytest.fixture(scope='module')
def corpus(target):
  return sd.generate(target, encoder_batch(64, 7, 16, seed=1),
                     max_decode_len=M).tokens  # fmt: skip


def _drafter(name, target, corpus):
  if name == 'bigram':
    return NGram.fit(corpus, n=2, vocab_size=16)
  if name == 'trigram':
    return NGram.fit(corpus, n=3, vocab_size=16)
  if name == 'copy':
    return Copy(vocab_size=16, max_ngram=3)
  return Heads.init(target, num_heads=3, init_scale=0.3, seed=4)


@pytest.mark.parametrize('name', ['bigram', 'trigram', 'copy', 'heads'])
def test_greedy_tree_equals_greedy_plain(target, inputs, plain, corpus, name):
  assert len(set(plain.lengths.tolist())) >= 3  # Rows end apart.
  draft = _drafter(name, target, corpus)
  out = sd.generate(target, inputs, draft=draft, tree=TREE, max_decode_len=M)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  hist = out.stats.row_accepted_histogram
  assert len({tuple(h) for h in hist}) > 2  # Rows accepted differently.
  assert out.stats.tokens_per_call > 1.0
  if name != 'copy':
    # A second choice was accepted somewhere.
    assert np.nansum(out.tree['rank_acceptance'][:, 1:]) > 0


def _context(batch, inputs, length, enc, depth):
  keys = jax.random.split(jax.random.key(0), batch * depth)
  return drafter.DraftContext(
    inputs=jnp.asarray(inputs, jnp.int32),
    length=jnp.asarray(length, jnp.int32),
    encoder_tokens=jnp.asarray(enc, jnp.int32),
    keys=keys.reshape(batch, depth),
  )


def test_copy_tree_proposes_several_matches():
  # Output so far: 5 6 1 5 7 2 5 8 3 5. The suffix "5" occurred before,
  # followed by 6 1, 7 2 and 8 3 (most recent first: 8, 7, 6).
  inputs = np.array([[0, 5, 6, 1, 5, 7, 2, 5, 8, 3, 5, 0, 0, 0]])
  enc = np.array([[2, 2, 0]])
  shape = tree_lib.from_branching((3, 2))
  context = _context(1, inputs, [10], enc, shape.depth)
  proposal, _ = Copy(vocab_size=16, max_ngram=2).propose_tree(
    None, context, DecodeSettings(max_decode_len=8, gamma=2), shape
  )
  tokens = np.asarray(proposal.tokens[0])
  valid = np.asarray(proposal.valid[0])
  # Depth 1: the first tokens of three matches, best first.
  np.testing.assert_array_equal(tokens[:3], [8, 7, 6])
  # Depth 2: each match's next token on the rank-0 child only.
  np.testing.assert_array_equal(valid, [1, 1, 1, 1, 0, 1, 0, 1, 0])
  np.testing.assert_array_equal(tokens[[3, 5, 7]], [3, 2, 1])


def test_ngram_tree_children_are_the_top_continuations(corpus):
  model = NGram.fit(corpus, n=2, vocab_size=16)
  shape = tree_lib.from_branching((3, 2))
  inputs = np.zeros((1, 8), np.int32)
  inputs[0, 1] = 4
  context = _context(1, inputs, [1], np.ones((1, 3)), shape.depth)
  proposal, _ = model.propose_tree(
    None, context, DecodeSettings(max_decode_len=8, gamma=2), shape
  )
  tokens = np.asarray(proposal.tokens[0])
  q = np.asarray(model.probs_after(jnp.asarray([[4]])))[0]
  np.testing.assert_array_equal(tokens[:3], np.argsort(-q, kind='stable')[:3])
  for u in range(4, 10):  # Depth 2, under node parent(u).
    parent = tokens[shape.parents[u] - 1]
    qp = np.asarray(model.probs_after(jnp.asarray([[parent]])))[0]
    rank = shape.ranks[u]
    assert tokens[u - 1] == np.argsort(-qp, kind='stable')[rank]

"""Speculative beam search (`sd.beam_search(draft=...)`) equals plain beam
search.

Plain beam search is tested against its definition in tests/beam/test_search.py;
here the speculative version must return the same beams, scores, lengths
and steps, whatever the draft: the draft only decides how many steps one
target call covers. Table models give bit-identical log-probabilities in
both (a table lookup), so their scores must be equal exactly; T5 models
score a node among a tree's tokens, so their scores may differ by float32
rounding (the tests print the largest difference).
"""

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch
from conftest import perturbed
from conftest import sharpened
from conftest import tiny_config

import spec_decode as sd
from spec_decode.beam import scores as beam_scores
from spec_decode.core.tree_shape import MAX_NODES

EOS = sd.EOS_ID


@flax.struct.dataclass(kw_only=True)
class _RowState:
  index: jax.Array
  which: jax.Array


@flax.struct.dataclass(kw_only=True)
class RowTableLM:
  """Bigram logits that depend on the input: `tables[enc[0] % R, prev]`.

  Rows with different first encoder tokens decode from different tables,
  so they finish after different numbers of steps. A tree language model
  (a node's logits depend on its token alone), for the target's role.
  """

  tables: jax.Array
  vocabulary: Any = flax.struct.field(pytree_node=False, default=None)

  @property
  def vocab_size(self) -> int:
    return self.tables.shape[-1]

  def init_state(self, encoder_tokens, length):
    del length
    which = encoder_tokens[:, 0] % self.tables.shape[0]
    return _RowState(index=jnp.zeros_like(which), which=which)

  def _logits(self, state, tokens):
    return self.tables[state.which[:, None], tokens]

  def score(self, state, tokens):
    index = state.index + tokens.shape[1]
    return self._logits(state, tokens), state.replace(index=index)

  def score_tree(self, state, tokens, attention):
    del attention
    return self._logits(state, tokens), state

  def commit_tree(self, state, slots, count):
    del slots
    return state.replace(index=state.index + count)

  def rollback(self, state, index):
    return state.replace(index=index)


def _tables(vocab: int, seed: int, num: int = 4) -> np.ndarray:
  rng = np.random.default_rng(seed)
  tables = rng.normal(0.0, 2.0, (num, vocab, vocab))
  # A different EOS preference per table: rows stop at different steps.
  tables[:, :, EOS] += np.linspace(-1.0, 1.5, num)[:, None]
  return tables.astype(np.float32)


ENC = np.arange(0, 8, dtype=np.int32)[:, None] * np.ones((1, 3), np.int32)


def assert_same_beams(plain, spec, exact: bool) -> float:
  """Tokens, lengths and steps equal; scores equal (or allclose).

  Returns the largest score difference.
  """
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)
  np.testing.assert_array_equal(spec.steps, plain.steps)
  # Every target call committed 1 + a steps (histogram column a).
  np.testing.assert_array_equal(spec.histogram.sum(1), spec.calls)
  committed = spec.histogram @ np.arange(1, spec.histogram.shape[1] + 1)
  np.testing.assert_array_equal(committed, spec.steps)
  if exact:
    np.testing.assert_array_equal(spec.scores, plain.scores)
  else:
    np.testing.assert_allclose(
      spec.scores, plain.scores, rtol=beam_scores.RTOL, atol=beam_scores.ATOL
    )
  return float(np.abs(spec.scores - plain.scores).max())


def covered_depths(out) -> np.ndarray:
  """`[B, G]` calls that covered draft depth d + 1."""
  hist = out.histogram
  return np.stack(
    [hist[:, d + 1 :].sum(1) for d in range(hist.shape[1] - 1)], 1
  )


def full_calls(steps: np.ndarray, gamma: int) -> np.ndarray:
  """Target calls when every call commits gamma + 1 steps (the most: the
  roots' step and one per draft depth) until the row stops."""
  return np.asarray([math.ceil(s / (gamma + 1)) for s in steps])


@pytest.mark.parametrize('gamma', [1, 3, 5])
@pytest.mark.parametrize('num_beams', [1, 2, 4])
def test_equals_plain_beam_search_on_tables(num_beams, gamma):
  target = RowTableLM(tables=_tables(8, seed=num_beams))
  # Several alphas; each leaves rows that stop at different steps here.
  alpha = {1: 0.6, 3: 0.0, 5: 1.0 if num_beams < 4 else 0.6}[gamma]
  plain = sd.beam_search(
    target, ENC, num_beams=num_beams, alpha=alpha, max_decode_len=12
  )
  # The case the batch is for: rows stopped after different numbers of
  # steps.
  assert len(set(plain.steps.tolist())) > 1, plain.steps
  np.testing.assert_array_equal(plain.calls, plain.steps)

  def spec(draft, **tree):
    out = sd.beam_search(
      target,
      ENC,
      num_beams=num_beams,
      alpha=alpha,
      max_decode_len=12,
      draft=draft,
      gamma=gamma,
      **tree,
    )
    assert_same_beams(plain, out, exact=True)
    assert (out.calls >= full_calls(out.steps, gamma)).all()
    assert (covered_depths(out) <= out.depth_tries).all()
    return out

  # The target as its own draft with full trees (every node expanded,
  # c = K children): each new live beam's token is among its parent's K
  # best non-EOS tokens, so every call commits gamma + 1 steps. Where the
  # full tree is too large (K = 4, gamma = 5: 1364 nodes), W = c = K trees:
  # exact, but a node the target pruned for another beam's sake can
  # outrank a live beam inside one beam's tree, so coverage is not total.
  full = sum(num_beams**d for d in range(1, gamma + 1)) < MAX_NODES
  width = num_beams ** (gamma - 1) if full else num_beams
  same = spec(target, draft_beams=width, draft_children=num_beams)
  if full:
    np.testing.assert_array_equal(same.calls, full_calls(same.steps, gamma))
    np.testing.assert_array_equal(covered_depths(same), same.depth_tries)
  # A model draft near the target (its tables perturbed), and a bigram
  # draft that ignores the input and is unrelated to the target.
  noise = np.random.default_rng(7).normal(0, 0.7, target.tables.shape)
  near = spec(RowTableLM(tables=target.tables + noise.astype(np.float32)))
  bigram = spec(sd.TableLM.random(8, seed=11))
  # The default trees (W = 1, c = 2) with the target as draft: exact, and
  # full calls with one beam (its top child is the kept node).
  default = spec(target)
  if num_beams == 1:
    np.testing.assert_array_equal(
      default.calls, full_calls(default.steps, gamma)
    )
  print(
    f'K={num_beams} gamma={gamma}: steps per call: self '
    f'{same.steps_per_call:.2f}, near {near.steps_per_call:.2f}, bigram '
    f'{bigram.steps_per_call:.2f}'
  )
  if gamma > 1 or num_beams > 1:
    assert bigram.steps_per_call < same.steps_per_call


def test_draft_tree_sizes(num_beams=3):
  # Chains (W = c = 1), the default trees and W = c = K: all exact; here
  # the wider trees cover at least as many steps per call.
  target = RowTableLM(tables=_tables(8, seed=5))
  noise = np.random.default_rng(8).normal(0, 1.0, target.tables.shape)
  draft = RowTableLM(tables=target.tables + noise.astype(np.float32))
  plain = sd.beam_search(
    target, ENC, num_beams=num_beams, alpha=0.6, max_decode_len=12
  )
  outs = [
    sd.beam_search(
      target,
      ENC,
      num_beams=num_beams,
      alpha=0.6,
      max_decode_len=12,
      draft=draft,
      gamma=3,
      draft_beams=w,
      draft_children=c,
    )
    for w, c in ((1, 1), (None, None), (num_beams, num_beams))
  ]
  for out in outs:
    assert_same_beams(plain, out, exact=True)
  per_call = [out.steps_per_call for out in outs]
  print(f'steps per call, chain / default / W = c = K: {per_call}')
  assert per_call[0] <= per_call[1] <= per_call[2]
  for bad in ({'draft_beams': 0}, {'draft_children': 0}):
    with pytest.raises(ValueError, match=next(iter(bad))):
      sd.beam_search(target, ENC, num_beams=2, draft=draft, **bad)
  with pytest.raises(ValueError, match='below the vocabulary size'):
    sd.beam_search(target, ENC, num_beams=2, draft=draft, draft_children=8)
  with pytest.raises(ValueError, match='nodes; at most'):
    sd.beam_search(
      target,
      ENC,
      num_beams=2,
      draft=draft,
      gamma=9,
      draft_beams=7,
      draft_children=7,
    )


def test_placeholder_beams_with_a_vocabulary_below_2k():
  # V = 5 < 2K = 8: the K - 1 placeholder beams (log-prob -1e7) reach the
  # top 2K at the first step and must be covered like any other beam.
  target = RowTableLM(tables=_tables(5, seed=3))
  enc = ENC % 5
  plain = sd.beam_search(target, enc, num_beams=4, alpha=0.6, max_decode_len=7)
  draft = sd.TableLM.random(5, seed=4)
  out = sd.beam_search(
    target, enc, num_beams=4, alpha=0.6, max_decode_len=7, draft=draft, gamma=2
  )
  assert_same_beams(plain, out, exact=True)


@pytest.fixture(scope='module')
def t5():
  return sharpened(sd.Model.init(tiny_config(), seed=0))


@pytest.fixture(scope='module')
def enc(t5):
  return encoder_batch(8, 7, t5.vocab_size, seed=2)


@pytest.mark.accel
def test_t5_near_draft(t5, enc):
  plain = sd.beam_search(t5, enc, num_beams=4, alpha=0.6, max_decode_len=10)
  assert len(set(plain.steps.tolist())) > 1, plain.steps
  draft = perturbed(t5, 0.1, seed=1)
  out = sd.beam_search(
    t5, enc, num_beams=4, alpha=0.6, max_decode_len=10, draft=draft, gamma=3
  )
  diff = assert_same_beams(plain, out, exact=False)
  print(
    f'T5 near draft: steps per call {out.steps_per_call:.2f}, '
    f'largest score difference {diff:.2e}'
  )
  assert out.steps_per_call > 1.0


def test_t5_self_draft_commits_gamma_plus_one_steps(t5, enc):
  # The settings of test_t5_near_draft: both programs are compiled already.
  plain = sd.beam_search(t5, enc, num_beams=4, alpha=0.6, max_decode_len=10)
  out = sd.beam_search(
    t5,
    enc,
    num_beams=4,
    alpha=0.6,
    max_decode_len=10,
    draft=t5,
    gamma=3,
    draft_beams=4,
    draft_children=4,
  )
  assert_same_beams(plain, out, exact=False)
  np.testing.assert_array_equal(out.calls, full_calls(out.steps, 3))


def test_bad_drafts_are_clear_errors(t5, enc):
  with pytest.raises(ValueError, match='vocabulary size'):
    sd.beam_search(
      t5, enc, num_beams=2, draft=sd.TableLM.random(t5.vocab_size + 2)
    )
  with pytest.raises(ValueError, match='has no init_state'):
    sd.beam_search(t5, enc, num_beams=2, draft=object())

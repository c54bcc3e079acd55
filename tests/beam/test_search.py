"""Plain beam search (`sd.beam_search`) against its definition.

The reference below is written from the rules in docs/decoding.md, not from
the implementation: it keeps sequences as Python tuples, expands every live
prefix by every token with float64 log-probabilities computed from the whole
prefix (no cache), and sorts. Vocabularies have at least 2K ids, so T5X's
K - 1 placeholder beams never reach the top 2K and need no modelling.
"""

import jax
import numpy as np
import pytest
from conftest import encoder_batch
from conftest import sharpened
from conftest import tiny_config

import spec_decode as sd
from spec_decode.t5 import cache as cache_lib

EOS = sd.EOS_ID
EMPTY_SCORE = -1.0e7


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def reference(next_log_probs, num_beams, alpha, max_len):
  """Beam search from its definition, for one input.

  Args:
    next_log_probs: list of prefixes (tuples of output tokens) -> `[N, V]`
      float64 log p(next token | prefix).
    num_beams: K.
    alpha: brevity-penalty exponent.
    max_len: M.

  Returns:
    tokens `[K, M]`, scores `[K]`, lengths `[K]` (best first), steps.
  """
  k = num_beams

  def penalty(n):
    return ((5.0 + n) / 6.0) ** alpha

  live = [((), 0.0)]
  finished = []  # (sequence, score), best first.
  step = 0
  while step < max_len:
    if len(finished) == k:
      best_live = max(lp for _, lp in live) / penalty(max_len + 1)
      if min(s for _, s in finished) > best_live:
        break
    rows = next_log_probs([seq for seq, _ in live])
    candidates = [
      (seq + (t,), lp + rows[i][t])
      for i, (seq, lp) in enumerate(live)
      for t in range(rows.shape[1])
    ]
    candidates.sort(key=lambda c: -c[1])
    top = candidates[: 2 * k]
    new = [(seq, lp / penalty(step + 1)) for seq, lp in top if seq[-1] == EOS]
    finished = sorted(finished + new, key=lambda c: -c[1])[:k]
    live = [(seq, lp) for seq, lp in top if seq[-1] != EOS][:k]
    step += 1
  tokens = np.zeros((k, max_len), np.int64)
  scores = np.full((k,), EMPTY_SCORE)
  lengths = np.zeros((k,), np.int64)
  for j, (seq, score) in enumerate(finished or live):
    tokens[j, : len(seq)] = seq
    scores[j] = score
    lengths[j] = len(seq)
  return tokens, scores, lengths, step


def table_oracle(table: np.ndarray):
  logp = _log_softmax(table)
  return lambda prefixes: np.stack([logp[p[-1] if p else 0] for p in prefixes])


def t5_oracle(model: sd.Model, enc_row: np.ndarray, max_len: int, rows: int):
  """Teacher-forced next-token log-probs of whole prefixes (up to `rows` at
  a time, padded to `[rows, M]`: one compiled shape)."""

  def next_log_probs(prefixes):
    inputs = np.zeros((rows, max_len), np.int32)
    for i, p in enumerate(prefixes):
      inputs[i, 1 : len(p) + 1] = p
    enc = np.repeat(enc_row[None], rows, 0)
    logits = np.asarray(model.logits(enc, inputs), np.float64)
    n = len(prefixes)
    return _log_softmax(logits[np.arange(n), [len(p) for p in prefixes]])

  return next_log_probs


def assert_matches(out, row, ref):
  tokens, scores, lengths, steps = ref
  np.testing.assert_array_equal(out.tokens[row], tokens)
  np.testing.assert_array_equal(out.lengths[row], lengths)
  np.testing.assert_allclose(out.scores[row], scores, rtol=1e-5, atol=1e-5)
  assert out.steps[row] == steps


def _eos_table(vocab: int, seed: int, eos_boost: float) -> np.ndarray:
  table = np.random.default_rng(seed).normal(0, 2.0, (vocab, vocab))
  table[:, EOS] += eos_boost
  return table.astype(np.float32)


@pytest.mark.parametrize('alpha', [0.0, 0.6, 2.0])
@pytest.mark.parametrize('num_beams', [1, 2, 4])
def test_matches_reference_on_tables(num_beams, alpha):
  enc = np.ones((1, 3), np.int32)
  for seed in range(4):
    table = _eos_table(8, seed, eos_boost=1.0)
    out = sd.beam_search(
      sd.TableLM(table=table),
      enc,
      num_beams=num_beams,
      alpha=alpha,
      max_decode_len=6,
    )
    ref = reference(table_oracle(table), num_beams, alpha, 6)
    assert_matches(out, 0, ref)


def test_eos_at_the_first_step():
  table = _eos_table(8, 3, eos_boost=0.0)
  table[0, EOS] = 8.0  # From the start token, EOS is by far the best.
  enc = np.ones((1, 3), np.int32)
  for num_beams in (1, 3):
    out = sd.beam_search(
      sd.TableLM(table=table),
      enc,
      num_beams=num_beams,
      alpha=0.6,
      max_decode_len=5,
    )
    np.testing.assert_array_equal(out.tokens[0, 0], [EOS, 0, 0, 0, 0])
    assert out.lengths[0, 0] == 1
    assert_matches(out, 0, reference(table_oracle(table), num_beams, 0.6, 5))


@pytest.fixture(scope='module')
def t5():
  return sharpened(sd.Model.init(tiny_config(), seed=0))


@pytest.fixture(scope='module')
def enc(t5):
  return encoder_batch(6, 7, t5.vocab_size, seed=2)


@pytest.mark.parametrize('num_beams,alpha', [(2, 0.6), (4, 1.0)])
def test_t5_rows_finish_at_different_steps(t5, enc, num_beams, alpha):
  out = sd.beam_search(
    t5, enc, num_beams=num_beams, alpha=alpha, max_decode_len=8
  )
  for row in range(enc.shape[0]):
    ref = reference(t5_oracle(t5, enc[row], 8, num_beams), num_beams, alpha, 8)
    assert_matches(out, row, ref)
  # The case the test is for: rows stopped after different numbers of steps.
  assert len(set(out.steps.tolist())) > 1, out.steps


def test_rows_are_independent(t5, enc):
  out = sd.beam_search(t5, enc, num_beams=2, alpha=0.6, max_decode_len=8)
  assert len(set(out.steps.tolist())) > 1, out.steps
  # Every row among other batch mates (the batch reversed, and row 0's mates
  # replaced by other inputs): its beams, scores and steps do not change.
  others = encoder_batch(6, 7, t5.vocab_size, seed=99)
  others[0] = enc[0]
  for batch, rows in ((enc[::-1], np.arange(6)[::-1]), (others, [0])):
    moved = sd.beam_search(t5, batch, num_beams=2, alpha=0.6, max_decode_len=8)
    for i, row in enumerate(rows):
      np.testing.assert_array_equal(moved.tokens[i], out.tokens[row])
      np.testing.assert_array_equal(moved.lengths[i], out.lengths[row])
      np.testing.assert_array_equal(moved.scores[i], out.scores[row])
      assert moved.steps[i] == out.steps[row]


def test_one_beam_is_greedy_when_no_runner_up_ends():
  # EOS is never among the two best next tokens except after token 5, where
  # it is the best: one beam then follows greedy and finishes with it.
  table = _eos_table(8, 5, eos_boost=-30.0)
  table[5, EOS] = table[5].max() + 3.0
  table[0, 5] = table[0].max() + 3.0  # Greedy: 5 then EOS.
  enc = np.ones((2, 3), np.int32)
  greedy = sd.generate(sd.TableLM(table=table), enc, max_decode_len=9)
  for alpha in (0.0, 0.6):
    out = sd.beam_search(
      sd.TableLM(table=table), enc, num_beams=1, alpha=alpha, max_decode_len=9
    )
    np.testing.assert_array_equal(out.tokens[:, 0], greedy.tokens)
    np.testing.assert_array_equal(out.lengths[:, 0], greedy.lengths)
  # Without any EOS on the greedy path, one beam never finishes: greedy's
  # M tokens, scored by their log-probability.
  table[5, EOS] = -30.0
  greedy = sd.generate(sd.TableLM(table=table), enc, max_decode_len=9)
  out = sd.beam_search(
    sd.TableLM(table=table), enc, num_beams=1, alpha=0.6, max_decode_len=9
  )
  np.testing.assert_array_equal(out.tokens[:, 0], greedy.tokens)
  assert (greedy.lengths == 9).all() and (out.lengths == 9).all()
  logp = sd.TableLM(table=table).log_probs(enc, greedy.tokens).sum(1)
  np.testing.assert_allclose(out.scores[:, 0], logp, rtol=1e-5)


def test_t5_one_beam_equals_greedy_where_t5x_rules_allow(t5, enc):
  """One beam follows greedy's tokens until greedy's EOS; it returns
  greedy's sequence unless an EOS runner-up finished with a better score."""
  greedy = sd.generate(t5, enc, max_decode_len=8)
  out = sd.beam_search(t5, enc, num_beams=1, alpha=0.0, max_decode_len=8)
  same = (out.tokens[:, 0] == greedy.tokens).all(1)
  assert same.sum() >= 1
  for row in np.flatnonzero(~same):
    # The beam returned is an EOS runner-up: a prefix of greedy's tokens,
    # then EOS, with a larger log-probability than greedy's sequence.
    n = out.lengths[row, 0]
    np.testing.assert_array_equal(
      out.tokens[row, 0, : n - 1], greedy.tokens[row, : n - 1]
    )
    assert out.tokens[row, 0, n - 1] == EOS
    assert greedy.tokens[row, n - 1] != EOS
    g = np.asarray(
      t5.log_probs(enc[row : row + 1], greedy.tokens[row : row + 1])
    )
    g = g[0, : greedy.lengths[row]].sum()
    assert out.scores[row, 0] >= g - 1e-5


def test_one_beam_differs_from_greedy_when_an_eos_runner_up_wins():
  # T5X's rule, not greedy's: after the start token, token 3 (p ~ 0.55)
  # beats EOS (p ~ 0.45); after 3 every token is equally likely, so
  # greedy's sequence is far less likely than [EOS], which one beam keeps.
  vocab = 8
  table = np.full((vocab, vocab), -20.0, np.float32)
  table[0, 3], table[0, EOS] = 0.2, 0.0
  table[3:, :] = 0.0
  table[3:, EOS] = -20.0
  enc = np.ones((1, 3), np.int32)
  lm = sd.TableLM(table=table)
  greedy = sd.generate(lm, enc, max_decode_len=4)
  out = sd.beam_search(lm, enc, num_beams=1, alpha=0.6, max_decode_len=4)
  assert greedy.tokens[0, 0] == 3 and greedy.lengths[0] == 4
  np.testing.assert_array_equal(out.tokens[0, 0], [EOS, 0, 0, 0])
  assert_matches(out, 0, reference(table_oracle(table), 1, 0.6, 4))


def test_fewer_finished_than_beams_fills_empty_slots():
  # EOS only reachable late: with M = 3, at most one sequence can finish.
  vocab = 8
  table = _eos_table(vocab, 9, eos_boost=-30.0)
  table[0, 6] = 10.0
  table[6, 7] = 10.0
  table[7, EOS] = 10.0
  enc = np.ones((1, 2), np.int32)
  out = sd.beam_search(
    sd.TableLM(table=table), enc, num_beams=3, alpha=0.6, max_decode_len=3
  )
  np.testing.assert_array_equal(out.tokens[0, 0], [6, 7, EOS])
  assert out.lengths[0].tolist() == [3, 0, 0]
  np.testing.assert_array_equal(out.scores[0, 1:], [EMPTY_SCORE] * 2)
  assert_matches(out, 0, reference(table_oracle(table), 3, 0.6, 3))


def test_bad_arguments_are_clear_errors(t5):
  enc = np.ones((1, 3), np.int32)
  with pytest.raises(ValueError, match='num_beams'):
    sd.beam_search(t5, enc, num_beams=0)
  with pytest.raises(ValueError, match='alpha'):
    sd.beam_search(t5, enc, alpha=-0.5)
  with pytest.raises(ValueError, match='max_decode_len'):
    sd.beam_search(t5, enc, max_decode_len=0)
  with pytest.raises(ValueError, match='gamma'):
    sd.beam_search(t5, enc, gamma=0)
  with pytest.raises(ValueError, match='encoder_tokens'):
    sd.beam_search(t5, np.ones((3,), np.int32))
  with pytest.raises(ValueError, match='encoder_tokens ids'):
    sd.beam_search(t5, enc * 999)
  with pytest.raises(ValueError, match='vocabulary size'):
    sd.beam_search(t5, enc, draft=sd.TableLM.random(t5.vocab_size + 1))


def test_cache_gather_reorders_rows():
  cache = cache_lib.KVCache.zeros(1, 3, 4, 1, 2, jax.numpy.float32)
  keys = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 1, 2, 4)
  cache = cache.replace(keys=(keys,), index=np.array([1, 2, 3], np.int32))
  out = cache.gather(np.array([2, 2, 0]))
  np.testing.assert_array_equal(out.keys[0], keys[[2, 2, 0]])
  np.testing.assert_array_equal(out.index, [3, 3, 1])

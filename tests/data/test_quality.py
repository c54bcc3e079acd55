"""Tests of BLEU and ROUGE on strings whose scores are worked out by hand."""

import math

import pytest

from spec_decode.data import quality


def test_bleu_identical_and_disjoint():
  refs = ['the cat sat on the mat .', 'a dog barks']
  assert quality.compute('bleu', refs, refs)['bleu'] == pytest.approx(100.0)
  assert quality.compute('bleu', ['x y z w'], ['a b c d'])['bleu'] == 0.0


def test_bleu_brevity_penalty():
  # All n-gram precisions are 1; the hypothesis has 4 of the reference's 6
  # tokens, so BLEU = 100 * exp(1 - 6 / 4).
  got = quality.bleu(['a b c d'], ['a b c d e f'])['bleu']
  assert got == pytest.approx(100.0 * math.exp(-0.5), rel=1e-6)


def test_bleu_is_corpus_level():
  # Corpus BLEU pools n-gram counts; it is not the mean of sentence scores.
  preds = ['a b c d', 'e f g h']
  refs = ['a b c d', 'e f g x']
  # Pooled precisions: 1-grams 7/8, 2-grams 5/6, 3-grams 3/4, 4-grams 1/2.
  expected = 100.0 * (7 / 8 * 5 / 6 * 3 / 4 * 1 / 2) ** 0.25
  assert quality.bleu(preds, refs)['bleu'] == pytest.approx(expected)


def test_rouge_known_values():
  got = quality.compute('rouge', ['the cat sat'], ['the cat sat on the mat'])
  assert set(got) == {'rouge1', 'rouge2', 'rougeL'}
  # ROUGE-1: P = 3/3, R = 3/6 -> F = 2/3. ROUGE-2: P = 2/2, R = 2/5 -> F =
  # 4/7. ROUGE-L: LCS 3 -> same as ROUGE-1.
  assert got['rouge1'] == pytest.approx(100 * 2 / 3)
  assert got['rouge2'] == pytest.approx(100 * 4 / 7)
  assert got['rougeL'] == pytest.approx(100 * 2 / 3)


def test_rouge_stems_and_averages():
  # 'cats'/'cat' and 'running'/'run' match after Porter stemming.
  got = quality.rouge(
    ['cats running', 'completely different'], ['cat run', 'cat run']
  )
  assert got['rouge1'] == pytest.approx(50.0)
  assert got['rouge2'] == pytest.approx(50.0)
  assert got['rougeL'] == pytest.approx(50.0)


def test_empty_and_mismatched_inputs():
  assert quality.compute('bleu', [], []) == {'bleu': 0.0}
  assert quality.compute('rouge', [], []) == {
    'rouge1': 0.0,
    'rouge2': 0.0,
    'rougeL': 0.0,
  }
  with pytest.raises(ValueError, match='2 predictions but 1 references'):
    quality.compute('bleu', ['a', 'b'], ['a'])
  with pytest.raises(ValueError, match='Unknown metric'):
    quality.compute('meteor', ['a'], ['a'])

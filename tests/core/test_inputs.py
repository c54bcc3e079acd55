"""The input checks every decode shares (`core.inputs`), and their callers."""

import types

import jax
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.core import inputs


def test_check_tokens_returns_int32_host_array():
  tokens = np.array([[0, 3, 7], [7, 1, 2]], np.int64)
  out = inputs.check_tokens(tokens, 8)
  assert isinstance(out, np.ndarray) and out.dtype == np.int32
  np.testing.assert_array_equal(out, tokens)
  # Lists and uint8 arrays are integers too.
  np.testing.assert_array_equal(inputs.check_tokens([[5, 6]], 8), [[5, 6]])
  out = inputs.check_tokens(np.array([[5, 6]], np.uint8), 8)
  assert out.dtype == np.int32


@pytest.mark.parametrize(
  'tokens, match',
  [
    (np.array([1, 2, 3]), r'non-empty 2-D .* got shape \(3,\)'),
    (np.zeros((1, 2, 3), np.int32), r'2-D .* got shape \(1, 2, 3\)'),
    (np.zeros((0, 3), np.int32), r'non-empty .* got shape \(0, 3\)'),
    (np.zeros((2, 0), np.int32), r'non-empty .* got shape \(2, 0\)'),
    (np.ones((2, 3), np.float32), 'must be integers, got float32'),
    (np.array([[0, 8]]), r'ids must be in \[0, 8\), got \[0, 8\]'),
    (np.array([[-1, 2]]), r'ids must be in \[0, 8\), got \[-1, 2\]'),
  ],
)
def test_check_tokens_rejects_bad_encoder_tokens(tokens, match):
  with pytest.raises(ValueError, match=match):
    inputs.check_tokens(tokens, 8)


def _lm(vocab_size, vocabulary=None):
  return types.SimpleNamespace(vocab_size=vocab_size, vocabulary=vocabulary)


def test_check_pair_compares_size_then_vocabulary():
  with pytest.raises(ValueError, match='draft vocabulary size 9, target '):
    inputs.check_pair(_lm(8), _lm(9))
  with pytest.raises(ValueError, match='same size, different sentencepiece'):
    inputs.check_pair(_lm(8, 'spm_a'), _lm(8, 'spm_b'))
  # Equal, or a vocabulary on one side only: nothing to compare.
  for target, draft in (
    (_lm(8, 'spm_a'), _lm(8, 'spm_a')),
    (_lm(8), _lm(8)),
    (_lm(8, 'spm_a'), _lm(8)),
    (_lm(8), types.SimpleNamespace(vocab_size=8)),
  ):
    assert inputs.check_pair(target, draft) is None


def test_check_int_takes_ints_at_or_above_low():
  assert inputs.check_int('n', 3, 1) == 3
  out = inputs.check_int('n', np.int64(1), 1)
  assert out == 1 and type(out) is int
  for bad in (True, False, 2.0, np.float32(2), '2', None, 0, -5):
    with pytest.raises(ValueError, match=r'n must be an int >= 1, got '):
      inputs.check_int('n', bad, 1)


def _key_data(keys):
  return np.asarray(jax.random.key_data(keys))


def test_row_keys_from_an_int_seed_fold_in_the_row():
  keys = inputs.row_keys(11, 3)
  assert keys.shape == (3,)
  base = jax.random.key(11)
  for r in range(3):
    np.testing.assert_array_equal(
      _key_data(keys[r]), _key_data(jax.random.fold_in(base, r))
    )
  # numpy ints are ints; rows differ, and another seed gives other keys.
  np.testing.assert_array_equal(
    _key_data(inputs.row_keys(np.int32(11), 3)), _key_data(keys)
  )
  assert len({tuple(k) for k in _key_data(keys)}) == 3
  assert not np.array_equal(_key_data(inputs.row_keys(12, 3)), _key_data(keys))


def test_row_keys_from_a_seed_array_are_the_seeds_keys():
  seeds = np.array([5, 0, 5, 123456])
  keys = inputs.row_keys(seeds, 4)
  for r, s in enumerate(seeds):
    np.testing.assert_array_equal(
      _key_data(keys[r]), _key_data(jax.random.key(int(s)))
    )
  # Not the int seed's keys: row r of an array is key(seed[r]) itself.
  assert not np.array_equal(
    _key_data(inputs.row_keys(np.array([5, 5]), 2)),
    _key_data(inputs.row_keys(5, 2)),
  )


@pytest.mark.parametrize(
  'seed',
  [
    np.array([1, 2]),
    np.array([[1, 2, 3]]),
    np.array([1.0, 2.0, 3.0]),
    True,
    2.0,
    [1, 2, 3, 4],
  ],
)
def test_row_keys_rejects_a_bad_seed(seed):
  with pytest.raises(ValueError, match=r'seed must be an int or an int array'):
    inputs.row_keys(seed, 3)


def test_generate_and_beam_search_reject_another_vocabulary():
  target = sd.TableLM.random(8, seed=0).replace(vocabulary='spm_a')
  draft = sd.TableLM.random(8, seed=1).replace(vocabulary='spm_b')
  enc = np.array([[3, 4]], np.int32)
  match = 'same size, different sentencepiece'
  with pytest.raises(ValueError, match=match):
    sd.generate(target, enc, draft=draft, max_decode_len=4)
  with pytest.raises(ValueError, match=match):
    sd.beam_search(target, enc, num_beams=2, draft=draft, max_decode_len=4)
  # Control: the same draft with the target's vocabulary decodes.
  same = draft.replace(vocabulary='spm_a')
  out = sd.generate(target, enc, draft=same, gamma=2, max_decode_len=4)
  assert out.tokens.shape == (1, 4)

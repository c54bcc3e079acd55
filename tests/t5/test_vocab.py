"""Tests of the sentencepiece `Vocabulary` with T5's conventions."""

import pickle

import _vocab_util  # tests/ helper
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.t5 import vocab as vocab_lib


@pytest.fixture(scope='module')
def spm_file(tmp_path_factory):
  return _vocab_util.train(tmp_path_factory.mktemp('spm'))


@pytest.fixture(scope='module')
def vocab(spm_file):
  return vocab_lib.Vocabulary.from_file(spm_file)


def test_t5_special_ids_and_sizes(vocab):
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert vocab.base_vocab_size == 60
  assert vocab.extra_ids == 100
  assert vocab.vocab_size == 160
  assert vocab.extra_id(0) == 159
  assert vocab.extra_id(99) == 60
  with pytest.raises(ValueError, match='extra id 100'):
    vocab.extra_id(100)


def test_encode_decode_round_trip(vocab):
  text = 'the quick brown fox jumps over the lazy dog'
  ids = vocab.encode(text)
  assert ids and all(3 <= i < 60 for i in ids)
  assert vocab.decode(ids) == text
  assert vocab.decode(ids + [1, 5, 6]) == text  # stops at EOS
  assert vocab.decode([0] + ids + [0]) == text  # skips padding


def test_extra_ids_encode_and_decode(vocab):
  ids = vocab.encode('the cat <extra_id_0> on mat <extra_id_3>')
  assert ids.count(vocab.extra_id(0)) == 1
  assert ids[-1] == vocab.extra_id(3)
  assert vocab.decode(ids) == 'the cat<extra_id_0>on mat<extra_id_3>'
  # Ids past the vocabulary (models round V up) decode as unknown.
  assert vocab.decode([200]) == vocab.decode([vocab.unk_id])


def test_encode_batch_pads_truncates_and_appends_eos(vocab):
  texts = ['the quick brown fox jumps over the lazy dog', 'cat', '']
  batch = vocab.encode_batch(texts, max_len=6)
  assert batch.dtype == np.int32 and batch.shape == (3, 6)
  full = vocab.encode(texts[0])
  np.testing.assert_array_equal(batch[0], full[:5] + [1])
  cat = vocab.encode('cat')
  np.testing.assert_array_equal(batch[1], cat + [1] + [0] * (5 - len(cat)))
  np.testing.assert_array_equal(batch[2], [1, 0, 0, 0, 0, 0])
  auto = vocab.encode_batch(texts)
  assert auto.shape == (3, len(full) + 1)


def test_decode_batch_stops_at_eos(vocab):
  texts = ['the dog sat', 'a bird sang in tree']
  batch = vocab.encode_batch(texts, max_len=12)
  batch[0, -1] = 7  # garbage after EOS and padding is ignored
  assert vocab.decode_batch(batch) == texts


def test_hash_and_equality_by_content(spm_file, vocab, tmp_path):
  same = vocab_lib.Vocabulary.from_file(spm_file)
  assert same == vocab and hash(same) == hash(vocab)
  assert same is not vocab
  fewer = vocab_lib.Vocabulary.from_file(spm_file, extra_ids=10)
  assert fewer != vocab
  other = _vocab_util.vocabulary(tmp_path, vocab_size=50)
  assert other != vocab
  assert len({vocab, same, fewer, other}) == 3
  restored = pickle.loads(pickle.dumps(vocab))
  assert restored == vocab and restored.serialized == vocab.serialized


def test_vocabulary_is_static_under_jit(vocab):
  cfg = sd.T5Config(
    vocab_size=160, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
    num_encoder_layers=1, num_decoder_layers=1,
  )  # fmt: skip
  model = sd.Model.init(cfg, vocabulary=vocab)
  traces = []

  @jax.jit
  def f(m):
    traces.append(m.vocabulary)
    return jnp.sum(m.params['token_embedder']['embedding'])

  f(model)
  f(sd.Model(cfg, model.params, vocab_lib.Vocabulary(vocab.serialized)))
  assert len(traces) == 1  # an equal vocabulary hits the jit cache


def test_check_compatible(vocab, tmp_path):
  vocab_lib.check_compatible(vocab, vocab)
  vocab_lib.check_compatible(vocab, None)
  other = _vocab_util.vocabulary(tmp_path, vocab_size=50)
  with pytest.raises(ValueError, match='vocabularies differ'):
    vocab_lib.check_compatible(vocab, other)


def test_bad_files(tmp_path):
  with pytest.raises(FileNotFoundError, match='nope.model'):
    vocab_lib.Vocabulary.from_file(tmp_path / 'nope.model')
  junk = tmp_path / 'junk.model'
  junk.write_bytes(b'not a model')
  with pytest.raises(ValueError, match='junk.model'):
    vocab_lib.Vocabulary.from_file(junk)


def test_rejects_non_t5_special_ids(tmp_path):
  import sentencepiece as spm  # noqa: PLC0415

  text = tmp_path / 'c.txt'
  text.write_text('\n'.join(_vocab_util.corpus()))
  spm.SentencePieceTrainer.train(
    input=str(text),
    model_prefix=str(tmp_path / 'default'),
    vocab_size=40,
    minloglevel=2,
    hard_vocab_limit=False,
  )  # fmt: skip  (sentencepiece's defaults: unk 0, bos 1, eos 2)
  with pytest.raises(ValueError, match=r'\(pad, eos, unk\)'):
    vocab_lib.Vocabulary.from_file(tmp_path / 'default.model')

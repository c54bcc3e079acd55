"""ByT5's byte vocabulary (seqio semantics; HF ByT5 dirs, T5X gin files, our
format, convert) and vocabulary checks made before any weight is read."""

import json

import _vocab_util
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.checkpoints import convert
from spec_decode.checkpoints import loader
from spec_decode.checkpoints.assemble import CheckpointError
from spec_decode.t5 import gin_file
from spec_decode.t5.byte_vocab import ByteVocabulary

BYT5 = sd.T5Config(
  vocab_size=384, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=24,
  num_encoder_layers=1, num_decoder_layers=1,
  mlp_activations=('gelu', 'linear'), dropout_rate=0.0,
)  # fmt: skip


def test_byte_vocabulary_is_seqio_bytes_plus_three():
  v = ByteVocabulary(extra_ids=125)
  assert v.vocab_size == 384 and v.base_vocab_size == 259
  assert v.encode('hé') == [ord('h') + 3, 0xC3 + 3, 0xA9 + 3]
  assert v.decode(v.encode('hé <extra_id_0>x') + [1, 50]) == 'hé <extra_id_0>x'
  assert v.extra_id(0) == 383
  np.testing.assert_array_equal(v.encode_batch(['a'], 3), [[100, 1, 0]])
  assert v == ByteVocabulary(125) and v != ByteVocabulary(0)
  assert v.decode([0xC3 + 3]) == ''  # a broken UTF-8 byte is dropped


def test_hf_byt5_directory_gets_the_byte_vocabulary(tmp_path):
  sd.Model.init(BYT5, vocabulary=ByteVocabulary(125)).save(str(tmp_path / 'o'))
  m = sd.Model.load(str(tmp_path / 'o'))
  assert m.vocabulary == ByteVocabulary(125)
  from spec_decode.checkpoints import huggingface

  huggingface.save_safetensors(m, str(tmp_path / 'hf'))
  assert not (tmp_path / 'hf' / 'spiece.model').exists()
  # An HF ByT5 directory numbers sentinels as transformers does.
  assert sd.Model.load(str(tmp_path / 'hf')).vocabulary == ByteVocabulary(
    125, sentinels='hf'
  )


def test_t5x_gin_byte_vocabulary(tmp_path):
  gin = tmp_path / 'byt5.gin'
  gin.write_text(
    'from __gin__ import dynamic_registration\nimport seqio\n'
    'from t5x.examples.t5 import network\n'
    'VOCABULARY = @seqio.ByteVocabulary()\n'
    'network.T5Config.vocab_size = 384\n'
  )
  mf = gin_file.read(str(gin))
  assert mf.byte_vocabulary
  assert mf.local_vocabulary() == ByteVocabulary(0)


def test_convert_with_byte_flag(tmp_path):
  src = tmp_path / 'src'
  sd.Model.init(BYT5).save(str(src))
  rc = convert.main(
    ['--from', str(src), '--to', str(tmp_path / 'out'), '--vocab', 'byte']
  )
  assert rc == 0
  info = json.loads((tmp_path / 'out' / 'vocabulary.json').read_text())
  assert info == {'type': 'byte', 'extra_ids': 100}
  assert sd.Model.load(str(tmp_path / 'out')).vocabulary == ByteVocabulary(100)


def _no_weight_reads(monkeypatch):
  def fail(*a, **k):
    raise AssertionError('weights were read')

  monkeypatch.setattr(loader.assemble, 'assemble_params', fail)
  monkeypatch.setattr(loader, '_restore_orbax', fail)


@pytest.mark.parametrize('rows', [128, 64 + 160 + 128])
def test_bad_vocabulary_refused_before_weights(tmp_path, monkeypatch, rows):
  """160 ids on 128 rows (too many) or on 352 rows (more than padding)."""
  vocab = _vocab_util.vocabulary(tmp_path)
  cfg = BYT5.replace(vocab_size=rows)
  sd.Model.init(cfg).save(str(tmp_path / 'm'))
  _no_weight_reads(monkeypatch)
  with pytest.raises(CheckpointError, match='160 ids'):
    sd.Model.load(str(tmp_path / 'm'), vocabulary=vocab)


@pytest.mark.parametrize(
  'vocab, rows, ids',
  [('spm', 128, 160), ('spm', 352, 160), ('byte', 128, 259)],
)
def test_gin_file_vocabulary_refused_before_weights(
  tmp_path, monkeypatch, vocab, rows, ids
):
  """The gin file's vocabulary (T5X stores none) is size-checked like a
  passed one: too many ids for the rows, or fewer by more than padding."""
  if vocab == 'spm':
    spm = _vocab_util.train(tmp_path)
    named = (
      'VOCABULARY = @seqio.SentencePieceVocabulary()\n'
      f'seqio.SentencePieceVocabulary.sentencepiece_model_file = "{spm}"\n'
      'seqio.SentencePieceVocabulary.extra_ids = 100\n'
    )
  else:
    named = 'VOCABULARY = @seqio.ByteVocabulary()\n'
  gin = tmp_path / 'model.gin'
  gin.write_text(
    'from __gin__ import dynamic_registration\nimport seqio\n'
    'from t5x.examples.t5 import network\n'
    f'{named}network.T5Config:\n  vocab_size = {rows}\n  emb_dim = 16\n'
    '  num_heads = 2\n  head_dim = 8\n  mlp_dim = 24\n'
    '  num_encoder_layers = 1\n  num_decoder_layers = 1\n'
    "  mlp_activations = ('gelu', 'linear')\n  dropout_rate = 0.0\n"
  )
  sd.Model.init(BYT5.replace(vocab_size=rows)).save(str(tmp_path / 'm'))
  _no_weight_reads(monkeypatch)
  with pytest.raises(CheckpointError, match=f'{ids} ids .* {rows} embedding'):
    sd.Model.load(str(tmp_path / 'm'), gin_file=str(gin))


SENTINEL_TEXTS = [
  'a<extra_id_0>b<extra_id_1> é<extra_id_124>',
  ' <extra_id_7> spaced <extra_id_3>end',
  'out of range <extra_id_125>, plain ünïcode',
]


def test_hf_directory_numbers_sentinels_as_transformers_byt5(tmp_path):
  """An HF ByT5 directory: `<extra_id_i>` is 259 + i, as transformers'
  ByT5Tokenizer (saved here by its own class) numbers it, both ways."""
  transformers = pytest.importorskip('transformers')
  from spec_decode.checkpoints import huggingface

  tok = transformers.ByT5Tokenizer()
  tok.save_pretrained(str(tmp_path))
  ours = huggingface.load_vocabulary(str(tmp_path))
  assert ours == ByteVocabulary(125, sentinels='hf') and ours.vocab_size == 384
  assert ours.extra_id(0) == 259 == tok.convert_tokens_to_ids('<extra_id_0>')
  for text in SENTINEL_TEXTS:
    ids = tok(text).input_ids
    assert ours.encode(text) + [1] == ids, text
    assert ours.decode(ids) == text == tok.decode(ids[:-1])
  # Our format keeps the numbering; seqio's is another vocabulary.
  sd.Model.init(BYT5, vocabulary=ours).save(str(tmp_path / 'o'))
  assert (
    sd.Model.load(str(tmp_path / 'o')).vocabulary
    == ours
    != (ByteVocabulary(125))
  )


def test_seqio_numbering_keeps_sentinel_text_as_bytes():
  """T5X gin files (seqio): text is bytes only, extra ids decode to
  nothing, `extra_id(0)` is the top id (span corruption's sentinel)."""
  v = ByteVocabulary(125)
  for text in SENTINEL_TEXTS:
    ids = v.encode(text)
    assert ids == [b + 3 for b in text.encode()]
    assert v.decode(ids) == text
  assert v.extra_id(0) == 383 and v.decode([100, 383, 259, 101]) == 'ab'

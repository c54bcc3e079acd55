"""`spec-decode convert` of T5Gemma and T5Gemma 2, both ways.

A tiny random model saved by transformers' own class (with a Gemma
sentencepiece `tokenizer.model`) -> ours -> back to a Hugging Face
directory (sharded): transformers' `from_pretrained` reads it with the
same config, and its float32 logits equal the original's exactly (the
same weights through the same code). Our model loaded from the converted
directory gives exactly the logits of our model loaded from the Hugging
Face directory. Wrong family, version or direction is refused before any
weight is read.
"""

import json
import os

import numpy as np
import pytest
from _t5gemma_util import ENCODER
from _t5gemma_util import gemma_tokenizer
from _t5gemma_util import hf_logits
from _t5gemma_util import hf_model
from _t5gemma_util import save

import spec_decode as sd
from spec_decode import checkpoints
from spec_decode.checkpoints import convert
from spec_decode.checkpoints import huggingface
from spec_decode.checkpoints import t5gemma_export
from spec_decode.checkpoints.t5gemma_hf import GemmaVocabulary

transformers = pytest.importorskip('transformers')

DECODER = np.array([[2, 5, 6, 7, 8, 9, 10, 11]] * 3)
CLASSES = {
  1: 'T5GemmaForConditionalGeneration',
  2: 'T5Gemma2ForConditionalGeneration',
}


def _gemma_tokenizer(path, tmp_path) -> None:
  """Gemma's special ids, fewer pieces than the tiny models' 128 rows."""
  gemma_tokenizer(path, tmp_path, lines=300, vocab_size=100)


@pytest.fixture(scope='module', params=[1, 2], ids=['t5gemma', 't5gemma2'])
def source(request, tmp_path_factory):
  """(version, transformers model, its saved directory with a vocabulary)."""
  tmp = tmp_path_factory.mktemp(f'v{request.param}')
  hf = hf_model(request.param)
  path = save(hf, tmp / 'hf')
  _gemma_tokenizer(path, tmp)
  return request.param, hf, path


def _load_hf(version: int, path: str):
  cls = getattr(transformers, CLASSES[version])
  model, info = cls.from_pretrained(
    path, attn_implementation='eager', output_loading_info=True
  )
  return model.eval(), info


def test_round_trip(source, tmp_path, capsys):
  version, hf, path = source
  model_type = 't5gemma2' if version == 2 else 't5gemma'
  ours = str(tmp_path / 'ours')
  argv = ['--from', path, '--to', ours, '--model_type', model_type]
  assert convert.main(argv) == 0
  assert 'converted huggingface checkpoint' in capsys.readouterr().out
  assert os.path.isfile(os.path.join(ours, t5gemma_export.HF_CONFIG_FILE))

  # Ours, loaded from our directory alone: the same model as from the HF one.
  direct, converted = sd.Model.load(path), sd.Model.load(ours)
  assert isinstance(converted, sd.T5GemmaModel)
  assert converted.config == direct.config
  assert isinstance(converted.vocabulary, GemmaVocabulary)
  assert converted.vocabulary == direct.vocabulary
  np.testing.assert_array_equal(
    np.asarray(converted.logits(ENCODER, DECODER)),
    np.asarray(direct.logits(ENCODER, DECODER)),
  )

  # Back, sharded: transformers reads it with the same config and weights.
  back = str(tmp_path / 'back')
  argv = ['--from', ours, '--to', back, '--to_format', 'huggingface',
          '--max_shard_size', '20KB']  # fmt: skip
  assert convert.main(argv) == 0
  assert os.path.isfile(os.path.join(back, huggingface.SAFETENSORS_INDEX))
  assert os.path.isfile(os.path.join(back, 'tokenizer.model'))
  reread, info = _load_hf(version, back)
  # Text only: T5Gemma 2's vision tower is not carried (random on load).
  missing = [k for k in info['missing_keys'] if '.vision_tower.' not in k
             and '.multi_modal_projector.' not in k]  # fmt: skip
  assert not missing and not info['unexpected_keys']
  assert (version == 2) == bool(info['missing_keys'])
  original, _ = _load_hf(version, path)  # The config as read from disk.
  want, got = original.config.to_dict(), reread.config.to_dict()
  differ = {k for k in set(want) | set(got) if want.get(k) != got.get(k)}
  assert differ <= {'_name_or_path'}, differ
  np.testing.assert_array_equal(
    hf_logits(reread, ENCODER, DECODER), hf_logits(hf, ENCODER, DECODER)
  )
  # And our reader reads what we wrote.
  np.testing.assert_array_equal(
    np.asarray(sd.Model.load(back).logits(ENCODER, DECODER)),
    np.asarray(direct.logits(ENCODER, DECODER)),
  )


def test_back_without_the_kept_config(source, tmp_path):
  """A T5Gemma checkpoint that never was a Hugging Face directory (random
  weights saved by us): the fields we do not model take transformers'
  defaults, and transformers computes the same function as our model."""
  version, _, path = source
  model = sd.Model.load(path)
  ours = str(tmp_path / 'ours')
  checkpoints.write(ours, model.config, model.params, model.vocabulary)
  back = str(tmp_path / 'back')
  argv = ['--from', ours, '--to', back, '--to_format', 'huggingface']
  assert convert.main(argv) == 0
  assert os.path.isfile(os.path.join(back, huggingface.SAFETENSORS_FILE))
  reread, _ = _load_hf(version, back)
  with open(os.path.join(back, 'config.json')) as f:
    model_type = json.load(f)['model_type']
  assert model_type == ('t5gemma2' if version == 2 else 't5gemma')
  np.testing.assert_allclose(
    hf_logits(reread, ENCODER, DECODER),
    np.asarray(model.logits(ENCODER, DECODER), np.float64),
    atol=1e-4,
  )


def _no_weights(monkeypatch):
  """Reading any weight file fails loudly: the errors below come first."""

  def refuse(*args, **kwargs):
    raise AssertionError('weights were read')

  monkeypatch.setattr(huggingface, 'weight_files', refuse)


def test_wrong_family_version_or_direction(source, tmp_path, capsys,
                                           monkeypatch):  # fmt: skip
  version, _, path = source
  other = 't5gemma' if version == 2 else 't5gemma2'
  ours = str(tmp_path / 'ours')
  assert convert.main(['--from', path, '--to', ours]) == 0
  capsys.readouterr()
  _no_weights(monkeypatch)

  def error(argv) -> str:
    assert convert.main(argv) == 1
    return capsys.readouterr().err

  # Another version, another family, stated or by a gin file.
  assert f'--model_type {other}' in error(
    ['--from', path, '--to', str(tmp_path / 'a'), '--model_type', other]
  )
  assert 'not T5 (--model_type t5)' in error(
    ['--from', ours, '--to', str(tmp_path / 'b'), '--model_type', 't5']
  )
  gin = 'models/t5gemma/s_s.gin'
  gin = gin if version == 2 else 'models/t5gemma2/270m_270m.gin'
  assert f'version {version} checkpoint' in error(
    ['--from', path, '--to', str(tmp_path / 'c'), '--gin_file', gin]
  )
  assert 'T5 one' in error(
    ['--from', path, '--to', str(tmp_path / 'd'), '--gin_file', 't5_1_1_small']
  )
  with pytest.raises(sd.CheckpointError, match='is a T5 one'):
    checkpoints.read(ours, config=sd.T5Config.from_gin('t5_1_1_tiny'))
  # Direction: an HF directory is not written back to HF; T5 is not exported.
  assert 'convert it to ours first' in error(
    ['--from', path, '--to', str(tmp_path / 'e'), '--to_format', 'huggingface']
  )
  t5 = str(tmp_path / 't5')
  sd.Model.from_gin('t5_1_1_tiny', vocab_size=32).save(t5)
  assert 'is a T5 checkpoint' in error(
    ['--from', t5, '--to', str(tmp_path / 'f'), '--to_format', 'huggingface']
  )
  with pytest.raises(sd.CheckpointError, match='is a T5Gemma one'):
    sd.Model.load(t5, gin_file='models/t5gemma/s_s.gin')
  assert 'drop --config, --gin_file' in error(
    ['--from', ours, '--to', str(tmp_path / 'g'), '--to_format', 'huggingface',
     '--gin_file', 'models/t5gemma/s_s.gin']
  )  # fmt: skip
  assert not any(os.path.exists(tmp_path / x) for x in 'abcdefg')

"""`spec-decode convert` of the issue-29 families, and our HF writer read
back by transformers.

Sources: a scanned T5X `scalable_t5` checkpoint (layers stacked on axis 1,
with its gin file) and HF directories saved by transformers' own classes
(UMT5, mT5 as transformers 5 saves it, LongT5 transient-global). Each is
converted to our format, loaded with `Model.load(DIR)` alone, and must give
transformers' teacher-forced log-probs within 1e-4 (float32).

Our HF writer (`huggingface.save_safetensors`) names UMT5 and LongT5 by
their `model_type`: transformers' `AutoModelForSeq2SeqLM.from_pretrained`
on the directory we write must build that family's class and give the
original model's log-probs.
"""

import numpy as np
import pytest
import test_hf_families as families  # same folder
import test_t5x_scanned as scanned  # same folder

import spec_decode as sd
from spec_decode.checkpoints import convert
from spec_decode.checkpoints import huggingface

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

HF_SOURCES = ['umt5_tied_scaled', 'umt5_hub_config', 'mt5_transformers5',
              'longt5_tglobal']  # fmt: skip
CLASSES = {
  'umt5_tied_scaled': 'UMT5ForConditionalGeneration',
  'umt5_hub_config': 'UMT5ForConditionalGeneration',
  'longt5_local': 'LongT5ForConditionalGeneration',
  'longt5_tglobal': 'LongT5ForConditionalGeneration',
}


def _close_to(hf, model):
  enc, dec = families._inputs(model.config.vocab_size)
  want = families._hf_log_probs(hf, enc, dec)
  np.testing.assert_allclose(
    np.asarray(model.log_probs(enc, dec[:, 1:])), want, atol=1e-4, rtol=0
  )


def _saved(name, tmp_path):
  hf = families._build(name)
  d = tmp_path / name
  hf.save_pretrained(d)
  hub = families.FAMILIES[name][4]
  if hub:
    import json  # pylint: disable=g-import-not-at-top

    cfg = json.loads((d / 'config.json').read_text())
    cfg.pop('scale_decoder_outputs', None)
    cfg.update(hub)
    (d / 'config.json').write_text(json.dumps(cfg))
  return hf, str(d)


def test_convert_a_scanned_t5x_checkpoint(tmp_path, capsys):
  hf, d = _saved('umt5_tied_scaled', tmp_path)
  ckpt, gin = scanned._write(tmp_path, sd.Model.load(d), scan_axis=1)
  out = str(tmp_path / 'ours')
  assert convert.main(['--from', ckpt, '--to', out, '--gin_file', gin]) == 0
  assert 'converted t5x checkpoint' in capsys.readouterr().out
  loaded = sd.Model.load(out)
  assert loaded.config.per_layer_relpos_bias
  _close_to(hf, loaded)


@pytest.mark.parametrize('name', HF_SOURCES)
def test_convert_an_hf_directory(tmp_path, name, capsys):
  hf, d = _saved(name, tmp_path)
  out = str(tmp_path / 'ours')
  assert convert.main(['--from', d, '--to', out]) == 0
  assert 'converted huggingface checkpoint' in capsys.readouterr().out.lower()
  _close_to(hf, sd.Model.load(out))


@pytest.mark.parametrize('name', sorted(CLASSES))
def test_transformers_reads_what_we_write(tmp_path, name):
  hf, d = _saved(name, tmp_path)
  ours = sd.Model.load(d)
  out = tmp_path / 'written'
  huggingface.save_safetensors(ours, str(out))
  back = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
  assert type(back).__name__ == CLASSES[name]
  enc, dec = families._inputs(ours.config.vocab_size)
  np.testing.assert_allclose(
    families._hf_log_probs(back, enc, dec),
    families._hf_log_probs(hf, enc, dec),
    atol=1e-5,
    rtol=0,
  )
  _close_to(back, ours)

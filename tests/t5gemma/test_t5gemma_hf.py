"""T5Gemma and T5Gemma 2 against transformers: loading, teacher-forced
log-probabilities judged against a float64 reference, greedy `generate`.

The models are tiny random ones saved by transformers' own classes
(`_t5gemma_util.py`): a window of 4 under inputs of 12, GQA, soft-caps that
bite, ragged padding.
"""

import json
import os

import jax
import numpy as np
import pytest
from _t5gemma_util import ENCODER
from _t5gemma_util import V
from _t5gemma_util import gemma_tokenizer
from _t5gemma_util import hf_greedy
from _t5gemma_util import hf_logits
from _t5gemma_util import hf_model
from _t5gemma_util import hf_reference64
from _t5gemma_util import save

import spec_decode as sd
from spec_decode.checkpoints.t5gemma_hf import GemmaVocabulary

pytest.importorskip('transformers')


@pytest.fixture(scope='module', params=[1, 2], ids=['t5gemma', 't5gemma2'])
def pair(request, tmp_path_factory):
  """(transformers model, our model loaded from its saved directory)."""
  hf = hf_model(request.param)
  path = save(hf, tmp_path_factory.mktemp(f'v{request.param}'))
  return hf, sd.Model.load(path)


def _log_softmax(x: np.ndarray) -> np.ndarray:
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_load_gives_a_t5gemma_model(pair):
  hf, model = pair
  assert isinstance(model, sd.T5GemmaModel)
  version = 2 if 'Gemma2' in type(hf).__name__ else 1
  cfg = model.config
  assert cfg.version == version
  assert cfg.encoder.sliding_window == 4
  assert (cfg.decoder.num_heads, cfg.decoder.num_kv_heads) == (4, 2)
  assert cfg.final_logit_softcap == 1.0
  if version == 2:
    assert cfg.decoder.rope_local.theta != cfg.decoder.rope_global.theta


def test_log_probs_as_close_to_float64_as_transformers_float32(pair):
  """Three batches of 16 decoder inputs (4x the window) over ragged rows:
  our float32 log-probs against transformers' float64 ones (row by row
  without padding: `hf_reference64`), pooled, are at most 1.5x as far on
  average and 2x at worst as transformers' own float32 run (measured:
  1.0-1.4x on average, 1.1-1.6x at worst)."""
  hf, model = pair
  ours_err, theirs_err = [], []
  for seed in range(3):
    dec = np.random.default_rng(seed).integers(3, V, (3, 16))
    dec[:, 0] = 2
    ref = _log_softmax(hf_reference64(hf, ENCODER, dec))
    theirs = _log_softmax(hf_logits(hf, ENCODER, dec))
    ours = _log_softmax(np.asarray(model.logits(ENCODER, dec), np.float64))
    assert np.isfinite(ref).all() and np.isfinite(ours).all()
    ours_err.append(np.abs(ours - ref))
    theirs_err.append(np.abs(theirs - ref))
  ours_err, theirs_err = np.stack(ours_err), np.stack(theirs_err)
  assert ours_err.mean() <= 1.5 * theirs_err.mean()
  assert ours_err.max() <= 2.0 * theirs_err.max()
  # `log_probs` is the same computation, BOS prepended.
  targets = dec[:, 1:]
  lp = np.asarray(model.log_probs(ENCODER, targets))
  expect = np.take_along_axis(ref[:, :-1], targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(lp, expect, atol=1e-4)


def test_greedy_matches_transformers_generate(pair):
  """40 tokens, ten windows: the sliding layers' ring buffer wraps."""
  hf, model = pair
  expect = hf_greedy(hf, ENCODER, 40)
  out = sd.generate(model, ENCODER, max_decode_len=40)
  np.testing.assert_array_equal(out.tokens, expect)
  assert len(np.unique(expect)) > 10  # The outputs are not one repeated id.


def test_sharded_safetensors_load_the_same(pair, tmp_path):
  hf, model = pair
  path = save(hf, tmp_path / 'sharded', max_shard_size='20KB')
  assert os.path.exists(os.path.join(path, 'model.safetensors.index.json'))
  sharded = sd.Model.load(path)
  for a, b in zip(
    jax.tree.leaves(model.params), jax.tree.leaves(sharded.params), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_vocabulary_checked_before_weights(pair, tmp_path):
  """A tokenizer.model with more ids than embedding rows is refused
  before any weight is read (the weights file is removed: reading it would
  fail differently)."""

  hf, _ = pair
  path = save(hf, tmp_path / 'vocab')
  gemma_tokenizer(path, tmp_path, lines=900, vocab_size=160)
  os.remove(os.path.join(path, 'model.safetensors'))
  with open(os.path.join(path, 'model.safetensors'), 'w') as f:
    f.write('not weights')
  vocab = GemmaVocabulary.from_file(path + '/tokenizer.model', extra_ids=0)
  assert vocab.vocab_size > V
  with pytest.raises(sd.CheckpointError, match='not this model'):
    sd.Model.load(path)


def test_unknown_rope_type_is_refused(pair, tmp_path):
  hf, _ = pair
  path = save(hf, tmp_path / 'rope')
  file = os.path.join(path, 'config.json')
  with open(file) as f:
    cfg = json.load(f)
  dec = cfg['decoder']
  rope = dec['rope_parameters']
  target = rope.get('full_attention', rope)
  target['rope_type'] = 'yarn'
  with open(file, 'w') as f:
    json.dump(cfg, f)
  with pytest.raises(sd.CheckpointError, match='rope_type'):
    sd.Model.load(path)

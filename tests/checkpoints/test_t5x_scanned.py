"""T5X `scalable_t5` checkpoints (scanned or not) against transformers' UMT5.

`scalable_t5` is the network HF calls UMT5 (a relative position table per
layer). A tiny `UMT5ForConditionalGeneration` is loaded from its HF
directory, written in scalable_t5's T5X layout (3-D attention kernels;
scanned: every layer stacked on one axis under `encoder/encoder/...`), and
loaded back with a scalable_t5-style gin file (`scan_layers`,
`param_scan_axis`, `remat_policy` and partitioning bindings included): the
log-probs must be transformers' within 1e-4 and greedy decoding its tokens.
"""

import types

import flax.traverse_util
import jax
import numpy as np
import pytest
import test_hf_families as families  # same folder

import spec_decode as sd
from spec_decode.checkpoints import t5x
from spec_decode.checkpoints.assemble import CheckpointError

torch = pytest.importorskip('torch')

GIN = """\
from __gin__ import dynamic_registration
import seqio
from t5x import models
from t5x import partitioning
from t5x.examples.scalable_t5 import network

VOCABULARY = @seqio.SentencePieceVocabulary()
seqio.SentencePieceVocabulary.sentencepiece_model_file = "gs://none/x.model"
MODEL = @models.EncoderDecoderModel()
models.EncoderDecoderModel:
  module = @network.Transformer()
  input_vocabulary = %VOCABULARY
  output_vocabulary = %VOCABULARY
network.Transformer.config = @network.T5Config()
network.T5Config:
  vocab_size = 256
  dtype = 'float32'
  emb_dim = 32
  num_heads = 4
  num_encoder_layers = 2
  num_decoder_layers = 2
  head_dim = 8
  mlp_dim = 48
  mlp_activations = ('gelu', 'linear')
  dropout_rate = 0.0
  logits_via_embedding = True
  relative_attention_num_buckets = 8
  relative_attention_max_distance = 20
  scan_layers = {scan}
  param_scan_axis = 1
  remat_policy = 'minimal'
partitioning.PjitPartitioner.model_parallel_submesh = (1, 1, 1, 1)
"""


@pytest.fixture(scope='module')
def umt5(tmp_path_factory):
  hf = families._build('umt5_tied_scaled')
  d = tmp_path_factory.mktemp('umt5')
  hf.save_pretrained(d)
  return hf, sd.Model.load(str(d))


def _scalable_tree(model, scan_axis=None):
  """`model.params` in scalable_t5's layout (stacked on `scan_axis`)."""
  cfg = model.config
  flat = flax.traverse_util.flatten_dict(model.params, sep='/')
  out, stacks = {}, {}
  for name, arr in flat.items():
    arr = np.asarray(arr)
    parts = name.split('/')
    if parts[-2] in ('query', 'key', 'value') and 'attention' in name:
      arr = arr.reshape(arr.shape[0], cfg.num_heads, cfg.head_dim)
    elif parts[-2] == 'out':
      arr = arr.reshape(cfg.num_heads, cfg.head_dim, arr.shape[1])
    if scan_axis is None or not parts[1].startswith('layers_'):
      out[name] = arr
      continue
    key = '/'.join([parts[0], parts[0]] + parts[2:])
    stacks.setdefault(key, {})[int(parts[1][7:])] = arr
  for key, layers in stacks.items():
    out[key] = np.stack([layers[i] for i in sorted(layers)], axis=scan_axis)
  return flax.traverse_util.unflatten_dict(out, sep='/')


def _write(tmp_path, model, scan_axis):
  ckpt = tmp_path / 'checkpoint_1'
  t5x.save(types.SimpleNamespace(params=_scalable_tree(model, scan_axis)), ckpt)
  gin = tmp_path / 'model.gin'
  gin.write_text(GIN.format(scan=scan_axis is not None))
  return str(ckpt), str(gin)


@pytest.mark.parametrize('scan_axis', [1, 0, None])
def test_scalable_t5_checkpoint_matches_transformers(umt5, tmp_path, scan_axis):
  """Axis 0 with a gin file that says 1: the shapes decide."""
  hf, model = umt5
  ckpt, gin = _write(tmp_path, model, scan_axis)
  if scan_axis is not None:
    stored = t5x.T5XSource(ckpt).shapes()
    q = stored['encoder/encoder/attention/query/kernel']
    assert q[scan_axis] == 2 and len(q) == 4
  loaded = sd.Model.load(ckpt, gin_file=gin)
  assert loaded.config.per_layer_relpos_bias
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
    loaded.params,
    model.params,
  )
  enc, dec = families._inputs(256)
  np.testing.assert_allclose(
    np.asarray(loaded.log_probs(enc, dec[:, 1:])),
    families._hf_log_probs(hf, enc, dec),
    atol=1e-4,
    rtol=0,
  )
  enc, _ = families._inputs(256, seed=1)
  out = sd.generate(loaded, enc, temperature=0.0, max_decode_len=10)
  np.testing.assert_array_equal(out.tokens, families._hf_greedy(hf, enc))


def test_per_layer_checkpoint_with_per_stack_config_says_why(umt5, tmp_path):
  _, model = umt5
  ckpt, _ = _write(tmp_path, model, 1)
  config = model.config.replace(per_layer_relpos_bias=False)
  with pytest.raises(CheckpointError, match='relative position table per'):
    sd.Model.load(ckpt, config=config)


def test_wrong_layer_count_is_named(umt5, tmp_path):
  _, model = umt5
  ckpt, _ = _write(tmp_path, model, 1)
  config = model.config.replace(num_encoder_layers=3)
  with pytest.raises(CheckpointError, match='layer'):
    sd.Model.load(ckpt, config=config)


def test_other_mismatch_of_a_scanned_checkpoint_gets_no_per_stack_hint(
  umt5, tmp_path
):
  """A scanned per-layer checkpoint under an untied-head config: the error
  names the head, not a per-stack table it does not have."""
  _, model = umt5
  ckpt, _ = _write(tmp_path, model, 1)
  config = model.config.replace(logits_via_embedding=False)
  with pytest.raises(CheckpointError) as e:
    sd.Model.load(ckpt, config=config)
  assert 'logits_dense' in str(e.value) and 'per stack' not in str(e.value)

"""Tests of checkpoint loading and saving in every format, and bad input.

Our orbax format must round-trip bit for bit; a T5X-layout checkpoint and a
Hugging Face directory written from a model must load into that model's
exact weights; every malformed input must raise an error that names the file
or the mismatch. Models are tiny; none of this needs torch.
"""

import json
import os
import shutil

import _vocab_util  # tests/ helper
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gin
import spec_decode as sd
from spec_decode import checkpoints
from spec_decode import paths
from spec_decode.checkpoints import convert
from spec_decode.checkpoints import huggingface
from spec_decode.checkpoints import t5x
from spec_decode.checkpoints.assemble import CheckpointError

V11 = sd.T5Config(
  vocab_size=192, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=24,
  num_encoder_layers=2, num_decoder_layers=1,
  mlp_activations=('gelu', 'linear'), logits_via_embedding=False,
  relative_attention_num_buckets=8, relative_attention_max_distance=16,
)  # fmt: skip
ORIGINAL = V11.replace(mlp_activations=('relu',), logits_via_embedding=True)


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
  return _vocab_util.vocabulary(tmp_path_factory.mktemp('spm'))


@pytest.fixture(scope='module', params=['v1_1', 'original'])
def model(request, vocab):
  cfg = V11 if request.param == 'v1_1' else ORIGINAL
  return sd.Model.init(cfg, seed=3, vocabulary=vocab)


def _assert_same_params(a, b):
  fa = flax.traverse_util.flatten_dict(a, sep='/')
  fb = flax.traverse_util.flatten_dict(b, sep='/')
  assert sorted(fa) == sorted(fb)
  for k in fa:
    assert fa[k].dtype == fb[k].dtype, k
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), k)


def _greedy(model, enc, steps=6):
  dec = np.zeros((enc.shape[0], steps + 1), np.int32)
  for t in range(steps):  # One shape: causal attention ignores later zeros.
    logits = np.asarray(model.logits(enc, dec[:, :-1]))
    dec[:, t + 1] = logits[:, t].argmax(-1)
  return dec[:, 1:]


ENC = np.array([[5, 9, 12, 30, 1], [7, 8, 1, 0, 0]], np.int32)


# -- our format ---------------------------------------------------------------
def test_orbax_round_trip(model, tmp_path):
  model.save(str(tmp_path / 'ckpt'))
  assert sorted(os.listdir(tmp_path / 'ckpt')) == [
    'config.json', 'params', 'spiece.model', 'vocabulary.json',
  ]  # fmt: skip
  loaded = sd.Model.load(str(tmp_path / 'ckpt'))
  assert loaded.config == model.config
  assert loaded.vocabulary == model.vocabulary
  assert loaded.vocabulary.extra_ids == 100
  _assert_same_params(loaded.params, model.params)


def test_orbax_load_to_bfloat16(model, tmp_path):
  model.save(str(tmp_path / 'ckpt'))
  loaded = sd.Model.load(str(tmp_path / 'ckpt'), dtype='bfloat16')
  assert loaded.config == model.config.replace(param_dtype=jnp.bfloat16)
  _assert_same_params(
    loaded.params, jax.tree.map(lambda x: x.astype(jnp.bfloat16), model.params)
  )


def test_orbax_without_vocabulary(tmp_path):
  m = sd.Model.init(V11, seed=1)
  m.save(str(tmp_path / 'c'))
  assert sd.Model.load(str(tmp_path / 'c')).vocabulary is None


def test_save_refuses_non_empty_dir(model, tmp_path):
  (tmp_path / 'x').write_text('keep me')
  with pytest.raises(FileExistsError, match=str(tmp_path)):
    model.save(str(tmp_path))


def test_orbax_config_mismatch_names_parameters(model, tmp_path):
  model.save(str(tmp_path / 'ckpt'))
  wrong = model.config.replace(mlp_dim=32)
  with pytest.raises(CheckpointError, match=r'mlp/wo/kernel.*\(24, 16\)'):
    sd.Model.load(str(tmp_path / 'ckpt'), config=wrong)


# -- T5X ----------------------------------------------------------------------
def test_t5x_layout(model, tmp_path):
  ckpt = tmp_path / 'checkpoint_100'
  t5x.save(model, str(ckpt), step=100)
  assert (ckpt / 'checkpoint').is_file()
  assert (ckpt / 'target.token_embedder.embedding' / '.zarray').is_file()
  with open(ckpt / 'checkpoint', 'rb') as f:
    state = flax.serialization.msgpack_restore(f.read())
  assert state['version'] == 3
  spec = state['optimizer']['target']['encoder']['layers_0']['attention'][
    'query'
  ]['kernel']
  assert spec['driver'] == 'zarr'
  assert spec['kvstore'] == {
    'driver': 'file',
    'path': 'target.encoder.layers_0.attention.query.kernel',
  }
  assert list(spec['metadata']['shape']) == [16, 16]


def test_t5x_loads_and_decodes_like_source(model, tmp_path):
  t5x.save(model, str(tmp_path / 'checkpoint_7'), step=7)
  loaded = sd.Model.load(
    str(tmp_path / 'checkpoint_7'), config=model.config,
    vocabulary=model.vocabulary,
  )  # fmt: skip
  _assert_same_params(loaded.params, model.params)
  assert loaded.vocabulary == model.vocabulary
  np.testing.assert_array_equal(_greedy(loaded, ENC), _greedy(model, ENC))
  # A T5X model directory: the latest checkpoint_<step> is loaded.
  t5x.save(sd.Model.init(model.config, seed=9), str(tmp_path / 'checkpoint_3'))
  latest = sd.Model.load(str(tmp_path), config=model.config)
  _assert_same_params(latest.params, model.params)


def test_t5x_with_gin_file_and_bfloat16(tmp_path):
  cfg = sd.T5Config.from_gin('models/t5_1_1/tiny.gin', vocab_size=64)
  gin_file = tmp_path / 'tiny64.gin'
  gin_file.write_text(
    'from __gin__ import dynamic_registration\n'
    'from spec_decode.t5 import config\n'
    "include 'models/t5_1_1/tiny.gin'\n"
    'config.T5Config.vocab_size = 64\n'
  )
  m = sd.Model.init(cfg, seed=0)
  t5x.save(m, str(tmp_path / 'ckpt'))
  loaded = sd.Model.load(
    str(tmp_path / 'ckpt'), gin_file=str(gin_file), dtype='bfloat16'
  )
  assert loaded.config == cfg.replace(param_dtype=jnp.bfloat16)
  _assert_same_params(
    loaded.params, jax.tree.map(lambda x: x.astype(jnp.bfloat16), m.params)
  )


def test_t5x_reads_legacy_and_msgpack_leaves(model, tmp_path):
  """Old-TensorStore `path` beside `kvstore`; small arrays inline."""
  ckpt = tmp_path / 'ckpt'
  t5x.save(model, str(ckpt))
  with open(ckpt / 'checkpoint', 'rb') as f:
    state = flax.serialization.msgpack_restore(f.read())
  target = state['optimizer']['target']
  norm = target['encoder']['encoder_norm']
  norm['scale'] = np.asarray(model.params['encoder']['encoder_norm']['scale'])
  emb = target['token_embedder']['embedding']
  emb['path'] = emb['kvstore'].pop('path')
  emb['kvstore'] = {'driver': 'file'}
  with open(ckpt / 'checkpoint', 'wb') as f:
    f.write(flax.serialization.msgpack_serialize(state))
  loaded = sd.Model.load(str(ckpt), config=model.config)
  _assert_same_params(loaded.params, model.params)


def test_t5x_needs_hyperparameters(model, tmp_path):
  t5x.save(model, str(tmp_path / 'ckpt'))
  with pytest.raises(ValueError, match='gin_file'):
    sd.Model.load(str(tmp_path / 'ckpt'))


def test_t5x_shape_mismatch(model, tmp_path):
  t5x.save(model, str(tmp_path / 'ckpt'))
  wrong = model.config.replace(num_heads=4, head_dim=4)
  with pytest.raises(CheckpointError, match='rel_embedding.*config'):
    sd.Model.load(str(tmp_path / 'ckpt'), config=wrong)
  deeper = model.config.replace(num_encoder_layers=3)
  with pytest.raises(CheckpointError, match='missing parameters.*layers_2'):
    sd.Model.load(str(tmp_path / 'ckpt'), config=deeper)


def test_t5x_missing_array_names_it(model, tmp_path):
  ckpt = tmp_path / 'ckpt'
  t5x.save(model, str(ckpt))
  shutil.rmtree(ckpt / 'target.decoder.decoder_norm.scale')
  with pytest.raises(CheckpointError, match='decoder_norm'):
    sd.Model.load(str(ckpt), config=model.config)


def test_t5x_corrupt_msgpack(tmp_path):
  (tmp_path / 'checkpoint').write_bytes(b'\xc1garbage')
  with pytest.raises(CheckpointError, match='checkpoint'):
    sd.Model.load(str(tmp_path), config=V11)


# -- Hugging Face (written by our own writer: no torch needed) ----------------
def test_hf_safetensors_round_trip(model, tmp_path):
  huggingface.save_safetensors(model, str(tmp_path / 'hf'))
  loaded = sd.Model.load(str(tmp_path / 'hf'))
  assert loaded.config == model.config.replace(dropout_rate=0.1)
  assert loaded.vocabulary == model.vocabulary
  _assert_same_params(loaded.params, model.params)


def test_hf_sharded_index(model, tmp_path):
  huggingface.save_safetensors(
    model, str(tmp_path / 'hf'), max_shard_bytes=4000
  )
  assert (tmp_path / 'hf' / 'model.safetensors.index.json').is_file()
  assert len(list((tmp_path / 'hf').glob('model-*.safetensors'))) > 2
  _assert_same_params(sd.Model.load(str(tmp_path / 'hf')).params, model.params)


def test_hf_missing_shard(model, tmp_path):
  huggingface.save_safetensors(
    model, str(tmp_path / 'hf'), max_shard_bytes=4000
  )
  shard = sorted((tmp_path / 'hf').glob('model-*.safetensors'))[1]
  os.remove(shard)
  with pytest.raises(FileNotFoundError, match=shard.name):
    sd.Model.load(str(tmp_path / 'hf'))


def test_hf_truncated_safetensors(model, tmp_path):
  huggingface.save_safetensors(model, str(tmp_path / 'hf'))
  file = tmp_path / 'hf' / 'model.safetensors'
  data = file.read_bytes()
  file.write_bytes(data[: len(data) - 100])
  with pytest.raises(CheckpointError, match='model.safetensors'):
    sd.Model.load(str(tmp_path / 'hf'))
  file.write_bytes(data[:50])  # cut inside the header
  with pytest.raises(CheckpointError, match='model.safetensors'):
    sd.Model.load(str(tmp_path / 'hf'))


def test_hf_config_disagreeing_with_weights(model, tmp_path):
  huggingface.save_safetensors(model, str(tmp_path / 'hf'))
  cfg_file = tmp_path / 'hf' / 'config.json'
  cfg = json.loads(cfg_file.read_text())
  cfg['d_ff'] = 32
  cfg_file.write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match=r'wi.*\(16, 24\) vs config'):
    sd.Model.load(str(tmp_path / 'hf'))
  cfg['d_ff'], cfg['num_layers'] = 24, 1
  cfg_file.write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match=r'encoder\.block\.1'):
    sd.Model.load(str(tmp_path / 'hf'))


def test_hf_bad_config(model, tmp_path):
  huggingface.save_safetensors(model, str(tmp_path / 'hf'))
  cfg_file = tmp_path / 'hf' / 'config.json'
  cfg = json.loads(cfg_file.read_text())
  cfg_file.write_text(json.dumps(dict(cfg, feed_forward_proj='gated-tanh')))
  with pytest.raises(CheckpointError, match='gated-tanh'):
    sd.Model.load(str(tmp_path / 'hf'))
  del cfg['d_model']
  cfg_file.write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match='d_model'):
    sd.Model.load(str(tmp_path / 'hf'))


def test_hf_bfloat16_safetensors(model, tmp_path):
  """bfloat16 files (numpy cannot name the dtype) load through the header."""
  from safetensors.numpy import save_file  # noqa: PLC0415

  huggingface.save_safetensors(model, str(tmp_path / 'hf'))
  file = str(tmp_path / 'hf' / 'model.safetensors')
  from safetensors import safe_open  # noqa: PLC0415

  with safe_open(file, 'np') as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  # Store as bf16 by writing the raw bytes under the BF16 dtype tag.
  halves = {
    k: v.astype(jnp.bfloat16).view(np.uint16) for k, v in tensors.items()
  }
  save_file(halves, file)
  raw = bytearray(open(file, 'rb').read())
  n = int.from_bytes(raw[:8], 'little')
  header = raw[8 : 8 + n].replace(b'"U16"', b'"BF16"')
  size = len(header).to_bytes(8, 'little')
  open(file, 'wb').write(size + bytes(header) + bytes(raw[8 + n :]))
  loaded = sd.Model.load(str(tmp_path / 'hf'))
  _assert_same_params(
    loaded.params,
    jax.tree.map(
      lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), model.params
    ),
  )


# -- detection and generic errors ---------------------------------------------
def test_missing_path():
  with pytest.raises(FileNotFoundError, match='/no/such/ckpt'):
    sd.Model.load('/no/such/ckpt')


def test_unknown_format(tmp_path):
  (tmp_path / 'weights.npz').write_bytes(b'')
  with pytest.raises(CheckpointError, match='unknown checkpoint format'):
    sd.Model.load(str(tmp_path))
  with pytest.raises(CheckpointError, match='weights.npz'):
    sd.Model.load(str(tmp_path / 'weights.npz'))


def test_hf_dir_without_weights_is_unknown(model, tmp_path):
  huggingface.save_safetensors(model, str(tmp_path))
  os.remove(tmp_path / 'model.safetensors')
  with pytest.raises(CheckpointError, match='unknown checkpoint format'):
    sd.Model.load(str(tmp_path))


def test_vocabulary_larger_than_model(vocab, tmp_path):
  small = sd.Model.init(V11.replace(vocab_size=128), vocabulary=None)
  small.save(str(tmp_path / 'c'))
  with pytest.raises(CheckpointError, match='160 ids.*128'):
    sd.Model.load(str(tmp_path / 'c'), vocabulary=vocab)


def test_draft_and_target_vocabularies_must_match(model, tmp_path):
  other = _vocab_util.vocabulary(tmp_path, vocab_size=50)
  draft = sd.Model.init(model.config, seed=5, vocabulary=other)
  with pytest.raises(ValueError, match='vocabularies differ'):
    sd.generate(model, ENC, draft=draft, max_decode_len=4)


# -- gin and convert -----------------------------------------------------------
@pytest.mark.parametrize(
  'name, emb, heads, head_dim, mlp, layers, acts',
  [
    ('t5_1_1/small', 512, 6, 64, 1024, 8, ('gelu', 'linear')),
    ('t5_1_1/base', 768, 12, 64, 2048, 12, ('gelu', 'linear')),
    ('t5_1_1/large', 1024, 16, 64, 2816, 24, ('gelu', 'linear')),
    ('t5_1_1/xl', 2048, 32, 64, 5120, 24, ('gelu', 'linear')),
    ('t5_1_1/xxl', 4096, 64, 64, 10240, 24, ('gelu', 'linear')),
    ('t5_1_0/small', 512, 8, 64, 2048, 6, ('relu',)),
    ('t5_1_0/base', 768, 12, 64, 3072, 12, ('relu',)),
    ('t5_1_0/large', 1024, 16, 64, 4096, 24, ('relu',)),
    ('t5_1_0/3B', 1024, 32, 128, 16384, 24, ('relu',)),
    ('t5_1_0/11B', 1024, 128, 128, 65536, 24, ('relu',)),
    ('t5_1_1/tiny', 8, 4, 3, 16, 2, ('gelu', 'linear')),
    # T5X's t5_1_0/tiny.gin includes t5_1_1/base.gin: a v1.1 network.
    ('t5_1_0/tiny', 8, 4, 3, 16, 2, ('gelu', 'linear')),
  ],
)
def test_gin_model_files(name, emb, heads, head_dim, mlp, layers, acts):
  cfg = sd.T5Config.from_gin(f'models/{name}.gin')
  assert (cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (
    emb, heads, head_dim, mlp,
  )  # fmt: skip
  assert cfg.num_encoder_layers == cfg.num_decoder_layers == layers
  assert cfg.mlp_activations == acts
  assert cfg.logits_via_embedding == (acts == ('relu',))
  assert cfg.vocab_size == 32128
  assert cfg.dtype == jnp.float32 and cfg.dropout_rate == 0.0


def test_gin_files_are_small_diffs():
  """Every size file includes a family's base.gin and stays a short diff."""
  bases = set()
  for path in sorted(os.listdir(os.path.join(paths.GIN_DIR, 'models'))):
    if os.path.isfile(os.path.join(paths.GIN_DIR, 'models', path, 'base.gin')):
      bases.add(f"include 'models/{path}/base.gin'")
  for path in sorted(os.listdir(os.path.join(paths.GIN_DIR, 'models'))):
    family = os.path.join(paths.GIN_DIR, 'models', path)
    for name in os.listdir(family):
      text = open(os.path.join(family, name)).read()
      code = [ln for ln in text.splitlines() if ln and not ln.startswith('#')]
      assert code[0] == 'from __gin__ import dynamic_registration', name
      if name != 'base.gin':
        assert any(b in text for b in bases), (path, name)
        assert len(code) <= 15, (path, name)


def test_gin_overrides_and_isolation():
  gin.clear_config()
  gin.parse_config(
    'from __gin__ import dynamic_registration\n'
    'from spec_decode.t5 import config\n'
    'config.T5Config.emb_dim = 3\n'
  )
  cfg = sd.T5Config.from_gin(
    't5_1_1_tiny', bindings=("ACTIVATION_DTYPE = 'bfloat16'",), vocab_size=96
  )
  assert cfg.vocab_size == 96 and cfg.dtype == jnp.bfloat16
  # The run's own gin binding neither leaks into the file nor is lost.
  assert cfg.emb_dim == 8
  assert gin.query_parameter('config.T5Config.emb_dim') == 3
  gin.clear_config()


def test_gin_model_file_reader_needs_no_imports(tmp_path):
  """A model file naming modules that are not installed still reads."""
  (tmp_path / 'base.gin').write_text(
    'from __gin__ import dynamic_registration\n'
    'from t5x.examples.t5 import network\n'
    'import t5x.adafactor\n'
    'DROPOUT = 0.1\n'
    'network.T5Config:\n'
    '  vocab_size = 32128\n'
    '  emb_dim = 64\n'
    '  dropout_rate = %DROPOUT\n'
    'adafactor.Adafactor.decay_rate = 0.8\n'
  )
  (tmp_path / 'small.gin').write_text(
    f"include '{tmp_path / 'base.gin'}'\nnetwork.T5Config.num_heads = 2\n"
  )
  cfg = sd.T5Config.from_gin(str(tmp_path / 'small.gin'))
  assert (cfg.emb_dim, cfg.num_heads, cfg.dropout_rate) == (64, 2, 0.1)
  (tmp_path / 'bad.gin').write_text('network.T5Config.no_such_field = 1\n')
  with pytest.raises(ValueError, match='no_such_field'):
    sd.T5Config.from_gin(str(tmp_path / 'bad.gin'), vocab_size=8)
  (tmp_path / 'unset.gin').write_text('network.T5Config.emb_dim = %UNSET\n')
  with pytest.raises(ValueError, match='UNSET'):
    sd.T5Config.from_gin(str(tmp_path / 'unset.gin'), vocab_size=8)


def test_model_from_gin():
  tiny = dict(emb_dim=8, num_heads=4, head_dim=3, mlp_dim=16)
  m = sd.Model.from_gin(
    'models/t5_1_0/base.gin',
    vocab_size=64,
    num_encoder_layers=2,
    num_decoder_layers=2,
    **tiny,
  )
  assert m.config.vocab_size == 64 and m.config.logits_via_embedding
  assert m.params['token_embedder']['embedding'].shape == (64, 8)
  assert 'logits_dense' not in m.params['decoder']
  m = sd.Model.from_gin('t5_tiny', vocab_size=64)
  assert not m.config.logits_via_embedding  # As T5X's t5_1_0/tiny.gin.
  with pytest.raises(FileNotFoundError, match='t5_9_9'):
    sd.T5Config.from_gin('models/t5_9_9/base.gin')


def test_convert_hf_and_t5x(model, tmp_path, capsys):
  huggingface.save_safetensors(model, str(tmp_path / 'hf'))
  assert convert.main(['--from', str(tmp_path / 'hf'), '--to',
                       str(tmp_path / 'out_hf')]) == 0  # fmt: skip
  out = sd.Model.load(str(tmp_path / 'out_hf'))
  _assert_same_params(out.params, model.params)
  assert out.vocabulary == model.vocabulary

  t5x.save(model, str(tmp_path / 't5x'))
  cfg_file = tmp_path / 'cfg.json'
  cfg_file.write_text(model.config.to_json())
  spm = tmp_path / 'spiece.model'
  spm.write_bytes(model.vocabulary.serialized)
  argv = ['--from', str(tmp_path / 't5x'), '--to', str(tmp_path / 'out'),
          '--config', str(cfg_file), '--vocab', str(spm)]  # fmt: skip
  assert convert.main(argv) == 0
  out = sd.Model.load(str(tmp_path / 'out'))
  _assert_same_params(out.params, model.params)
  assert out.config == model.config and out.vocabulary == model.vocabulary
  assert 'converted t5x checkpoint' in capsys.readouterr().out

  assert convert.main(argv) == 1  # the target exists now
  assert 'not empty' in capsys.readouterr().err
  assert (
    convert.main(['--from', str(tmp_path / 't5x'), '--to', str(tmp_path / 'x')])
    == 1
  )
  assert 'gin_file' in capsys.readouterr().err


def test_checkpoints_detect_format(model, tmp_path):
  model.save(str(tmp_path / 'ours'))
  huggingface.save_safetensors(model, str(tmp_path / 'hf'))
  t5x.save(model, str(tmp_path / 't5x' / 'checkpoint_5'))
  assert checkpoints.detect_format(str(tmp_path / 'ours'))[0] == 'orbax'
  assert checkpoints.detect_format(str(tmp_path / 'hf'))[0] == 'huggingface'
  fmt, d = checkpoints.detect_format(str(tmp_path / 't5x'))
  assert fmt == 't5x' and d.endswith('checkpoint_5')
  fmt, d = checkpoints.detect_format(
    str(tmp_path / 't5x' / 'checkpoint_5' / 'checkpoint')
  )
  assert fmt == 't5x'

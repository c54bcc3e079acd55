"""T5X's own model gin files, unchanged, without t5x installed.

The files below are laid out as in a T5X checkout (`t5x/examples/t5/...`),
with the bindings T5X's `t5_1_1/base.gin` and its size files make (imports
of seqio/t5x modules, `DROPOUT_RATE = %gin.REQUIRED`, a gs:// vocabulary,
the optimizer, `models.EncoderDecoderModel`, `network.T5Config`). The
expected hyperparameters are T5X's published sizes.
"""

import _vocab_util
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.checkpoints import convert
from spec_decode.checkpoints import t5x as t5x_format
from spec_decode.t5 import gin_file

BASE = """\
# A T5X-style base model file.
from __gin__ import dynamic_registration

import seqio
from t5x import adafactor
from t5x import models
from t5x.examples.t5 import network

Z_LOSS = 0.0001
LABEL_SMOOTHING = 0.0
LOSS_NORMALIZING_FACTOR = None
DROPOUT_RATE = %gin.REQUIRED

VOCABULARY = @seqio.SentencePieceVocabulary()
seqio.SentencePieceVocabulary.sentencepiece_model_file = "{vocab}"

OPTIMIZER = @adafactor.Adafactor()
adafactor.Adafactor:
  decay_rate = 0.8
  step_offset = 0
  logical_factor_rules = @adafactor.standard_logical_factor_rules()

MODEL = @models.EncoderDecoderModel()
models.EncoderDecoderModel:
  module = @network.Transformer()
  input_vocabulary = %VOCABULARY
  output_vocabulary = %VOCABULARY
  optimizer_def = %OPTIMIZER
  z_loss = %Z_LOSS
  label_smoothing = %LABEL_SMOOTHING
  loss_normalizing_factor = %LOSS_NORMALIZING_FACTOR

network.Transformer.config = @network.T5Config()
network.T5Config:
  vocab_size = 32128
  dtype = 'bfloat16'
  emb_dim = 768
  num_heads = 12
  num_encoder_layers = 12
  num_decoder_layers = 12
  head_dim = 64
  mlp_dim = 2048
  mlp_activations = ('gelu', 'linear')
  dropout_rate = %DROPOUT_RATE
  logits_via_embedding = False
"""

SIZE = """\
include 't5x/examples/t5/t5_1_1/base.gin'

network.Transformer.config = @network.T5Config()
network.T5Config:
  emb_dim = {emb}
  num_heads = {heads}
  num_encoder_layers = {layers}
  num_decoder_layers = {layers}
  head_dim = {head_dim}
  mlp_dim = {mlp}
"""

# T5X's t5_1_1 sizes: emb, heads, layers, head_dim, mlp.
SIZES = {
  'tiny': (8, 4, 2, 3, 16),
  'small': (512, 6, 8, 64, 1024),
  'large': (1024, 16, 24, 64, 2816),
  'xl': (2048, 32, 24, 64, 5120),
  'xxl': (4096, 64, 24, 64, 10240),
}


def _checkout(root, vocab='gs://t5-data/vocabs/cc_all.32000.100extra/x'):
  family = root / 't5x' / 'examples' / 't5' / 't5_1_1'
  family.mkdir(parents=True)
  (family / 'base.gin').write_text(BASE.format(vocab=vocab))
  for name, (emb, heads, layers, head_dim, mlp) in SIZES.items():
    (family / f'{name}.gin').write_text(
      SIZE.format(
        emb=emb, heads=heads, layers=layers, head_dim=head_dim, mlp=mlp
      )
    )
  return family


@pytest.mark.parametrize('name', sorted(SIZES))
def test_t5x_size_files_read_from_anywhere(tmp_path, monkeypatch, name):
  family = _checkout(tmp_path / 'src')
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  cfg = sd.T5Config.from_gin(str(family / f'{name}.gin'))
  emb, heads, layers, head_dim, mlp = SIZES[name]
  assert (cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (
    emb, heads, head_dim, mlp,
  )  # fmt: skip
  assert cfg.num_encoder_layers == cfg.num_decoder_layers == layers
  assert cfg.vocab_size == 32128 and cfg.mlp_activations == ('gelu', 'linear')
  assert cfg.dtype == np.dtype('bfloat16') and cfg.dropout_rate == 0.0
  assert not cfg.logits_via_embedding


def test_t5x_relative_paths_use_search_paths(tmp_path, monkeypatch):
  _checkout(tmp_path / 'src')
  monkeypatch.chdir(tmp_path)
  name = 't5x/examples/t5/t5_1_1/small.gin'
  with pytest.raises(FileNotFoundError, match='gin_search_paths'):
    sd.T5Config.from_gin(name)
  cfg = sd.T5Config.from_gin(name, search_paths=[str(tmp_path / 'src')])
  assert cfg.emb_dim == 512
  monkeypatch.chdir(tmp_path / 'src')  # T5X's own habit: run from the root.
  assert sd.T5Config.from_gin(name).emb_dim == 512


def test_what_the_file_binds_besides_the_network(tmp_path):
  family = _checkout(tmp_path)
  model_file = gin_file.read(str(family / 'xxl.gin'))
  assert model_file.vocabulary.startswith('gs://')
  assert model_file.local_vocabulary() is None  # No network reads.
  assert 'adafactor.Adafactor.decay_rate' in model_file.skipped
  assert 'models.EncoderDecoderModel.z_loss' in model_file.skipped


def test_a_binding_we_cannot_honour_is_named(tmp_path):
  family = _checkout(tmp_path)
  (family / 'beam.gin').write_text(
    "include 't5x/examples/t5/t5_1_1/tiny.gin'\n"
    'models.EncoderDecoderModel.decode_fn = @decoding.beam_search\n'
  )
  with pytest.raises(ValueError, match=r'beam.gin:2: .*decode_fn'):
    sd.T5Config.from_gin(str(family / 'beam.gin'))
  (family / 'typo.gin').write_text(
    "include 't5x/examples/t5/t5_1_1/tiny.gin'\n"
    'network.T5Config.num_layers = 3\n'
  )
  with pytest.raises(ValueError, match=r'typo.gin:2: .*num_layers'):
    sd.T5Config.from_gin(str(family / 'typo.gin'))


def test_model_from_t5x_gin_with_a_local_vocabulary(tmp_path):
  path = _vocab_util.train(tmp_path, vocab_size=60)
  family = _checkout(tmp_path / 'src', vocab=path)
  m = sd.Model.from_gin(str(family / 'tiny.gin'), vocab_size=64)
  # seqio's default: no extra ids on top of the sentencepiece model.
  assert m.vocabulary == sd.Vocabulary.from_file(path, extra_ids=0)
  assert m.params['token_embedder']['embedding'].shape == (64, 8)


def test_load_and_convert_a_t5x_checkpoint_with_its_t5x_gin(tmp_path, capsys):
  family = _checkout(tmp_path / 'src')
  # A user's own size file on top of T5X's (CPU activations, small vocab).
  (family / 'tiny96.gin').write_text(
    "include 't5x/examples/t5/t5_1_1/tiny.gin'\n"
    'network.T5Config.vocab_size = 96\n'
    "network.T5Config.dtype = 'float32'\n"
  )
  gin_path = str(family / 'tiny96.gin')
  model = sd.Model.from_gin(gin_path, seed=3)
  ckpt = str(tmp_path / 'checkpoint_1')
  t5x_format.save(model, ckpt)
  loaded = sd.Model.load(ckpt, gin_file=gin_path)
  assert loaded.config == model.config
  enc = np.array([[5, 6, 7, 1]], np.int32)
  np.testing.assert_allclose(
    loaded.log_probs(enc, enc), model.log_probs(enc, enc), atol=1e-6
  )
  out = str(tmp_path / 'ours')
  argv = ['--from', ckpt, '--to', out, '--gin_file', gin_path]
  assert convert.main(argv) == 0
  assert 'converted t5x checkpoint' in capsys.readouterr().out
  assert sd.Model.load(out).config == model.config

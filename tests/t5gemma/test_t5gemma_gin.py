"""The T5Gemma and T5Gemma 2 size files (`gin/models/t5gemma*/`): each
builds its `T5GemmaConfig` through gin, with the published sizes' values
(parameter counts equal to the released checkpoints'), and
`checkpoints/gin_model.py` reads each into the same config without gin.

(That every gin file parses, and that the eval config
`configs/t5gemma_debian_ende.gin` builds its settings, is
`tests/test_gin_files.py`'s.)
"""

import dataclasses
import glob
import os

import numpy as np
import pytest

from spec_decode import gin_cli
from spec_decode import paths
from spec_decode.checkpoints import gin_model
from spec_decode.checkpoints import t5gemma_hf
from spec_decode.t5gemma import config as config_lib

SIZES = sorted(
  os.path.relpath(p, paths.GIN_DIR)
  for p in glob.glob(os.path.join(paths.GIN_DIR, 'models', 't5gemma*', '*'))
  if not p.endswith('base.gin')
)


def _built(name: str) -> config_lib.T5GemmaConfig:
  gin_cli.parse([name], [])
  try:
    return gin_cli.configured(config_lib.T5GemmaConfig)()
  finally:
    gin_cli.parse([], [])


def test_every_published_size_has_a_file():
  assert {os.path.basename(os.path.dirname(s)) + '/' + os.path.basename(s)
          for s in SIZES} == {
    't5gemma/s_s.gin', 't5gemma/b_b.gin', 't5gemma/l_l.gin',
    't5gemma/ml_ml.gin', 't5gemma/xl_xl.gin', 't5gemma/2b_2b.gin',
    't5gemma/9b_2b.gin', 't5gemma/9b_9b.gin', 't5gemma2/270m_270m.gin',
    't5gemma2/1b_1b.gin', 't5gemma2/4b_4b.gin',
  }  # fmt: skip


@pytest.mark.parametrize('name', SIZES)
def test_size_file_builds_its_config(name):
  cfg = _built(name)
  version = 2 if 't5gemma2/' in name else 1
  assert cfg.version == version
  every = 2 if version == 1 else 6
  for stack in (cfg.encoder, cfg.decoder):
    assert stack.layer_types == config_lib.layer_pattern(
      stack.num_layers, every
    )
    assert stack.num_heads % stack.num_kv_heads == 0
  if version == 1:
    assert cfg.vocab_size == 256_000 and cfg.final_logit_softcap == 30.0
    assert cfg.decoder.attn_logit_softcap == 50.0
    assert cfg.decoder.sliding_window == 4096
  else:
    assert cfg.vocab_size == 262_208 and cfg.final_logit_softcap is None
    assert cfg.decoder.rope_global == config_lib.Rope(1e6, 8.0)
    assert cfg.decoder.rope_local == config_lib.Rope(1e4, 1.0)


def test_2b_2b_is_transformers_default_t5gemma():
  """transformers' `T5GemmaConfig()` is the 2B-2B; read as a checkpoint's
  config.json, it is what the size file builds."""
  transformers = pytest.importorskip('transformers')
  hf = transformers.T5GemmaConfig().to_dict()
  assert _built('models/t5gemma/2b_2b.gin') == t5gemma_hf.config_from_hf(
    hf, 'default'
  )


def test_9b_2b_pairs_the_9b_encoder_with_the_2b_decoder():
  mixed = _built('models/t5gemma/9b_2b.gin')
  assert mixed.encoder == _built('models/t5gemma/9b_9b.gin').encoder
  assert mixed.decoder == _built('models/t5gemma/2b_2b.gin').decoder


def test_draft_and_target_share_their_vocabulary():
  """The pairs docs/usage/checkpoints.md recommends have one vocabulary."""
  for target, draft in (
    ('t5gemma/2b_2b', 't5gemma/s_s'),
    ('t5gemma/9b_2b', 't5gemma/b_b'),
    ('t5gemma/9b_9b', 't5gemma/s_s'),
    ('t5gemma/xl_xl', 't5gemma/b_b'),
    ('t5gemma/ml_ml', 't5gemma/s_s'),
    ('t5gemma2/4b_4b', 't5gemma2/270m_270m'),
    ('t5gemma2/1b_1b', 't5gemma2/270m_270m'),
  ):
    t = _built(f'models/{target}.gin')
    d = _built(f'models/{draft}.gin')
    assert t.vocab_size == d.vocab_size, (target, draft)
  # Never across versions (256,000 ids against 262,208 rows).
  assert (
    _built('models/t5gemma/s_s.gin').vocab_size
    != _built('models/t5gemma2/270m_270m.gin').vocab_size
  )


# Parameters of the released checkpoints. T5Gemma: the safetensors totals
# (both embeddings, the head tied), as KerasHub's t5gemma presets record
# them. T5Gemma 2, text only (its vision tower is not implemented): two
# Gemma 3 stacks of the decoder-only model it was adapted from (KerasHub's
# gemma3_270m / gemma3_1b / gemma3_4b_text presets: 268,098,176,
# 999,885,952 and 3,880,099,328, embedding of 262,144 rows included)
# sharing one embedding, padded to 262,208 rows, plus the end-of-image row:
# 2 * gemma3 - 262144 * d + 64 * d + d (the merged decoder attention has
# the self-attention's projections).
_GEMMA3 = {'270m_270m': (268_098_176, 640), '1b_1b': (999_885_952, 1152),
           '4b_4b': (3_880_099_328, 2560)}  # fmt: skip
PUBLISHED = {
  't5gemma/s_s.gin': 312_517_632,
  't5gemma/b_b.gin': 591_490_560,
  't5gemma/l_l.gin': 1_241_761_792,
  't5gemma/ml_ml.gin': 2_200_345_344,
  't5gemma/xl_xl.gin': 3_766_980_608,
  't5gemma/2b_2b.gin': 5_596_853_760,
  't5gemma/9b_2b.gin': 12_292_375_296,
  't5gemma/9b_9b.gin': 20_333_401_088,
  **{
    f't5gemma2/{size}.gin': 2 * n - 262_144 * d + 65 * d
    for size, (n, d) in _GEMMA3.items()
  },
}


def _shapes_count(config) -> int:
  """Parameters of the network's own shapes (`jax.eval_shape`: nothing is
  allocated)."""
  shapes = t5gemma_hf.expected_shapes(config)
  return sum(int(np.prod(s)) for s in shapes.values())


def _shallow(config, encoder_layers: int, decoder_layers: int):
  def cut(stack, n):
    return dataclasses.replace(
      stack, num_layers=n, layer_types=stack.layer_types[:n]
    )

  return config.replace(
    encoder=cut(config.encoder, encoder_layers),
    decoder=cut(config.decoder, decoder_layers),
  )


def _count(config) -> int:
  """`_shapes_count`, from networks of one and two layers per stack (a
  stack's layers have one shape, sliding or global; tracing 84 layers
  would take minutes): one layer each, plus each stack's further layers
  times the parameters its second layer adds."""
  one = _shapes_count(_shallow(config, 1, 1))
  per_encoder = _shapes_count(_shallow(config, 2, 1)) - one
  per_decoder = _shapes_count(_shallow(config, 1, 2)) - one
  return (
    one
    + (config.encoder.num_layers - 1) * per_encoder
    + (config.decoder.num_layers - 1) * per_decoder
  )


def test_count_from_two_layers_is_the_whole_networks():
  """The shortcut equals counting every layer (S-S, 8 + 8 layers; 9B-2B's
  unequal stacks at 3 + 2 layers)."""
  config, _ = gin_model.read('models/t5gemma/s_s.gin')
  assert _count(config) == _shapes_count(config)
  config, _ = gin_model.read('models/t5gemma/9b_2b.gin')
  config = _shallow(config, 3, 2)
  assert _count(config) == _shapes_count(config)


@pytest.mark.parametrize('name', SIZES)
def test_size_file_has_the_published_parameter_count(name):
  """Stricter than the few percent asked: every count is exact (ML-ML's
  count fixes heads x head_dim, not the split; see its header)."""
  key = '/'.join(name.split(os.sep)[-2:])
  config, vocabulary = gin_model.read(name)
  assert vocabulary is None
  assert _count(config) == PUBLISHED[key], key


def test_count_is_not_blind():
  """Negative control: one layer more changes the count."""
  config, _ = gin_model.read(
    'models/t5gemma/s_s.gin', ['config.pattern_stack.num_layers = 9']
  )
  assert config.encoder.num_layers == 9
  assert _count(config) != PUBLISHED['t5gemma/s_s.gin']


@pytest.mark.parametrize('name', SIZES)
def test_gin_model_reads_what_gin_builds(name):
  """`gin_model.read` (no gin state) == gin's own evaluation, scopes
  (`encoder/`, `global/`) and includes included; it leaves gin's
  configuration as it found it."""
  gin_cli.parse([], ['SENTINEL = 1'])
  try:
    config, _ = gin_model.read(name)
    assert gin_cli.macro('SENTINEL') == 1
  finally:
    gin_cli.parse([], [])
  assert config == _built(name)


def test_gin_model_bindings_and_overrides():
  config, _ = gin_model.read(
    'models/t5gemma2/270m_270m.gin',
    [
      'config.pattern_stack.num_layers = 2',
      'encoder/config.pattern_stack.mlp_dim = 8',
      'local/config.Rope.theta = 5.0',
    ],
    vocab_size=300,
  )
  assert config.vocab_size == 300
  assert (config.encoder.num_layers, config.decoder.num_layers) == (2, 2)
  assert (config.encoder.mlp_dim, config.decoder.mlp_dim) == (8, 2048)
  assert config.decoder.rope_local.theta == 5.0
  assert config.decoder.rope_global.theta == 1e6
  t5, _ = gin_model.read('t5_1_1_small', vocab_size=64)
  assert type(t5).__name__ == 'T5Config' and t5.vocab_size == 64


def test_gin_model_errors_name_the_binding(tmp_path):
  bad = tmp_path / 'bad.gin'
  include = "include 'models/t5gemma/s_s.gin'\n"
  bad.write_text(include + 'config.pattern_stack.num_kv_heads = 3\n')
  with pytest.raises(ValueError, match='num_heads 8 is not a multiple'):
    gin_model.read(str(bad))
  bad.write_text(include + 'config.T5GemmaConfig.encoder = @config.Bad()\n')
  with pytest.raises(ValueError, match='@Bad'):
    gin_model.read(str(bad))

"""The T5Gemma and T5Gemma 2 size files (`gin/models/t5gemma*/`): each
builds its `T5GemmaConfig` through gin, with the published sizes' values.

(That every gin file parses, and that the eval config
`configs/t5gemma_debian_ende.gin` builds its settings, is
`tests/test_gin_files.py`'s.)
"""

import glob
import os

import pytest

from spec_decode import gin_cli
from spec_decode import paths
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
    't5gemma/s_s.gin', 't5gemma/b_b.gin', 't5gemma/2b_2b.gin',
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
    ('t5gemma2/4b_4b', 't5gemma2/270m_270m'),
  ):
    t = _built(f'models/{target}.gin')
    d = _built(f'models/{draft}.gin')
    assert t.vocab_size == d.vocab_size, (target, draft)

"""`spec-decode eval` with `configs/t5gemma_debian_ende.gin` on a T5Gemma
pair: tiny random T5Gemma target (3 + 3 layers) and draft (1 + 1), saved by
transformers, with the demo's 4096-piece sentencepiece vocabulary (not
Gemma's: its special ids differ, so it is given as VOCABULARY rather than
saved as the directories' tokenizer.model). Four Debian examples, greedy:
every speculative output equals the plain one. (Untrained models: alpha is
about 0 and BLEU 0; the run checks the wiring, not the quality.)

And T5Gemma model gin files as the eval run names T5's (`--gin_file`,
TARGET_MODEL_GIN, DRAFT_GIN_FILE) build T5Gemma models.
"""

import json
import os

import numpy as np
import pytest
from _t5gemma_util import hf_model
from _t5gemma_util import save

import gin
import spec_decode as sd
from spec_decode import gin_cli
from spec_decode import paths
from spec_decode.eval import cli
from spec_decode.eval import run as run_lib
from spec_decode.eval import t5x_run_cli
from spec_decode.eval import verify_cli
from spec_decode.eval.load import models as models_lib

CONFIG = os.path.join(paths.REPO_DIR, 'configs', 't5gemma_debian_ende.gin')
VOCABULARY = os.path.join(
  paths.REPO_DIR, 'checkpoints', 'demo', 'target', 'spiece.model'
)


def test_eval_config_runs_a_t5gemma_pair(tmp_path):
  pytest.importorskip('transformers')
  target = save(hf_model(1, vocab_size=4096), tmp_path / 'target')
  draft = save(
    hf_model(1, encoder_layers=1, decoder_layers=1, seed=1, vocab_size=4096),
    tmp_path / 'draft',
  )
  out = tmp_path / 'out'
  code = cli.main(
    [
      f'--gin_file={CONFIG}',
      f"--gin.CHECKPOINT_PATH='{target}'",
      f"--gin.DRAFT_CHECKPOINT='{draft}'",
      f"--gin.VOCABULARY='{VOCABULARY}'",
      '--gin.NUM_EXAMPLES=4',
      '--gin.MAX_DECODE_LEN=16',
      '--gin.TIMING_REPEATS=1',
      f'--output_dir={out}',
    ]
  )
  assert code == 0
  results = json.loads((out / 'results.json').read_text())
  assert results['exact_match_fraction'] == 1.0
  assert results['exact_match_count'] == 4


TINY = """# A tiny T5Gemma{version}: a published size file, shrunk.
include 'models/t5gemma{suffix}/{size}.gin'
config.pattern_stack.num_layers = {layers}
config.pattern_stack.emb_dim = 16
config.pattern_stack.mlp_dim = 32
config.pattern_stack.num_heads = 2
config.pattern_stack.num_kv_heads = 1
config.pattern_stack.head_dim = 8
config.pattern_stack.sliding_window = 4
"""


def _tiny_gin(tmp_path, version: int, layers: int) -> str:
  suffix, size = ('2', '270m_270m') if version == 2 else ('', 's_s')
  path = tmp_path / f'v{version}_{layers}.gin'
  path.write_text(
    TINY.format(
      version=' 2' if version == 2 else '',
      suffix=suffix,
      size=size,
      layers=layers,
    )
  )
  return str(path)


@pytest.mark.parametrize('version', [1, 2])
def test_eval_gin_files_build_t5gemma_models(tmp_path, version):
  """A T5Gemma model gin file as the target's `--gin_file` (TARGET_MODEL_GIN)
  and the draft's DRAFT_GIN_FILE: the eval run's configured `load_model`
  builds `T5GemmaModel`s of those sizes (random weights, the run's
  vocabulary size), not a T5 (parsing and building only: no eval); so does
  `spec-decode verify`'s `--target_gin_file`."""
  target = _tiny_gin(tmp_path, version, 2)
  draft = _tiny_gin(tmp_path, version, 1)
  args, bindings = cli.parse_args(
    [
      '--gin_file=configs/smoke_synthetic.gin',
      f'--gin_file={target}',
      f'--gin.DRAFT_GIN_FILE={draft}',
    ]
  )
  try:
    cli.configure(args, bindings)
    assert t5x_run_cli.resolved_macro('TARGET_MODEL_GIN') == target
    models = {}
    for role in ('target', 'draft'):
      with gin.config_scope(role):
        models[role] = gin_cli.configured(run_lib.load_model)()
  finally:
    gin_cli.parse([], [])
  for role, layers in (('target', 2), ('draft', 1)):
    model = models[role]
    assert isinstance(model, sd.T5GemmaModel), role
    assert model.config.version == version
    assert model.config.vocab_size == model.vocabulary.vocab_size == 64
    assert model.config.encoder.num_layers == layers
    assert model.config.decoder.emb_dim == 16
  family = 'T5Gemma 2' if version == 2 else 'T5Gemma'
  assert models_lib.describe(models['target']).startswith(family)
  # `spec-decode verify --target_gin_file` reads them the same way.
  verified = verify_cli.load_model(None, target, 0, None, ())
  assert isinstance(verified, sd.T5GemmaModel)
  assert verified.config.decoder.num_layers == 2
  # The pair decodes: speculative greedy equals plain.
  tokens = np.array([[5, 6, 7, 8, 9, 1], [10, 11, 1, 0, 0, 0]], np.int32)
  plain = sd.generate(models['target'], tokens, max_decode_len=8)
  spec = sd.generate(
    models['target'], tokens, draft=models['draft'], gamma=2, max_decode_len=8
  )
  np.testing.assert_array_equal(spec.tokens, plain.tokens)

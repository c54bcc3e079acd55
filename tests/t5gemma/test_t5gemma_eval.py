"""`spec-decode eval` with `configs/t5gemma_debian_ende.gin` on a T5Gemma
pair: tiny random T5Gemma target (3 + 3 layers) and draft (1 + 1), saved by
transformers, with the demo's 4096-piece sentencepiece vocabulary (not
Gemma's: its special ids differ, so it is given as VOCABULARY rather than
saved as the directories' tokenizer.model). Four Debian examples, greedy:
every speculative output equals the plain one. (Untrained models: alpha is
about 0 and BLEU 0; the run checks the wiring, not the quality.)
"""

import json
import os

import pytest
from _t5gemma_util import hf_model
from _t5gemma_util import save

from spec_decode import paths
from spec_decode.eval import cli

transformers = pytest.importorskip('transformers')

CONFIG = os.path.join(paths.REPO_DIR, 'configs', 't5gemma_debian_ende.gin')
VOCABULARY = os.path.join(
  paths.REPO_DIR, 'checkpoints', 'demo', 'target', 'spiece.model'
)


def test_eval_config_runs_a_t5gemma_pair(tmp_path):
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

"""`spec-decode infer` from the command line: T5X's infer command with the
draft added, in a T5X checkout layout, and kill -9 then rerun.

The T5X layout is a temporary directory with `t5x/configs/runs/infer.gin`
(a stand-in: as for `spec-decode eval`, T5X's run files are read as our
runs/eval.gin and runs/infer.gin, which bind the same macros) and a model
gin file in T5X's own format (`from t5x import models`; t5x is not
installed), searched with `--gin_search_paths` as T5X's launcher does.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spec_decode import gin_cli
from spec_decode.eval import run as eval_lib
from spec_decode.eval.infer import chunks
from spec_decode.eval.infer import cli

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
T5X_MODEL = """\
from __gin__ import dynamic_registration
from t5x import models
from t5x.examples.t5 import network

MODEL = @models.EncoderDecoderModel()
models.EncoderDecoderModel.module = @network.Transformer()
network.Transformer.config = @network.T5Config()
network.T5Config:
  vocab_size = 64
  emb_dim = 32
  num_heads = 2
  num_encoder_layers = 2
  num_decoder_layers = 2
  head_dim = 16
  mlp_dim = 64
  mlp_activations = ('gelu', 'linear')
  dropout_rate = 0.0
  logits_via_embedding = False
"""
PREDICTIONS = 'synthetic_tiny-predict.jsonl-00000-of-00001'


@pytest.fixture(scope='module')
def checkout(tmp_path_factory):
  """A T5X checkout's files and a sentencepiece model (T5X checkpoints
  carry none)."""
  root = tmp_path_factory.mktemp('src')
  runs = root / 't5x' / 'configs' / 'runs'
  runs.mkdir(parents=True)
  (runs / 'infer.gin').write_text('# Stands in for T5X infer.gin.\n')
  model = root / 't5x' / 'examples' / 't5' / 't5_1_1'
  model.mkdir(parents=True)
  (model / 'tiny.gin').write_text(T5X_MODEL)
  vocab = eval_lib.task_vocabulary('synthetic_tiny', vocab_size=64)
  (root / 'spm.model').write_bytes(vocab.serialized)
  return root


def _t5x_argv(root, out, *extra):
  return [
    '--gin_file=t5x/examples/t5/t5_1_1/tiny.gin',
    '--gin_file=t5x/configs/runs/infer.gin',
    f'--gin_search_paths={root}',
    '--gin.MIXTURE_OR_TASK_NAME=synthetic_tiny',
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 12}",
    '--gin.CHECKPOINT_PATH=None',
    f'--gin.INFER_OUTPUT_DIR={out}',
    '--gin.utils.DatasetConfig.batch_size=2',
    '--gin.NUM_EXAMPLES=4',
    f'--gin.VOCABULARY={root / "spm.model"}',
    '--alsologtostderr',
    # The draft (random here: no checkpoint, the same model file).
    '--gin.DRAFT_CHECKPOINT=None',
    '--gin.DRAFT_GIN_FILE=t5x/examples/t5/t5_1_1/tiny.gin',
    '--gin.GAMMA=3',
    '--no_progress',
    *extra,
  ]


def test_t5x_infer_command_with_the_draft_added_runs(checkout, tmp_path):
  out = tmp_path / 'infer'
  argv = _t5x_argv(
    checkout, out, "--gin.infer.mode='predict_with_aux'",
    '--gin_bindings=infer_script.infer.checkpoint_period = 1',
  )  # fmt: skip
  assert cli.main(argv) == 0
  assert gin_cli.macro('CHECKPOINT_PERIOD') == 1
  name = PREDICTIONS.replace('-predict.', '-predict_with_aux.')
  with open(out / name, encoding='utf-8') as f:
    lines = [json.loads(line) for line in f]
  assert len(lines) == 4
  assert all(set(x) == {'inputs', 'prediction', 'aux'} for x in lines)
  with open(out / chunks.SUMMARY_FILE) as f:
    summary = json.load(f)
  assert summary['examples'] == 4 and summary['mode'] == 'predict_with_aux'
  assert summary['batch_size'] == 2


def test_a_bad_setting_is_refused_before_any_model_loads(checkout, tmp_path,
                                                         capsys):  # fmt: skip
  out = tmp_path / 'bad'
  assert cli.main(_t5x_argv(checkout, out, '--gin.GAMMA=[2,3]')) == 1
  assert 'one int or auto' in capsys.readouterr().err
  assert not out.exists()


def _command(out, *extra):
  return [
    sys.executable, '-c', 'from spec_decode import main; main.run()',
    'infer', '--gin_file=configs/smoke_synthetic.gin', f'--output_dir={out}',
    '--gin.CHECKPOINT_PERIOD=1', '--gin.NUM_EXAMPLES=5', '--gin.BATCH_SIZE=1',
    '--no_progress', *extra,
  ]  # fmt: skip


@pytest.mark.slow
def test_kill_9_then_rerun_gives_every_line_once(tmp_path):
  env = {**os.environ, 'PYTHONPATH': REPO}
  full = tmp_path / 'full'
  subprocess.run(_command(full), cwd=REPO, env=env, check=True, timeout=300)
  killed = tmp_path / 'killed'
  # After chunk k the run sleeps k seconds: time to kill it mid-run.
  pause = tmp_path / 'pause.gin'
  pause.write_text(
    'from __gin__ import dynamic_registration\n'
    'import time\n'
    'from spec_decode.eval.infer import run as spec_infer\n'
    'spec_infer.infer.on_chunk_done = @time.sleep\n'
  )
  proc = subprocess.Popen(
    _command(killed, f'--gin_file={pause}'), cwd=REPO, env=env
  )
  deadline = time.time() + 300
  while chunks.chunks_done(str(killed)) < 2 and time.time() < deadline:
    time.sleep(0.05)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  done = chunks.chunks_done(str(killed))
  assert 2 <= done < 5 and not (killed / PREDICTIONS).exists()
  subprocess.run(_command(killed), cwd=REPO, env=env, check=True, timeout=300)
  assert (killed / PREDICTIONS).read_bytes() == (
    full / PREDICTIONS
  ).read_bytes()

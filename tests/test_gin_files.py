"""Every gin file under gin/ and configs/ parses (and says what it means).

A file is parsed alone with the run's search paths and finalized; each
`%gin.REQUIRED` macro it leaves unset is bound to a dummy and the parse is
repeated, so the test also records which settings a file still needs.
"""

import glob
import os
import re

import pytest

import gin
from spec_decode import gin_cli
from spec_decode import paths
from spec_decode.eval import cli
from spec_decode.eval import compare
from spec_decode.eval import run as run_lib
from spec_decode.eval import t5x_run_cli
from spec_decode.t5 import gin_file

REPO = paths.REPO_DIR
GIN_FILES = sorted(
  glob.glob(os.path.join(REPO, 'gin', '**', '*.gin'), recursive=True)
  + glob.glob(os.path.join(REPO, 'configs', '**', '*.gin'), recursive=True)
)
_REQUIRED = re.compile(r'^(\w+) is required; set it with --gin\.')
# What a researcher supplies to a paper config: where the T5X checkpoints
# and T5's vocabulary lie on their machine.
TABLE2_INPUTS = {'CHECKPOINT_PATH', 'DRAFT_CHECKPOINT', 'VOCABULARY'}
# Paper Table 2: (task, draft, temperature) -> gamma.
TABLE2_GAMMA = {
  ('ende', 'small', 0): 7, ('ende', 'base', 0): 7, ('ende', 'large', 0): 7,
  ('ende', 'small', 1): 7, ('ende', 'base', 1): 5, ('ende', 'large', 1): 3,
  ('cnndm', 'small', 0): 5, ('cnndm', 'base', 0): 5, ('cnndm', 'large', 0): 3,
  ('cnndm', 'small', 1): 5, ('cnndm', 'base', 1): 3, ('cnndm', 'large', 1): 3,
}  # fmt: skip


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parse(path: str) -> set[str]:
  """Parses and finalizes `path` as `spec-decode eval` does (`gin_cli`);
  returns the REQUIRED macros left unset."""
  required: set[str] = set()
  for _ in range(50):
    bindings = [f"{name} = 'dummy'" for name in sorted(required)]
    try:
      gin_cli.parse([path], bindings)
      return required
    except gin_cli.GinFlagError as e:
      m = _REQUIRED.search(str(e))
      if not m:
        raise
      required.add(m.group(1))
  raise AssertionError(f'{path}: too many required macros')


def _relative(path: str) -> str:
  return os.path.relpath(path, REPO)


def test_there_are_gin_files():
  names = {_relative(p) for p in GIN_FILES}
  assert 'gin/runs/eval.gin' in names
  assert 'configs/demo_debian_ende.gin' in names
  table2 = [n for n in names if n.startswith('configs/table2_')]
  assert len([n for n in table2 if not n.endswith('_beam.gin')]) == 12
  # Beam-search siblings of the temperature-0 rows (decoding/beam.gin).
  assert len([n for n in table2 if n.endswith('_beam.gin')]) == 6


@pytest.mark.parametrize('path', GIN_FILES, ids=_relative)
def test_gin_file_parses(path):
  with open(path, encoding='utf-8') as f:
    statements = [
      line.strip() for line in f
      if line.strip() and not line.lstrip().startswith('#')
    ]  # fmt: skip
  assert statements[0] == 'from __gin__ import dynamic_registration'
  required = _parse(path)
  rel = _relative(path)
  if rel.startswith('configs/table2_'):
    assert required == TABLE2_INPUTS
  elif rel.startswith(('configs/demo_', 'configs/smoke_')):
    assert not required, f'{rel} is not runnable as is: {required}'
  elif rel == 'gin/runs/eval.gin':
    assert required == {'DRAFT_CHECKPOINT', 'GAMMA'}


@pytest.mark.parametrize(
  'key', sorted(TABLE2_GAMMA), ids=lambda k: '_'.join(map(str, k))
)
def test_table2_configs_match_the_paper(key):
  task, draft, temperature = key
  path = os.path.join(
    REPO, 'configs', f'table2_{task}_{draft}_t{temperature}.gin'
  )
  _parse(path)
  assert gin.query_parameter('%GAMMA') == TABLE2_GAMMA[key]
  assert gin.query_parameter('%TEMPERATURE') == float(temperature)
  assert gin.query_parameter('%BATCH_SIZE') == 1
  assert gin.query_parameter('%TASK') == (
    'wmt_t2t_ende_v003' if task == 'ende' else 'cnn_dailymail_v002'
  )
  assert gin.query_parameter('%TARGET_MODEL_GIN') == 'models/t5_1_1/xxl.gin'
  assert gin.query_parameter('%DRAFT_GIN_FILE') == (
    f'models/t5_1_1/{draft}.gin'
  )
  for macro in ('%TARGET_MODEL_GIN', '%DRAFT_GIN_FILE'):
    assert os.path.isfile(gin_file.resolve(gin.query_parameter(macro)))


def test_demo_default_points_at_the_demo_pair():
  _parse(os.path.join(REPO, 'configs', cli.DEFAULT_CONFIG))
  assert (
    gin.query_parameter('%CHECKPOINT_PATH'),
    gin.query_parameter('%DRAFT_CHECKPOINT'),
  ) == cli.DEMO_CHECKPOINTS
  assert gin.query_parameter('%TASK') == 'debian_ende'
  assert gin.query_parameter('%TEMPERATURE') == 0.0


EVAL_CONFIGS = [
  p
  for p in GIN_FILES
  if _relative(p).startswith('configs/')
  and not os.path.basename(p).startswith('train_')
]
# Macro -> the EvalSettings field runs/eval.gin binds to it.
SETTINGS_MACROS = {
  'TASK': 'task', 'SPLIT': 'split', 'NUM_EXAMPLES': 'num_examples',
  'BATCH_SIZE': 'batch_size', 'TEMPERATURE': 'temperature', 'TOP_K': 'top_k',
  'TOP_P': 'top_p', 'MAX_DECODE_LEN': 'max_decode_len',
  'MAX_INPUT_LEN': 'max_input_len', 'SEED': 'seed', 'LENIENCE': 'lenience',
  'DYNAMIC_GAMMA': 'dynamic_gamma', 'DATA_DIR': 'data_dir',
  'TARGET_NAME': 'target_name', 'DRAFT_NAME': 'draft_name',
  'TIMING_REPEATS': 'timing_repeats', 'TIMING_ROUNDS': 'timing_rounds',
  'NUM_BEAMS': 'num_beams', 'BEAM_ALPHA': 'beam_alpha',
  'MAX_AUTO_GAMMA': 'max_auto_gamma',
}  # fmt: skip


@pytest.mark.parametrize('path', EVAL_CONFIGS, ids=_relative)
def test_eval_configs_build_valid_settings_from_their_macros(path):
  _parse(path)
  assert gin.query_parameter('spec_eval.evaluate.settings').selector == (
    'spec_eval.EvalSettings'
  )
  settings = gin_cli.configured(run_lib.EvalSettings)()
  assert isinstance(settings, run_lib.EvalSettings)
  for macro, field in SETTINGS_MACROS.items():
    value = gin.query_parameter(f'%{macro}')
    assert getattr(settings, field) == value, macro
  gamma = run_lib.parse_gamma(gin.query_parameter('%GAMMA'))
  assert settings.gamma == (gamma if gamma == 'auto' else tuple(gamma))
  # Built before the models load: gin evaluates bindings in order.
  assert _first_binding(run_lib.evaluate) == 'settings'
  with open(path, encoding='utf-8') as f:
    is_comparison = "include 'runs/compare.gin'" in f.read()
  if is_comparison:
    # Not gin_cli.binds: it would build the drafts (no data here).
    reference = gin.query_parameter('spec_eval_compare.compare.settings')
    assert reference.selector == 'spec_eval.EvalSettings'
    assert _first_binding(compare.compare) == 'settings'


def _first_binding(fn) -> str:
  return next(iter(gin.get_bindings(fn, resolve_references=False)))


# -- T5X's run macros and their aliases (gin/runs/eval.gin) ----------------

SMOKE = '--gin_file=smoke_synthetic'
SUMMARIZE = 'synthetic_tiny_summarize'


def _configure(argv):
  args, bindings = cli.parse_args(argv)
  return cli.configure(args, bindings)


def _settings():
  return gin_cli.configured(run_lib.EvalSettings)()


def _t5x_file(tmp_path, *lines):
  """A config that includes the smoke run and sets `lines`."""
  path = tmp_path / 'mine.gin'
  path.write_text(
    'from __gin__ import dynamic_registration\n'
    "include 'smoke_synthetic.gin'\n" + ''.join(f'{x}\n' for x in lines)
  )
  return f'--gin_file={path}'


@pytest.mark.parametrize(
  'file_lines, flags, task',
  [
    # The smoke config sets the alias (TASK = 'synthetic_tiny').
    ((), (), 'synthetic_tiny'),
    ((), (f'--gin.MIXTURE_OR_TASK_NAME={SUMMARIZE}',), SUMMARIZE),
    # In files, the T5X name beats the alias, whatever the order.
    ((f"MIXTURE_OR_TASK_NAME = '{SUMMARIZE}'",), (), SUMMARIZE),
    (
      (f"MIXTURE_OR_TASK_NAME = '{SUMMARIZE}'", "TASK = 'synthetic_tiny'"),
      (),
      SUMMARIZE,
    ),
    # The command line beats the files, alias or not.
    (
      (f"MIXTURE_OR_TASK_NAME = '{SUMMARIZE}'",),
      ('--gin.TASK=synthetic_tiny',),
      'synthetic_tiny',
    ),
    # On the command line too, the T5X name beats the alias.
    (
      (),
      (f'--gin.MIXTURE_OR_TASK_NAME={SUMMARIZE}', '--gin.TASK=synthetic_tiny'),
      SUMMARIZE,
    ),
    (
      (),
      ('--gin.TASK=synthetic_tiny', f'--gin.MIXTURE_OR_TASK_NAME={SUMMARIZE}'),
      SUMMARIZE,
    ),
  ],
)
def test_task_aliases_resolve_command_line_first_then_t5x_names(
  tmp_path, file_lines, flags, task
):
  _configure([_t5x_file(tmp_path, *file_lines), *flags])
  assert _settings().task == task
  # Both names end up equal, so blocks that read either agree.
  for name in ('MIXTURE_OR_TASK_NAME', 'TASK'):
    assert t5x_run_cli.resolved_macro(name) == task


def test_checkpoint_output_and_draft_gin_aliases(tmp_path):
  _configure([
    _t5x_file(tmp_path, "CHECKPOINT_PATH = '/file/target'"),
    '--gin.TARGET_CHECKPOINT=/flag/target', '--gin.INFER_OUTPUT_DIR=/o',
    '--gin.DRAFT_MODEL_GIN=models/t5_1_1/small.gin',
  ])  # fmt: skip
  resolved = {
    name: t5x_run_cli.resolved_macro(name)
    for name in ('CHECKPOINT_PATH', 'EVAL_OUTPUT_DIR', 'DRAFT_GIN_FILE')
  }
  assert resolved == {
    'CHECKPOINT_PATH': '/flag/target',
    'EVAL_OUTPUT_DIR': '/o',
    'DRAFT_GIN_FILE': 'models/t5_1_1/small.gin',
  }
  _configure([SMOKE, '--gin.CHECKPOINT_PATH=/t', '--output_dir=/x'])
  assert t5x_run_cli.resolved_macro('TARGET_CHECKPOINT') == '/t'
  assert t5x_run_cli.resolved_macro('EVAL_OUTPUT_DIR') == '/x'


@pytest.mark.parametrize(
  'file_lines, flags, lengths',
  [
    ((), (), (32, 12)),  # The smoke config's MAX_INPUT_LEN, MAX_DECODE_LEN.
    (
      (),
      ("--gin.TASK_FEATURE_LENGTHS={'inputs': 20, 'targets': 10}",),
      (20, 10),
    ),
    ((), ("--gin.TASK_FEATURE_LENGTHS={'targets': 10}",), (32, 10)),
    (("TASK_FEATURE_LENGTHS = {'inputs': 20, 'targets': 10}",), (), (20, 10)),
    (
      ("TASK_FEATURE_LENGTHS = {'inputs': 20, 'targets': 10}",),
      ('--gin.MAX_DECODE_LEN=7',),
      (20, 7),
    ),
    (
      ("TASK_FEATURE_LENGTHS = {'inputs': 20, 'targets': 10}",),
      ('--gin.MAX_DECODE_LEN=7', "--gin.TASK_FEATURE_LENGTHS={'targets': 9}"),
      (32, 9),
    ),
  ],
)
def test_task_feature_lengths_and_their_aliases(
  tmp_path, file_lines, flags, lengths
):
  _configure([_t5x_file(tmp_path, *file_lines), *flags])
  s = _settings()
  assert (s.max_input_len, s.max_decode_len) == lengths


def test_t5x_dataset_config_bindings_set_their_macros():
  _configure([
    SMOKE, '--gin.utils.DatasetConfig.split=validation',
    '--gin.DatasetConfig.batch_size=3',
    '--gin_bindings=utils.RestoreCheckpointConfig.path = "/ckpt"',
    '--gin.eval_script.evaluate.output_dir=/out',
  ])  # fmt: skip
  s = _settings()
  assert (s.split, s.batch_size) == ('validation', 3)
  assert t5x_run_cli.resolved_macro('CHECKPOINT_PATH') == '/ckpt'
  assert t5x_run_cli.resolved_macro('EVAL_OUTPUT_DIR') == '/out'


def test_a_t5x_binding_without_counterpart_is_refused(capsys):
  # (num_partitions and model_parallel_submesh have counterparts: the mesh
  # macros; tests/eval/test_t5x_run_files.py.)
  flag = '--gin.partitioning.PjitPartitioner.use_cpu_pjit=True'
  assert cli.main([SMOKE, flag]) == 2
  err = capsys.readouterr().err
  assert 'partitioning.PjitPartitioner.use_cpu_pjit: T5X binding' in err


# A model gin file in T5X's own format: gin itself could not parse it here
# (t5x is not installed), so `spec-decode eval` must read it as the model.
T5X_MODEL = """\
from __gin__ import dynamic_registration
from t5x import models
from t5x.examples.t5 import network

NUM_HEADS = 2
MODEL = @models.EncoderDecoderModel()
models.EncoderDecoderModel.module = @network.Transformer()
network.Transformer.config = @network.T5Config()
network.T5Config:
  vocab_size = 64
  emb_dim = 32
  num_heads = %NUM_HEADS
  num_encoder_layers = 2
  num_decoder_layers = 2
  head_dim = 16
  mlp_dim = 64
  mlp_activations = ('gelu', 'linear')
  dropout_rate = 0.0
  logits_via_embedding = False
"""


def test_a_t5x_command_line_with_the_draft_added(tmp_path):
  model = tmp_path / 'tiny_t5x.gin'
  model.write_text(T5X_MODEL)
  _configure([
    f'--gin_file={model}', '--gin_file=t5x/configs/runs/eval.gin',
    '--gin.MIXTURE_OR_TASK_NAME=synthetic_tiny',
    '--gin.CHECKPOINT_PATH=/ckpt/target', '--gin.EVAL_OUTPUT_DIR=/tmp/o',
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}",
    '--tfds_data_dir=/tfds', '--alsologtostderr',
    # The draft:
    '--gin.DRAFT_CHECKPOINT=/ckpt/draft', f'--gin.DRAFT_GIN_FILE={model}',
    '--gin.GAMMA=4',
  ])  # fmt: skip
  assert t5x_run_cli.resolved_macro('TARGET_MODEL_GIN') == str(model)
  s = _settings()
  assert (s.task, s.max_input_len, s.max_decode_len) == (
    'synthetic_tiny', 64, 16,
  )  # fmt: skip
  # T5X's defaults: batch 32, the whole split, greedy.
  assert (s.batch_size, s.num_examples, s.temperature) == (32, None, 0.0)
  assert s.gamma == (4,) and s.data_dir == '/tfds'


def test_a_whole_t5x_run_file_is_refused_with_what_to_pass(tmp_path, capsys):
  model = tmp_path / 'tiny_t5x.gin'
  model.write_text(T5X_MODEL)
  run = tmp_path / 'my_eval.gin'
  run.write_text(
    f"include '{model}'\nutils.DatasetConfig.split = 'test'\n"
    "MIXTURE_OR_TASK_NAME = 'synthetic_tiny'\n"
  )
  assert cli.main([f'--gin_file={run}']) == 2
  err = capsys.readouterr().err
  assert 'is a T5X run file (it binds utils.DatasetConfig.split)' in err
  assert '--gin_file=t5x/configs/runs/eval.gin' in err


def test_a_config_that_includes_a_model_file_is_refused(tmp_path, capsys):
  mixed = tmp_path / 'mixed.gin'
  mixed.write_text(
    'from __gin__ import dynamic_registration\n'
    "include 'smoke_synthetic.gin'\n"
    "include 'models/t5_1_1/tiny.gin'\n"
  )
  out = tmp_path / 'out'
  assert cli.main([f'--gin_file={mixed}', f'--output_dir={out}']) == 2
  assert not out.exists()
  err = capsys.readouterr().err
  assert 'binds a model (' in err and 'spec_eval.evaluate.settings' in err
  assert 'TARGET_MODEL_GIN' in err

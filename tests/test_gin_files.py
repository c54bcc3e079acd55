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
from spec_decode.t5 import gin_file

REPO = paths.REPO_DIR
GIN_FILES = sorted(
  glob.glob(os.path.join(REPO, 'gin', '**', '*.gin'), recursive=True)
  + glob.glob(os.path.join(REPO, 'configs', '**', '*.gin'), recursive=True)
)
_REQUIRED = re.compile(r'^(\w+) is required; set it with --gin\.')
# What a researcher supplies to a paper config: where the T5X checkpoints
# and T5's vocabulary lie on their machine.
TABLE2_INPUTS = {'TARGET_CHECKPOINT', 'DRAFT_CHECKPOINT', 'VOCABULARY'}
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
  assert len([n for n in names if n.startswith('configs/table2_')]) == 12


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
    assert {'TARGET_CHECKPOINT', 'GAMMA', 'NUM_EXAMPLES'} <= required


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
  assert gin.query_parameter('%DRAFT_MODEL_GIN') == (
    f'models/t5_1_1/{draft}.gin'
  )
  for macro in ('%TARGET_MODEL_GIN', '%DRAFT_MODEL_GIN'):
    assert os.path.isfile(gin_file.resolve(gin.query_parameter(macro)))


def test_demo_default_points_at_the_demo_pair():
  _parse(os.path.join(REPO, 'configs', cli.DEFAULT_CONFIG))
  assert (
    gin.query_parameter('%TARGET_CHECKPOINT'),
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
  'TIMING_REPEATS': 'timing_repeats',
  'CALIBRATION_BATCHES': 'calibration_batches',
  'CALIBRATION_GAMMA': 'calibration_gamma',
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

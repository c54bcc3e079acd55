"""T5X's run bindings inside gin files (not only on the command line).

T5X run files bind the partitioner as `partitioning.PjitPartitioner.
num_partitions = 4` (with `from t5x import partitioning` under dynamic
registration, or old-style without the import). t5x is not installed here,
so gin alone would refuse both forms; `spec-decode eval` reads them as the
NUM_PARTITIONS / MODEL_PARALLEL_SUBMESH macros (`eval/t5x_run_cli.py`).
Parsing only: nothing here loads a model.
"""

import pytest

from spec_decode import gin_cli
from spec_decode.eval import cli
from spec_decode.eval import run as run_lib
from spec_decode.eval import t5x_run_cli

SMOKE = "include 'smoke_synthetic.gin'\n"
DYNAMIC = (
  'from __gin__ import dynamic_registration\nfrom t5x import partitioning\n'
)


def _configure(*argv):
  args, bindings = cli.parse_args(list(argv))
  return cli.configure(args, bindings)


def _file(tmp_path, text, name='run.gin'):
  path = tmp_path / name
  path.write_text(text)
  return f'--gin_file={path}'


def _mesh_macros():
  return (
    t5x_run_cli.resolved_macro('NUM_PARTITIONS'),
    t5x_run_cli.resolved_macro('MODEL_PARALLEL_SUBMESH'),
  )


def _partitioner_error():
  """What the configured partitioner says on this one-device process."""
  with pytest.raises(ValueError) as e:
    gin_cli.configured(run_lib.partitioner)()
  return str(e.value)


@pytest.mark.parametrize('header', [DYNAMIC, ''], ids=['dynamic', 'old'])
def test_partitioner_bindings_in_a_file_set_the_mesh(tmp_path, header):
  flag = _file(
    tmp_path,
    header
    + SMOKE
    + 'partitioning.PjitPartitioner.num_partitions = 4\n'
    + 'partitioning.PjitPartitioner.model_parallel_submesh = (1, 1, 2, 2)\n',
  )
  _configure(flag)
  assert _mesh_macros() == (4, (1, 1, 2, 2))
  # The eval run's partitioner reads them: this process has one device.
  assert 'model partitions of 4' in _partitioner_error()
  # The rest of the run is configured as usual.
  assert gin_cli.configured(run_lib.EvalSettings)().task == 'synthetic_tiny'


def test_a_block_in_an_included_file_and_a_macro_value(tmp_path):
  _file(
    tmp_path,
    DYNAMIC
    + 'PARTS = 2\n'
    + 'partitioning.PjitPartitioner:\n'
    + '  num_partitions = %PARTS\n',
    name='t5x_part.gin',
  )
  flag = _file(tmp_path, f"{SMOKE}include '{tmp_path / 't5x_part.gin'}'\n")
  _configure(flag)
  assert _mesh_macros() == (2, None)


def test_the_command_line_beats_the_file_and_the_file_beats_our_macro(
  tmp_path,
):
  text = (
    DYNAMIC + SMOKE + 'NUM_PARTITIONS = 8\n'
    'partitioning.PjitPartitioner.num_partitions = 4\n'
  )
  _configure(_file(tmp_path, text))
  assert _mesh_macros()[0] == 4
  _configure(_file(tmp_path, text), '--gin.NUM_PARTITIONS=2')
  assert _mesh_macros()[0] == 2


def test_a_file_binding_without_counterpart_is_refused_naming_the_file(
  tmp_path, capsys
):
  flag = _file(
    tmp_path,
    DYNAMIC + SMOKE + 'partitioning.PjitPartitioner.use_cpu_pjit = True\n',
  )
  assert cli.main([flag]) == 2
  err = capsys.readouterr().err
  assert 'run.gin: partitioning.PjitPartitioner.use_cpu_pjit: T5X' in err


def test_without_t5x_bindings_a_missing_import_is_still_an_error(tmp_path):
  with pytest.raises(ImportError):
    _configure(_file(tmp_path, DYNAMIC + SMOKE))

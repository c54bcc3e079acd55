"""`spec-decode bench`: its sub-benchmarks dispatch, and `bench load`'s
fresh-process loaders run through the package (no `python -m` module).

Timings are `make bench`'s business; these check the command lines only.
"""

import jax.numpy as jnp
import pytest

from spec_decode import main as spec_decode_main
from spec_decode.bench import cli
from spec_decode.bench import load
from spec_decode.bench import speed

SUB_BENCHMARKS = (
  'load',
  'draft_dtype',
  'kernel',
  'drafters',
  'hierarchical',
  'memory',
  'trees',
  'beam',
  'accel',
  'provenance',
  'on_target',
  'sum_blocks',
  'infer',
)


def test_bench_help_lists_the_sub_benchmarks(capsys):
  with pytest.raises(SystemExit) as exit_:
    spec_decode_main.run(['bench', '--help'])
  assert exit_.value.code == 0
  out = capsys.readouterr().out
  assert '--quick' in out and '--out' in out
  for name in SUB_BENCHMARKS:
    assert f'\n    {name} ' in out, name
  assert set(cli.BENCHMARKS) == set(SUB_BENCHMARKS)


@pytest.mark.parametrize('name', SUB_BENCHMARKS)
def test_each_sub_benchmark_has_its_own_help(name, capsys):
  with pytest.raises(SystemExit) as exit_:
    cli.main([name, '--help'])
  assert exit_.value.code == 0
  assert f'usage: spec-decode bench {name} ' in capsys.readouterr().out


def test_flags_before_a_sub_benchmark_are_an_error(capsys):
  with pytest.raises(SystemExit) as exit_:
    cli.main(['--quick', 'load'])
  assert exit_.value.code == 2
  assert 'spec-decode bench load' in capsys.readouterr().err


def test_dtype_flag_sets_both_models_and_refuses_others(capsys):
  cfg = speed.with_dtype(speed.QUICK, 'bfloat16')
  for model in (cfg.target, cfg.draft):
    assert model.dtype == jnp.bfloat16 and model.param_dtype == jnp.bfloat16
  assert cfg.policy_batches == speed.QUICK.policy_batches
  assert speed.with_dtype(speed.QUICK, 'float32').draft == speed.QUICK.draft
  with pytest.raises(SystemExit) as exit_:
    cli.main(['--dtype', 'float16'])
  assert exit_.value.code == 2
  assert "invalid choice: 'float16'" in capsys.readouterr().err


def test_load_child_runs_in_a_fresh_process(tmp_path, target):
  target.save(str(tmp_path / 'orbax'))
  config_json = target.config.to_json()
  result = load.run_in_child(
    ['load', 'orbax', str(tmp_path / 'orbax'), config_json, 'float32']
  )
  assert result['format'] == 'orbax' and result['dtype'] == 'float32'
  assert result['seconds'] > 0
  assert result['peak_rss_mib'] >= result['baseline_rss_mib'] > 0

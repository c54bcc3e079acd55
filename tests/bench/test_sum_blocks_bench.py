"""`spec-decode bench sum_blocks`: cpu_sum_block on and off, side by side
(timings are reported, never asserted; the precision is)."""

import json

import pytest

from spec_decode.bench import sum_blocks


def test_tiny_run_writes_every_figure(tmp_path, capsys):
  out = tmp_path / 'sum_blocks.json'
  argv = ['--sizes', 'tiny', '--rounds', '1', '--batch', '2', '--length', '8']
  assert sum_blocks.main(argv + ['--out', str(out)]) == 0
  doc = json.loads(out.read_text())
  (size,) = doc['sizes'].values()
  for what in ('forward', 'train_step'):
    assert size[what]['blocks_ms'] > 0 and size[what]['xla_ms'] > 0
  # Widths 256 and 512 are split in blocks of 128: closer to float64.
  errors = size['product_error_u']
  assert set(errors) == {'64', '256', '512'}
  assert errors['64']['blocks'] == errors['64']['xla']  # one block: no split
  for k in ('256', '512'):
    assert errors[k]['blocks'] < errors[k]['xla'], errors
  assert '| tiny | 2 x 8 |' in capsys.readouterr().out


@pytest.mark.parametrize(
  'argv', [['--sizes', 'huge'], ['--block', '0'], ['--rounds', '0']]
)
def test_bad_arguments_exit_2(argv, tmp_path):
  with pytest.raises(SystemExit) as exit_:
    sum_blocks.main(argv + ['--out', str(tmp_path / 'x.json')])
  assert exit_.value.code == 2

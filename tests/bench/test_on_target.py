"""`spec-decode bench on_target`: its table, and a tiny end-to-end run."""

import json

import pytest

from spec_decode.bench.drafts import on_target


def _row(draft, speedup):
  return {
    'draft': draft,
    'temperature': 0.0,
    'batch': 1,
    'shape': 'chain 4',
    'alpha': 0.5,
    'tokens_per_call': 2.0,
    'c': 0.1,
    'speedup': speedup,
  }


def test_markdown_has_every_cell_and_the_sweep():
  result = {
    'cells': [_row('feature draft (EAGLE-style)', 1.5), _row('x', 0.9)],
    'early_exit_sweep': [
      _row('early exit k=1', 1.1),
      _row('early exit k=2', 1.2),
    ],
    'best_early_exit_k': 2,
    'identity_failures': 0,
  }
  text = on_target.markdown(result)
  assert (
    '| feature draft (EAGLE-style) | 0 | 1 | chain 4 | 0.500 | 2.00 |' in text
  )
  assert '(best k = 2)' in text
  assert '| 2 | 0.500 | 2.00 | 0.100 | 1.20x |' in text
  assert 'differing from plain decoding: 0' in text


@pytest.mark.slow
def test_tiny_run_on_the_demo_pair(tmp_path):
  out = tmp_path / 'on_target.json'
  code = on_target.main([
    '--num_examples', '1', '--batches', '1', '--temperatures', '0',
    '--tree', '', '--repeats', '1', '--max_decode_len', '8',
    '--out', str(out),
  ])  # fmt: skip
  assert code == 0
  result = json.loads(out.read_text())
  names = {r['draft'] for r in result['cells']}
  assert 'feature draft (EAGLE-style)' in names
  assert f'early exit k={result["best_early_exit_k"]}' in names
  assert result['identity_failures'] == 0

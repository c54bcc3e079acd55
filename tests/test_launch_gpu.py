"""`launch_gpu.sh accel`: the GPU command rehearsed end to end on the CPU.

The same script a lent GPU runs (`bash launch_gpu.sh accel`), with
`PLATFORM=cpu FLAGS=--tiny`: the smoke step, every bench item at toy sizes,
then the accel tests by file list (here one file, to keep `make test`
short; the device runs all five). The train job's rehearsal is
tests/train/test_pair_job.py.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(tmp_path, job='accel', **env):
  env = {
    **os.environ,
    'OUT': str(tmp_path / 'out'),
    'PY': sys.executable,
    'PLATFORM': 'cpu',
    'FLAGS': '--tiny',
    **env,
  }
  return subprocess.run(
    ['bash', os.path.join(ROOT, 'launch_gpu.sh'), job],
    cwd=env.pop('CWD', ROOT),
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


def test_the_accel_job_end_to_end(tmp_path):
  # The tiny plan's own budget (1200 s: room for every item; it takes about
  # two minutes).
  job = _launch(
    tmp_path, TESTS='tests/parallel/test_one_device_mesh.py', BUDGET='1200'
  )
  assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
  out = tmp_path / 'out'
  assert sorted(os.listdir(out)) == ['accel', 'accel.log', 'accel_tests.log']
  doc = json.loads((out / 'accel' / 'accel.json').read_text())
  assert doc['finished'] and not doc['errors']
  # Nothing skipped but the float32-attention check, which runs only where
  # bfloat16 rows part (at toy sizes on the CPU none do).
  assert [(x['section'], x['why']) for x in doc['skipped']] == [
    ('f32_attention', 'every bfloat16 row was identical')
  ]
  s = doc['sections']
  assert s['smoke']['decodes'] == {
    'chain': 'identical', 'tree': 'identical'
  }  # fmt: skip
  assert all(c['ok'] for c in s['smoke']['api'])
  for dtype in ('bfloat16', 'float32'):
    ident = s[f'identity_{dtype}']
    assert ident['dtype'] == dtype and ident['rows'] == 8
    # float32 is measured with true float32 products (not JAX's TF32
    # default on GPUs); bfloat16 with the default.
    want = 'float32' if dtype == 'float32' else 'None'
    assert ident['matmul_precision'] == want, ident
    assert ident['share_identical'] == 1.0, ident
  for size in ('xxl', 'small'):
    got = s['sizes'][size]
    assert set(got['v']) == {'1', '2', '3'} and got['c'] > 0
    t2 = got['paper_table2']
    assert (t2['alpha'], t2['gamma']) == (0.75, 2) and t2['same_as_plain']
    assert t2['measured'] > 0 and t2['predicted'] > 0
  (more,) = [r for a, r in s['sizes']['xxl']['speedup'].items() if a == '0.9']
  assert more['same_as_plain']
  # The T5Gemma section (a toy T5Gemma pair): the same rows, after every
  # T5 section.
  gemma = s['sizes']['t5gemma']
  assert gemma['config']['family'] == 't5gemma'
  assert gemma['draft'].startswith('T5Gemma')
  assert set(gemma['v']) == {'1', '2', '3'} and gemma['c'] > 0
  assert gemma['paper_table2']['same_as_plain']
  assert gemma['paper_table2']['measured'] > 0
  assert gemma['speedup']['0.9']['same_as_plain']
  assert s['t5gemma_draft']['step_ms'] > 0
  sections = [e['section'] for e in doc['timeline']]
  first = sections.index('t5gemma')
  assert set(sections[first:]) == {'t5gemma'} and 'small' in sections[:first]
  (row,) = s['batching']
  assert row['batch'] == 2 and row['same_as_plain']['auto'] == 1.0
  assert set(s['trees']['v_tree']) == {'2'}
  assert set(s['trees']['v_chain']) == {'3'}
  assert [r['config'] for r in s['trees']['controlled']] == [
    'chain gamma=2',
    'tree budget=2',
    'tree dynamic budget=2',
  ]
  assert all(r['same_as_plain'] == 1.0 for r in s['trees']['controlled'])
  (beam,) = s['beam']
  assert beam['exact'] and beam['num_beams'] == 2
  md = (out / 'accel' / 'accel.md').read_text()
  for heading in ('Greedy identity', 'Targets with', 'by batch', 'tree of n'):
    assert heading in md
  tests = (out / 'accel_tests.log').read_text()
  assert 'test_one_device_mesh_equals_unsharded PASSED' in tests
  assert 'tests exit status 0' in job.stdout


def test_a_failing_test_step_fails_the_job(tmp_path):
  # The bench runs nothing (--only names no item and --skip the smoke
  # step); the test step runs a failing test.
  bad = tmp_path / 'test_fails.py'
  bad.write_text(
    'import pytest\n\n@pytest.mark.accel\ndef test_no():\n  assert False\n'
  )
  job = _launch(
    tmp_path,
    TESTS=str(bad),
    FLAGS='--tiny --only smoke/none --skip smoke',
    TEST_S='60',
  )
  assert job.returncode == 1, job.stdout[-3000:]
  assert 'test_no FAILED' in (tmp_path / 'out' / 'accel_tests.log').read_text()


def test_a_missing_carry_is_named(tmp_path):
  # A Python without gin-config (a `gin` that fails to import) and no .whl.
  fake = tmp_path / 'site' / 'gin'
  fake.mkdir(parents=True)
  (fake / '__init__.py').write_text('raise ImportError("no gin here")\n')
  job = _launch(tmp_path, CWD=str(tmp_path), PYTHONPATH=str(tmp_path / 'site'))
  assert job.returncode == 2
  assert 'make accel-wheels' in job.stderr and '.whl' in job.stderr
  train = _launch(tmp_path, job='train', PACK=str(tmp_path / 'none.tar.xz'))
  assert train.returncode == 2 and 'make train-gpu-pack' in train.stderr

"""`spec-decode bench accel`: the CPU rehearsal of the GPU job, and its parts.

The rehearsal (`--tiny`) runs every section at toy sizes, so the command a
GPU session runs cannot rot: every section must report results, nothing may
be skipped or fail.
"""

import dataclasses
import json
import os
import time

import pytest

import spec_decode as sd
from spec_decode.bench.accel import identity
from spec_decode.bench.accel import plan as plan_lib
from spec_decode.bench.accel import record
from spec_decode.bench.accel import run


def test_tiny_rehearsal_runs_every_section(tmp_path):
  out = str(tmp_path / 'accel')
  assert run.main(['--tiny', '--out_dir', out]) == 0
  with open(os.path.join(out, record.JSON_FILE), encoding='utf-8') as f:
    doc = json.load(f)
  assert doc['errors'] == [] and doc['skipped'] == []
  s = doc['sections']
  for dtype in ('bfloat16', 'float32'):
    ident = s[f'identity_{dtype}']
    assert ident['dtype'] == dtype and ident['rows'] == 8
    # float32 is measured with true float32 products (not JAX's TF32
    # default on GPUs); bfloat16 with the default.
    want = 'float32' if dtype == 'float32' else 'None'
    assert ident['matmul_precision'] == want, ident
    # At toy sizes on the CPU both dtypes keep greedy identity.
    assert ident['share_identical'] == 1.0, ident
  for size in ('xxl', 'small'):
    got = s['sizes'][size]
    assert set(got['v']) == {'1', '3'} and got['c'] > 0
    (speed,) = got['speedup'].values()
    assert speed['gamma'] == 2 and speed['same_as_plain']
    assert speed['measured'] > 0 and speed['predicted'] > 0
  (row,) = s['batching']
  assert row['batch'] == 2 and row['same_as_plain']['auto'] == 1.0
  assert set(s['trees']['v_tree']) == {'2'}
  assert [r['config'] for r in s['trees']['controlled']] == [
    'chain gamma=2',
    'tree budget=2',
  ]
  (beam,) = s['beam']
  assert beam['exact'] and beam['num_beams'] == 2
  with open(os.path.join(out, record.MARKDOWN_FILE), encoding='utf-8') as f:
    md = f.read()
  for heading in ('Greedy identity', 'Targets with', 'by batch', 'tree of n'):
    assert heading in md


def test_real_sizes_are_refused_on_a_cpu(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    run.main(['--out_dir', str(tmp_path)])
  assert e.value.code == 2
  assert 'need an accelerator' in capsys.readouterr().err
  with pytest.raises(SystemExit):
    run.main(['--tiny', '--out_dir', str(tmp_path), '--only', 'nope'])
  assert not os.listdir(tmp_path)  # Nothing was written before the checks.


def test_recorder_keeps_what_was_measured(tmp_path):
  rec = record.Recorder(str(tmp_path), {'device': 'x'}, render=lambda d: 'md')
  rec.put('sizes', 'xxl', {'v': {'1': 1.0}})
  rec.skip('sizes', 'xxl v(2)', 'time box')
  try:
    raise RuntimeError('out of memory')
  except RuntimeError as e:
    rec.error('trees', e)
  with open(tmp_path / record.JSON_FILE, encoding='utf-8') as f:
    doc = json.load(f)
  assert doc['sections']['sizes']['xxl'] == {'v': {'1': 1.0}}
  assert doc['skipped'][0]['item'] == 'xxl v(2)'
  assert 'out of memory' in doc['errors'][0]['error']
  assert (tmp_path / record.MARKDOWN_FILE).read_text() == 'md'
  assert sorted(os.listdir(tmp_path)) == [
    record.JSON_FILE,
    record.MARKDOWN_FILE,
  ]  # No temporary files left behind.


def test_deadline_boxes_nest():
  outer = plan_lib.Deadline(0.2)
  inner = outer.box(10.0)  # Cut to what the outer box has left.
  assert inner.left() <= outer.left() + 1e-3
  assert inner.fits(0.05) and not inner.fits(1.0)
  time.sleep(0.25)
  assert outer.left() == 0.0 and not inner.fits(0.0 + 1e-9)


def test_full_plan_orders_xxl_first_and_shares_the_budget():
  plan = plan_lib.full(420.0)
  assert list(plan.targets) == ['xxl', 'small', 'base', 'large', 'xl']
  assert plan.targets['xxl'].emb_dim == 4096
  assert str(plan.targets['xxl'].dtype) == 'bfloat16'
  assert not plan.targets['xxl'].cpu_kernel
  assert abs(sum(plan.boxes.values()) - 1.0) < 1e-9
  assert run.SECTIONS[:2] == ('identity_bfloat16', 'xxl')


def test_restore_measures_float32_attention_logits(tmp_path):
  plan = dataclasses.replace(plan_lib.tiny(), identity_rows=4)
  target = sd.Model.init(plan.targets['small'], seed=0)
  draft = sd.Model.init(plan.draft, seed=1)
  rec = record.Recorder(str(tmp_path), {}, render=None)
  identity.restore(rec, target, draft, plan, plan_lib.Deadline(600))
  got = rec.data['sections']['identity_bfloat16_f32_attention']
  assert got['float32_attention_logits'] and got['rows'] == 4
  assert set(got['step_ms']) == {'default', 'float32_attention_logits'}
  assert set(got['step_ms']['default']) == {'1', '3'}

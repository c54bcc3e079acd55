"""`spec-decode bench accel`: the plan, its parts, and a short-budget run.

The whole GPU command (`launch_gpu.sh accel`) is rehearsed end to end in
tests/test_launch_gpu.py; here the plan itself: a run with too little time
must measure the XXL core first and record every item it could not run,
with the reason.
"""

import dataclasses
import json
import os
import time

import jax
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.bench.accel import cost
from spec_decode.bench.accel import identity
from spec_decode.bench.accel import plan as plan_lib
from spec_decode.bench.accel import record
from spec_decode.bench.accel import run
from spec_decode.bench.accel import runner
from spec_decode.bench.accel import shapes


def _doc(out):
  with open(os.path.join(out, record.JSON_FILE), encoding='utf-8') as f:
    return json.load(f)


def _order(plan, tmp):
  """Every item key in plan order (as `run.items` makes them)."""
  rec = record.Recorder(str(tmp), {}, render=None)
  return [i.key for i in run.items(rec, plan)]


def test_a_short_budget_measures_the_core_first_and_records_the_rest(
  tmp_path,
):
  # 30 s without the smoke step: the draft, the XXL init and v(1) take a
  # few seconds on a 2-core CPU; the full tiny plan takes about two
  # minutes, so many items cannot fit.
  out = str(tmp_path / 'accel')
  code = run.main(
    ['--tiny', '--budget', '30', '--skip', 'smoke', '--out_dir', out]
  )
  assert code == 0
  doc = _doc(out)
  assert doc['finished'] and doc['running'] is None and not doc['errors']
  # Items carry their prediction; the rest are an item's parts (the
  # identity check's batches).
  ran = [
    f'{e["section"]}/{e["item"]}'
    for e in doc['timeline']
    if e['predicted'] is not None
  ]
  skipped = {f'{x["section"]}/{x["item"]}': x['why'] for x in doc['skipped']}
  order = _order(plan_lib.tiny(30), tmp_path / 'order')
  # Every item is accounted for, once, and the ones that ran ran in order.
  assert sorted(ran + list(skipped)) == sorted(order)
  assert ran == [k for k in order if k in ran]
  assert ran[:3] == ['setup/draft', 'xxl/init', 'xxl/v(1)']
  assert skipped['smoke/checks'].startswith('not selected')
  # The XXL core came before anything else, and its rows exist.
  first_rest = min(
    (order.index(k) for k in ran if not k.startswith(('setup', 'xxl/'))),
    default=len(order),
  )
  assert all(order.index(k) < first_rest for k in ran if k.startswith('xxl/'))
  xxl = doc['sections']['sizes']['xxl']
  assert xxl['target_step_ms'] > 0 and xxl['step']['1']['bound_ms'] > 0
  # Much of the plan did not fit, and says why.
  assert len(skipped) >= 6
  assert any('predicted' in why and 'left in its box' in why
             for why in skipped.values())  # fmt: skip
  parts = {e['section'] for e in doc['timeline'] if e['predicted'] is None}
  assert parts <= {k.split('/')[0] for k in ran}


def test_a_killed_run_says_where_it_stopped(tmp_path):
  rec = record.Recorder(str(tmp_path), {}, render=None)

  def die(box):
    raise KeyboardInterrupt  # What SIGINT or timeout's kill leaves.

  items = [
    runner.Item('xxl', 'v(1)', lambda: 1.0, lambda box: None),
    runner.Item('xxl', 'v(8)', lambda: 1.0, die),
  ]
  with pytest.raises(KeyboardInterrupt):
    runner.Runner(rec, 60, {}).run(items)
  doc = _doc(str(tmp_path))
  assert not doc['finished']
  assert doc['running']['item'] == 'v(8)' and doc['running']['predicted'] == 1
  assert [e['item'] for e in doc['timeline']] == ['v(1)']


def test_items_that_would_not_fit_are_skipped_with_their_prediction(
  tmp_path,
):
  rec = record.Recorder(str(tmp_path), {}, render=None)
  calls = []
  items = [
    runner.Item('xxl', 'a', lambda: 0.01, lambda box: calls.append('a')),
    runner.Item('xxl', 'b', lambda: 1e6, lambda box: calls.append('b')),
    runner.Item('trees', 'c', lambda: 0.01, lambda box: calls.append('c')),
    runner.Item('beam', 'd', lambda: 0.01, lambda box: calls.append('d')),
  ]
  r = runner.Runner(rec, 60, {'trees': 0.5, 'beam': 0.5})
  r.run(items, skip=['beam'])
  assert calls == ['a', 'c']
  why = {x['item']: x['why'] for x in rec.data['skipped']}
  assert why['b'].startswith('predicted 1000000 s > ')
  assert why['d'].startswith('not selected')

  # An item that finds out on running that it cannot is a skip, once.
  def cannot(box):
    raise runner.Skip('needs v(1), not measured')

  r.run([runner.Item('xxl', 'late', lambda: 0.0, cannot)])
  assert [x['item'] for x in rec.data['skipped']].count('late') == 1
  assert 'late' not in [e['item'] for e in rec.data['timeline']]
  assert rec.data['running'] is None

  # A prediction that raises is that item's error; the run goes on.
  def broken():
    raise ValueError('max() iterable argument is empty')

  r.run([
    runner.Item('xxl', 'broken', broken, lambda box: calls.append('x')),
    runner.Item('xxl', 'after', lambda: 0.0, lambda box: calls.append('y')),
  ])  # fmt: skip
  assert calls[-1] == 'y' and 'x' not in calls
  assert 'max() iterable' in rec.data['errors'][-1]['error']
  # The negative control: with room, the same item runs.
  r2 = runner.Runner(rec, 60, {})
  r2.run([runner.Item('xxl', 'b', lambda: 1.0, lambda b: calls.append('b'))])
  assert calls[-1] == 'b'


def test_only_and_skip_name_sections_or_items():
  item = runner.Item('xxl', 'v(8)', lambda: 0, lambda box: None)
  assert runner.selected(item, [], [])
  assert runner.selected(item, ['xxl'], [])
  assert runner.selected(item, ['xxl/v(8)'], [])
  assert not runner.selected(item, ['trees'], [])
  assert not runner.selected(item, [], ['xxl/v(8)'])
  assert not runner.selected(item, ['xxl'], ['xxl'])


def test_a_failing_smoke_step_stops_the_run(tmp_path, monkeypatch, capsys):
  from spec_decode.bench.accel import api_check

  monkeypatch.setattr(
    api_check,
    'check',
    lambda: [{'api': 'jax.moved', 'ok': False, 'error': 'gone', 'seconds': 0}],
  )
  out = str(tmp_path / 'accel')
  assert run.main(['--tiny', '--budget', '30', '--out_dir', out]) == 3
  doc = _doc(out)
  assert 'jax.moved' in doc['errors'][0]['error']
  assert [e['item'] for e in doc['timeline']] == ['checks']
  assert 'smoke step failed' in capsys.readouterr().out


def test_real_sizes_are_refused_on_a_cpu(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    run.main(['--out_dir', str(tmp_path)])
  assert e.value.code == 2
  assert 'need an accelerator' in capsys.readouterr().err
  for bad in (['--only', 'nope'], ['--skip', 'nope/x']):
    with pytest.raises(SystemExit):
      run.main(['--tiny', '--out_dir', str(tmp_path)] + bad)
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


def test_full_plan_puts_the_xxl_core_first(tmp_path):
  plan = plan_lib.full(360.0)
  assert list(plan.targets) == ['xxl', 'small', 'base', 'large', 'xl']
  assert plan.targets['xxl'].emb_dim == 4096
  assert str(plan.targets['xxl'].dtype) == 'bfloat16'
  assert not plan.targets['xxl'].cpu_kernel
  assert abs(sum(plan.boxes.values()) - 1.0) < 1e-9
  assert plan.core_ks == (1, 8, 2, 4, 16)
  assert (plan.core_alpha, plan.core_gamma) == (0.75, 7)
  order = _order(plan, tmp_path)
  assert order[:10] == [
    'smoke/checks', 'setup/draft', 'xxl/init', 'xxl/v(1)', 'xxl/v(8)',
    'xxl/v(2)', 'xxl/v(4)', 'xxl/v(16)', 'xxl/c', 'xxl/alpha 0.75 gamma 7',
  ]  # fmt: skip
  assert order[10] == 'identity_bfloat16/rows'
  # The core has no share: it runs against the whole budget.
  assert not {k.split('/')[0] for k in order[:11]} & set(plan.boxes)
  # The T5Gemma section comes after every T5 section, in its own share.
  gemma = [k for k in order if k.startswith('t5gemma/')]
  assert order[-len(gemma) :] == gemma
  assert gemma == [
    't5gemma/draft', 't5gemma/init', 't5gemma/v(1)', 't5gemma/v(8)',
    't5gemma/v(2)', 't5gemma/v(4)', 't5gemma/v(16)', 't5gemma/c',
    't5gemma/alpha 0.75 gamma 7', 't5gemma/alpha 0.5', 't5gemma/alpha 0.9',
  ]  # fmt: skip
  assert plan.boxes['t5gemma'] > 0


def test_t5gemma_pair_is_9b_2b_with_s_s_and_fits_an_h100():
  plan = plan_lib.full()
  target, draft = plan.t5gemma_target, plan.t5gemma_draft
  assert (target.encoder.num_layers, target.encoder.emb_dim) == (42, 3584)
  assert (target.decoder.num_layers, target.decoder.emb_dim) == (26, 2304)
  assert (draft.decoder.num_layers, draft.decoder.emb_dim) == (8, 512)
  assert target.vocab_size == draft.vocab_size == 256_000
  assert str(target.param_dtype) == str(draft.param_dtype) == 'bfloat16'

  def nbytes(config):
    params = jax.eval_shape(lambda: sd.T5GemmaModel.init(config, seed=0).params)
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))

  # plan.py's comment: 12.29B parameters in bfloat16, and the draft.
  assert nbytes(target) == 2 * 12_292_375_296
  total = nbytes(target) + nbytes(draft)
  assert total < 78 * 2**30 / 3, total / 2**30


@pytest.mark.parametrize(
  'name,size', [('t5gemma_target', '9b_2b'), ('t5gemma_draft', 's_s')]
)
def test_t5gemma_pair_is_what_its_size_files_build(name, size):
  """The bench reads no gin (`plan.t5gemma_size` spells the values out);
  the size files are the reference."""
  from spec_decode import gin_cli
  from spec_decode.t5gemma import config as config_lib

  gin_cli.parse([f'models/t5gemma/{size}.gin'], [])
  try:
    want = gin_cli.configured(config_lib.T5GemmaConfig)()
  finally:
    gin_cli.parse([], [])
  want = want.replace(dtype='bfloat16', param_dtype='bfloat16', cpu_sum_block=0)
  assert getattr(plan_lib.full(), name) == want


def test_t5gemma_real_widths_build_at_toy_depth():
  """The T5Gemma section's programs, traced at the real widths (two
  layers per stack: one sliding, one global)."""
  plan = plan_lib.full()
  target = plan_lib.toy_depth(plan.t5gemma_target, 2)
  draft = plan_lib.toy_depth(plan.t5gemma_draft, 2)
  assert target.decoder.layer_types == ('sliding', 'global')
  got = shapes.build(target, draft, plan.core_gamma)
  assert got['params']['encoder']['embedder']['embedding'].shape == (
    256_000, 3584,
  )  # fmt: skip
  assert got['params']['decoder']['embedder']['embedding'].shape == (
    256_000, 2304,
  )  # fmt: skip
  assert got['decodes'][0][0].shape == (1, 8)


@pytest.mark.parametrize('size', plan_lib.SIZES)
def test_real_widths_build_at_toy_depth(size):
  """Every program the bench compiles, traced at the real widths."""
  plan = plan_lib.full()
  target = plan_lib.toy_depth(plan.targets[size])
  got = shapes.build(target, plan_lib.toy_depth(plan.draft), plan.core_gamma)
  assert got['params']['token_embedder']['embedding'].shape == (
    target.vocab_size,
    target.emb_dim,
  )
  plain_tokens = got['decodes'][0][0]
  assert plain_tokens.shape == (1, 8)


def test_bandwidth_bound_counts_weights_and_cache():
  config = plan_lib.t5_1_1('xxl')
  nbytes = cost.step_bytes(config, 1, 0, 0)
  # T5 v1.1 XXL's decoder: 24 layers of 4 + 2 attention projections of
  # 4096 x 4096 and 3 MLP matrices of 4096 x 10240, and the 32128 x 4096
  # vocabulary projection, in bfloat16: 12.9 GB.
  want = 2 * (24 * (6 * 4096 * 4096 + 3 * 4096 * 10240) + 32128 * 4096)
  assert nbytes == want
  assert cost.step_bytes(config, 2, 10, 6) == want + 2 * 2 * 24 * 2 * 16 * 4096
  # T5Gemma 9B-2B's decoder: 26 layers of grouped-query attention (q and
  # o 2304 x 2048, k and v 2304 x 1024), the cross-attention's q and o,
  # GeGLU's 3 x 2304 x 9216, and the 256000 x 2304 tied head.
  gemma = plan_lib.full().t5gemma_target
  want = 2 * (
    26 * (4 * 2304 * 2048 + 2 * 2304 * 1024 + 3 * 2304 * 9216) + 256_000 * 2304
  )
  assert cost.step_bytes(gemma, 1, 0, 0) == want
  kv = 2 * 1024 * 2  # keys and values of 4 heads of 256, bfloat16
  assert cost.step_bytes(gemma, 1, 10, 6) == want + 26 * (10 + 6) * kv
  # Past the window a sliding layer reads its ring (4096 + 96 - 1), a
  # global layer every slot.
  assert cost.step_bytes(gemma, 1, 8192, 6) == want + kv * (
    13 * (4191 + 6) + 13 * (8192 + 6)
  )
  assert cost.nominal_bandwidth('NVIDIA H100 80GB HBM3') == 3.35e12
  assert cost.nominal_bandwidth('NVIDIA H200') == 4.8e12
  assert cost.nominal_bandwidth('Quantum abacus') is None


def test_predictor_learns_compile_rates_conservatively():
  p = cost.Predictor(rate=1.0, margin=1.0)
  config = plan_lib.t5_1_1('small')
  assert p.predict(10, 0, config) == 10.0  # The prior.
  p.observe_compile(10, 2.0)  # The first measurement replaces the prior.
  assert p.rate == pytest.approx(0.2)
  p.observe_compile(10, 1.0)  # A faster one does not lower it.
  assert p.rate == pytest.approx(0.2)
  p.observe_compile(10, 5.0)
  assert p.rate == pytest.approx(0.5)
  p.step[config] = 0.01
  assert p.predict(0, 100, config) == pytest.approx(1.0)


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


def test_suppress_eos_of_a_t5gemma_head():
  """A toy T5Gemma whose EOS row dominates its tied head: every greedy
  step picks EOS before, none after."""
  from spec_decode.bench.accel import sizes
  from spec_decode.bench.accel import weights

  config = plan_lib.toy_t5gemma(2, 32).replace(
    dtype='float32', param_dtype='float32'
  )
  model = weights.random_model(config, seed=0)
  params = jax.tree.map(lambda x: x, model.params)
  table = params['decoder']['embedder']['embedding']
  params['decoder']['embedder']['embedding'] = table.at[1].set(
    10 * table[5]
  )  # EOS (1) points where token 5 does, ten times as far.
  loud = sd.T5GemmaModel(config, params)
  enc = np.arange(5, 17, dtype=np.int32).reshape(1, 12)
  dec = np.array([[0, 5, 5, 5, 5]], np.int32)
  assert (np.argmax(loud.logits(enc, dec), -1) == 1).any()
  quiet = sizes.suppress_eos(loud)
  assert not (np.argmax(quiet.logits(enc, dec), -1) == 1).any()
  got = quiet.params['decoder']['embedder']['embedding']
  np.testing.assert_array_equal(got[1], 0.5 * got[3])


def test_an_alpha_item_without_a_wider_v_is_skipped(tmp_path):
  """Only v(1) measured (a loaded machine's short run): Theorem 3.8 has no
  gamma to choose, which is a skip with its reason, not a crash."""
  from spec_decode.bench.accel import sizes

  plan = plan_lib.tiny()
  rec = record.Recorder(str(tmp_path), {}, render=None)
  bench = sizes.SizeBench(
    rec, plan, cost.Predictor(), 'xxl', lambda: None, lambda: None
  )
  bench.times[1] = 1e-4
  bench.out['c'] = 0.5
  with pytest.raises(runner.Skip, match='k >= 2'):
    bench.alpha_item(0.9).predict()
  bench.times[3] = 2e-4  # The negative control: with v(3) it predicts.
  assert bench.alpha_item(0.9).predict() > 0


def test_t5gemma_items_skip_without_their_draft(tmp_path):
  """The T5Gemma draft is made by its own (predicted) item; where that
  item is left out, c and the speedups skip instead of making it."""
  out = str(tmp_path / 'accel')
  code = run.main([
    '--tiny', '--skip', 'smoke', '--only', 't5gemma/c,t5gemma/alpha 0.9',
    '--out_dir', out,
  ])  # fmt: skip
  assert code == 0
  why = {x['item']: x['why'] for x in _doc(out)['skipped']
         if x['section'] == 't5gemma'}  # fmt: skip
  assert why['c'] == 'needs the draft (t5gemma_draft), not made'
  assert why['alpha 0.9'] == 'needs v(1) and c, not measured'
  assert 't5gemma_draft' not in _doc(out)['sections']

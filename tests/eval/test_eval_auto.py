"""Eval runs with gamma='auto': the in-loop policy, no calibration decode.

The speculative side of an auto run is `sd.generate(gamma='auto')`. The
policy's cost model is fixed here (`auto_costs.measure` patched to return
given seconds, in a temporary cost cache), so that what it chooses is known
and the tests are fast; the tiny random models of `test_eval.py` decode.
"""

import dataclasses
import json
import os

import pytest

import spec_decode as sd
from spec_decode.chain import auto_costs
from spec_decode.eval import cli
from spec_decode.eval import decoding
from spec_decode.eval import report
from spec_decode.eval import run as eval_lib
from spec_decode.policy import cost_cache

SETTINGS = eval_lib.EvalSettings(
  task='synthetic_tiny',
  num_examples=3,
  batch_size=2,
  max_decode_len=12,
  max_input_len=32,
  timing_repeats=1,
  timing_rounds=1,
  gamma='auto',
  max_auto_gamma=3,
)
RUN = dict(progress=False, print_summary=False)
# Seconds per loop iteration at gamma 0..3 under which gamma 0 (a plain
# target step) always wins: speculation would need E[tokens] > 100. Probes
# come after 99 / 0.02 gamma-0 iterations, far past 12 tokens.
PLAIN_WINS = [1.0, 100.0, 100.0, 100.0]
# Gamma 3 at the prior alpha 0.8, 2 at alpha 0.5-0.6, 0 below ~0.45: the
# schedule moves with the acceptance estimate.
MIXED = [1.0, 1.5, 1.7, 1.9]


@pytest.fixture(scope='module')
def models():
  vocab = eval_lib.task_vocabulary('synthetic_tiny', vocab_size=64)
  tiny = 'models/t5_1_1/tiny.gin'
  target = eval_lib.load_model(model_gin=tiny, seed=0, vocabulary=vocab)
  draft = eval_lib.load_model(model_gin=tiny, seed=1, vocabulary=vocab)
  return target, draft


@pytest.fixture
def costs(monkeypatch, tmp_path):
  """Sets the seconds `auto_costs.measure` returns; counts its calls."""
  monkeypatch.setenv('SPEC_DECODE_CACHE_DIR', str(tmp_path / 'costs'))
  monkeypatch.setattr(cost_cache, '_memory', {})

  def use(seconds):
    measured = []

    def measure(*args, **kwargs):
      measured.append(1)
      return list(seconds)

    monkeypatch.setattr(auto_costs, 'measure', measure)
    return measured

  return use


def _lines(path):
  with open(os.path.join(path, eval_lib.EXAMPLES_FILE), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def _state(path):
  with open(os.path.join(path, eval_lib.STATE_FILE), encoding='utf-8') as f:
    return json.load(f)


def _untimed(rec):
  return report.strip_timings(rec)


def test_auto_run_decodes_with_the_policy_and_reports_it(
  models, costs, tmp_path, monkeypatch
):
  measured = costs(PLAIN_WINS)
  calls = []
  decoder_call = decoding.Decoder.__call__

  def counted(self, enc, seeds, gamma=None, timed=True):
    calls.append(gamma)
    return decoder_call(self, enc, seeds, gamma, timed)

  monkeypatch.setattr(decoding.Decoder, '__call__', counted)
  target, draft = models
  out = str(tmp_path / 'run')
  r = eval_lib.evaluate(target, draft, SETTINGS, output_dir=out, **RUN)
  # Two batches, each decoded once plainly and once by the policy: nothing
  # is decoded to choose gamma.
  assert calls == [None, decoding.AUTO, None, decoding.AUTO]
  assert len(measured) == 1  # The cost model: measured once, then cached.
  assert (r['gamma_mode'], r['gamma'], r['gammas']) == (
    'auto',
    'auto',
    ['auto'],
  )
  assert r['exact_match_fraction'] == 1.0
  # Gamma 0 won every iteration: plain steps, no draft call, and each
  # batch iteration is counted once.
  assert r['max_gamma'] == 3
  assert r['gamma_iterations'] == [r['target_calls'], 0, 0, 0]
  assert r['target_calls'] == r['plain_target_calls']
  assert (r['mean_gamma'], r['draft_calls'], r['tokens_per_call']) == (0, 0, 1)
  assert sum(r['accepted_histogram']) == 0  # No drafting iteration.
  # The probes timed a target call on 1..4 tokens (every γ the policy may
  # run); γ 0 throughout, so the schedule's mean v is v(1) = 1 and the
  # prediction is plain decoding's speed.
  assert set(r['v_of_k']) == {'1', '2', '3', '4'}
  assert r['mean_v'] == r['v'] == 1.0
  assert r['speedup_predicted'] == pytest.approx(1.0)
  policy = r['gamma_policy']
  assert (policy['policy'], policy['max_gamma']) == ('finish_time', 3)
  [model] = policy['cost_models']
  assert model['measured'] is True
  assert model['iteration_seconds'] == {
    str(g): s for g, s in enumerate(PLAIN_WINS)
  }
  assert os.path.exists(model['path'])
  assert _state(out)['gamma_policy'] == policy
  for rec in _lines(out):
    assert list(rec['speculative']) == ['auto']
    spec = rec['speculative']['auto']
    assert spec['gamma_iterations'] == [spec['iterations'], 0, 0, 0]
  with open(os.path.join(out, eval_lib.SUMMARY_FILE), encoding='utf-8') as f:
    summary = f.read()
  assert 'gamma = auto: the finish-time policy' in summary
  assert 'no calibration decode' in summary
  assert f'Cost model {model["key"]}' in summary
  assert 'measured by this run' in summary
  assert '| auto (mean 0.00) |' in summary
  with open(
    os.path.join(out, 'synthetic_tiny-predict.jsonl-00000-of-00001')
  ) as f:
    predictions = [json.loads(line) for line in f]
  assert [p['prediction'] for p in predictions] == [
    rec['speculative']['auto']['text'] for rec in _lines(out)
  ]


def test_a_cost_model_from_the_disk_cache_is_reported_as_such(
  models, costs, tmp_path, monkeypatch
):
  target, draft = models
  costs(PLAIN_WINS)
  settings = dataclasses.replace(SETTINGS, num_examples=2)
  first = eval_lib.evaluate(
    target, draft, settings, output_dir=str(tmp_path / 'a'), **RUN
  )
  # A new process: nothing in memory; measuring again would fail.
  monkeypatch.setattr(cost_cache, '_memory', {})
  measured_again = costs([])
  again = eval_lib.evaluate(
    target, draft, settings, output_dir=str(tmp_path / 'b'), **RUN
  )
  assert not measured_again
  [model] = again['gamma_policy']['cost_models']
  assert model['measured'] is False
  assert dict(model, measured=True) == first['gamma_policy']['cost_models'][0]
  with open(os.path.join(tmp_path / 'b', eval_lib.SUMMARY_FILE)) as f:
    assert 'read from the cost cache (measured earlier)' in f.read()


def test_an_interrupted_auto_run_resumes_to_the_same_results(
  models, costs, tmp_path
):
  costs(MIXED)
  target, draft = models
  settings = dataclasses.replace(SETTINGS, num_examples=5)
  full_dir = str(tmp_path / 'full')
  full = eval_lib.evaluate(target, draft, settings, output_dir=full_dir, **RUN)

  class Interrupt(Exception):
    pass

  def stop(done):
    if done >= 2:
      raise Interrupt

  out = str(tmp_path / 'resumed')
  with pytest.raises(Interrupt):
    eval_lib.evaluate(
      target, draft, settings, output_dir=out, on_batch_done=stop, **RUN
    )
  assert len(_lines(out)) == 2
  assert _state(out)['gamma_policy']['cost_models']  # Saved with batch 1.
  seen = []
  resumed = eval_lib.evaluate(
    target, draft, settings, output_dir=out, on_batch_done=seen.append, **RUN
  )
  assert seen == [4, 5]
  assert eval_lib.strip_timings(resumed) == eval_lib.strip_timings(full)
  assert [_untimed(r) for r in _lines(out)] == [
    _untimed(r) for r in _lines(full_dir)
  ]
  # The schedule is the policy's, not one γ: this cost model mixes them.
  ran = [g for g, n in enumerate(full['gamma_iterations']) if n]
  assert len(ran) >= 2
  # The probes timed v(k) for every γ the policy may run (k = 1..4).
  assert set(full['v_of_k']) == {'1', '2', '3', '4'}
  assert full['exact_match_fraction'] == 1.0
  assert (
    resumed['gamma_policy']['cost_models'][0]['iteration_seconds']
    == full['gamma_policy']['cost_models'][0]['iteration_seconds']
  )


def test_a_former_calibrated_auto_directory_is_not_resumed(
  models, costs, tmp_path
):
  costs(PLAIN_WINS)
  target, draft = models
  out = str(tmp_path / 'old')
  settings = dataclasses.replace(SETTINGS, num_examples=2)
  eval_lib.evaluate(target, draft, settings, output_dir=out, **RUN)
  state = _state(out)
  for key in ('gamma_policy', 'max_auto_gamma'):
    del state['settings'][key]  # What the calibrated auto-γ wrote.
  with open(os.path.join(out, eval_lib.STATE_FILE), 'w') as f:
    json.dump(state, f)
  with pytest.raises(ValueError, match='other settings.*gamma_policy'):
    eval_lib.evaluate(target, draft, settings, output_dir=out, **RUN)


@pytest.mark.parametrize(
  'flag',
  [
    '--gin.CALIBRATION_BATCHES=2',
    '--gin.CALIBRATION_GAMMA=3',
    '--gin.spec_eval.EvalSettings.calibration_batches=2',
  ],
)
def test_the_removed_calibration_settings_are_refused(flag, capsys):
  code = cli.main(['--gin_file=smoke_synthetic', "--gin.GAMMA='auto'", flag])
  assert code == 2
  assert 'calibration' in capsys.readouterr().err.lower()


def test_each_batch_starts_from_the_estimate_of_the_batches_before(
  models, costs, tmp_path, monkeypatch
):
  """The policy of batch k starts from the acceptance estimate carried
  from batches 1..k-1 (batch 1 from the prior), never from one its own
  decodes (warm-up, timing rounds: the same seeds) produced; run_state.json
  keeps the last one."""
  costs(MIXED)
  calls = []
  generate = sd.generate

  def recorded(target, enc, **kw):
    out = generate(target, enc, **kw)
    if kw.get('gamma') == decoding.AUTO:
      calls.append((int(kw['seed'][0]), kw['acceptance'], out.gamma_choice))
    return out

  monkeypatch.setattr(sd, 'generate', recorded)
  target, draft = models
  settings = dataclasses.replace(SETTINGS, num_examples=5, timing_rounds=2)
  out = str(tmp_path / 'run')
  eval_lib.evaluate(target, draft, settings, output_dir=out, **RUN)
  batches = {}
  for seed, given, choice in calls:
    batches.setdefault(seed, []).append((given, choice))
  assert len(batches) == 3
  made = []  # The estimates each batch's decodes produced.
  for k, seed in enumerate(sorted(batches)):
    runs = batches[seed]
    assert len(runs) >= 2  # The timing rounds decode the batch again.
    for given, choice in runs:
      if k == 0:
        assert given is None
        assert choice['started_from'] == {'alpha': 0.8, 'weight': 2.0}
      else:
        # The previous batch's first recorded decode's estimate.
        assert any(given is e for e in made[k - 1]), (k, given)
        assert given.decodes == k
        assert choice['started_from'] == {
          'alpha': given.alpha,
          'weight': given.weight,
        }
        assert choice['started_from'] != {'alpha': 0.8, 'weight': 2.0}
    made.append([choice['acceptance'] for _, choice in runs])
  saved = _state(out)['gamma_policy']['acceptance']
  assert saved['decodes'] == 3
  assert any(saved == e.to_json() for e in made[2])

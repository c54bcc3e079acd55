"""Eval run tests: the whole pipeline on tiny random models, resume, CLI.

Every run uses the random T5 v1.1 "tiny" target and draft of
`configs/smoke_synthetic.gin` (same configs, vocabulary and shapes), so the
decode loops compile once per shape for the whole module.
"""

import json
import os

import pytest

from spec_decode.eval import cli
from spec_decode.eval import run as eval_lib

REQUIRED_FIELDS = (
  'exact_match_fraction', 'alpha', 'speedup_measured', 'speedup_predicted',
  'c', 'v', 'gamma', 'temperature', 'quality', 'num_examples',
  # Also documented:
  'accepted_histogram', 'per_position_acceptance', 'target_calls',
  'draft_calls', 'tokens_per_call', 'speedup_predicted_theorem38',
  'walltime', 'plain_target_calls', 'exact_algorithm', 'sweep', 'v_of_k',
)  # fmt: skip
RUN = dict(
  task='synthetic_tiny',
  num_examples=5,
  batch_size=2,
  max_decode_len=12,
  max_input_len=32,
  timing_repeats=1,
  progress=False,
  print_summary=False,
)


@pytest.fixture(scope='module')
def models():
  vocab = eval_lib.task_vocabulary('synthetic_tiny', vocab_size=64)
  tiny = 'models/t5_1_1/tiny.gin'
  target = eval_lib.load_model(model_gin=tiny, seed=0, vocabulary=vocab)
  draft = eval_lib.load_model(model_gin=tiny, seed=1, vocabulary=vocab)
  return target, draft


@pytest.fixture(scope='module')
def full_run(models, tmp_path_factory):
  """An uninterrupted sweep over gamma 2 and 3."""
  out = str(tmp_path_factory.mktemp('full'))
  target, draft = models
  results = eval_lib.evaluate(
    target=target, draft=draft, gamma=[2, 3], output_dir=out, **RUN
  )
  return out, results


def _lines(path):
  with open(os.path.join(path, eval_lib.EXAMPLES_FILE), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def _strip_record_timings(rec):
  rec = dict(rec, plain_seconds=None)
  rec['speculative'] = {
    g: dict(s, seconds=None) for g, s in rec['speculative'].items()
  }
  return rec


def test_smoke_run_writes_every_file_and_field(full_run):
  out, r = full_run
  for name in (
    eval_lib.RESULTS_FILE, eval_lib.SUMMARY_FILE, eval_lib.EXAMPLES_FILE,
    eval_lib.STATE_FILE, eval_lib.HISTOGRAM_PLOT, eval_lib.SWEEP_PLOT,
  ):  # fmt: skip
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  with open(os.path.join(out, eval_lib.RESULTS_FILE)) as f:
    on_disk = json.load(f)
  assert on_disk == json.loads(json.dumps(r))
  missing = [k for k in REQUIRED_FIELDS if k not in r]
  assert not missing
  assert r['num_examples'] == 5
  assert r['gamma'] == 2 and r['gammas'] == [2, 3]
  assert r['temperature'] == 0.0 and r['exact_algorithm']
  # Greedy, fp32: speculative output equals plain output on every example.
  assert r['exact_match_fraction'] == 1.0
  assert set(r['quality']) == {'bleu'}
  assert set(r['quality']['bleu']) == {'plain', 'speculative'}
  assert r['quality']['bleu']['plain'] == r['quality']['bleu']['speculative']
  assert 0.0 <= r['alpha'] <= 1.0
  assert len(r['accepted_histogram']) == 3
  assert len(r['per_position_acceptance']) == 2
  assert r['draft_calls'] == 2 * r['target_calls']
  assert r['c'] > 0 and r['v'] > 0 and r['speedup_measured'] > 0
  assert [s['gamma'] for s in r['sweep']] == [2, 3]
  assert r['sweep'][0]['alpha'] == r['alpha']

  lines = _lines(out)
  assert [rec['index'] for rec in lines] == list(range(5))
  for rec in lines:
    assert rec['input'].startswith('translate English to German: ')
    assert rec['reference'] and isinstance(rec['plain'], str)
    assert set(rec['speculative']) == {'2', '3'}
    spec = rec['speculative']['2']
    assert spec['tokens'] == rec['plain_tokens'] and spec['exact']
    assert sum(spec['accepted_histogram']) == spec['iterations']
  iterations = sum(rec['speculative']['2']['iterations'] for rec in lines)
  assert sum(r['accepted_histogram']) == iterations

  with open(os.path.join(out, eval_lib.SUMMARY_FILE)) as f:
    summary = f.read()
  assert '| synthetic_tiny |' in summary and 'Thm 3.8' in summary


def test_interrupted_run_resumes_to_the_same_results(models, full_run,
                                                     tmp_path):  # fmt: skip
  target, draft = models
  out = str(tmp_path / 'resumed')

  class Interrupt(Exception):
    pass

  def stop_after_two(done):
    if done >= 2:
      raise Interrupt

  with pytest.raises(Interrupt):
    eval_lib.evaluate(
      target=target, draft=draft, gamma=[2, 3], output_dir=out,
      on_batch_done=stop_after_two, **RUN,
    )  # fmt: skip
  assert len(_lines(out)) == 2
  assert not os.path.exists(os.path.join(out, eval_lib.RESULTS_FILE))
  # A crash in the middle of a write leaves a partial line behind.
  with open(os.path.join(out, eval_lib.EXAMPLES_FILE), 'a') as f:
    f.write('{"index": 2, "inp')

  seen = []
  resumed = eval_lib.evaluate(
    target=target, draft=draft, gamma=[2, 3], output_dir=out,
    on_batch_done=seen.append, **RUN,
  )  # fmt: skip
  assert seen == [4, 5]  # Only the missing batches were decoded.
  full_dir, full = full_run
  assert eval_lib.strip_timings(resumed) == eval_lib.strip_timings(full)
  assert [_strip_record_timings(r) for r in _lines(out)] == [
    _strip_record_timings(r) for r in _lines(full_dir)
  ]


def test_other_settings_in_the_same_directory_are_refused(models, full_run):
  target, draft = models
  out, _ = full_run
  with pytest.raises(ValueError, match='other settings.*gamma'):
    eval_lib.evaluate(target=target, draft=draft, gamma=[4], output_dir=out,
                      **RUN)  # fmt: skip


def test_draft_equal_to_target_accepts_everything_at_temperature_1(
  models, tmp_path
):
  # Same seeds for both decodes: a draft equal to the target reproduces
  # plain sampling token for token, and every draft token is accepted.
  target, _ = models
  run = dict(RUN, num_examples=2)
  r = eval_lib.evaluate(
    target=target, draft=target, gamma=3, temperature=1.0,
    output_dir=str(tmp_path), **run,
  )  # fmt: skip
  assert r['exact_match_fraction'] == 1.0
  assert r['alpha'] == pytest.approx(1.0, abs=1e-5)
  assert r['per_position_acceptance'] == [1.0, 1.0, 1.0]
  assert r['accepted_histogram'][:3] == [0, 0, 0]
  assert 3.0 < r['tokens_per_call'] <= 4.0  # Rows can end early (EOS).
  assert r['sweep'] == [] and not os.path.exists(
    os.path.join(str(tmp_path), eval_lib.SWEEP_PLOT)
  )


def test_auto_gamma_reports_its_choice(models, tmp_path):
  target, draft = models
  r = eval_lib.evaluate(
    target=target, draft=draft, gamma='auto', output_dir=str(tmp_path),
    calibration_batches=1, calibration_gamma=2, max_auto_gamma=3,
    **dict(RUN, num_examples=2),
  )  # fmt: skip
  choice = r['gamma_choice']
  assert r['gamma_mode'] == 'auto'
  assert 1 <= choice['gamma'] <= 3 and r['gamma'] == choice['gamma']
  assert choice['calibration']['examples'] == 2
  assert set(choice['calibration']['v_of_k']) == {'1', '2', '3', '4'}
  with open(os.path.join(str(tmp_path), eval_lib.STATE_FILE)) as f:
    assert json.load(f)['gamma_choice'] == choice
  with open(os.path.join(str(tmp_path), eval_lib.SUMMARY_FILE)) as f:
    assert f'gamma = auto: chose {choice["gamma"]}' in f.read()


def test_lenient_runs_are_labelled_not_exact(full_run):
  _, r = full_run
  lenient = dict(r, exact_algorithm=False, lenience=0.5)
  assert 'NOT exact' in eval_lib.eval_report.summary_markdown(lenient)
  assert 'NOT exact' not in eval_lib.eval_report.summary_markdown(r)


def test_parse_gamma():
  assert eval_lib.parse_gamma(7) == [7]
  assert eval_lib.parse_gamma([3, 5, 3]) == [3, 5]
  assert eval_lib.parse_gamma('2,4') == [2, 4]
  assert eval_lib.parse_gamma('AUTO') == 'auto'
  for bad in (0, [], [1, -1], True):
    with pytest.raises(ValueError):
      eval_lib.parse_gamma(bad)


# -- the command line -----------------------------------------------------


def test_cli_runs_the_smoke_config(models, tmp_path, capsys):
  del models  # Only shares the compiled decode loops.
  out = str(tmp_path / 'cli')
  code = cli.main([
    '--gin_file=smoke_synthetic', '--gin.NUM_EXAMPLES=3',
    '--gin.SPLIT=validation', f'--output_dir={out}', '--no_progress',
  ])  # fmt: skip
  assert code == 0
  with open(os.path.join(out, eval_lib.RESULTS_FILE)) as f:
    r = json.load(f)
  assert r['num_examples'] == 3 and r['split'] == 'validation'
  assert r['gamma'] == 3 and r['draft'] == 'random tiny (seed 1)'
  assert os.path.exists(os.path.join(out, 'config.gin'))
  printed = capsys.readouterr().out
  assert '| synthetic_tiny | random tiny (seed 1) | 0 | 3 |' in printed


def test_cli_reports_a_missing_checkpoint(tmp_path, capsys):
  code = cli.main([
    '--gin_file=configs/demo_debian_ende.gin',
    '--gin.TARGET_CHECKPOINT=/nonexistent/target',
    f'--output_dir={tmp_path}',
  ])  # fmt: skip
  assert code == 1
  assert 'checkpoint not found: /nonexistent/target' in capsys.readouterr().err


def test_cli_names_a_required_macro(capsys):
  assert cli.main(['--gin_file=runs/eval.gin']) == 2
  err = capsys.readouterr().err
  assert 'is required' in err and '--gin.' in err


def test_default_run_without_the_demo_pair_says_what_to_do(monkeypatch, capsys):
  monkeypatch.setattr(cli, 'DEMO_CHECKPOINTS', ('no/such/checkpoint',))
  assert cli.main([]) == 1
  err = capsys.readouterr().err
  assert 'no/such/checkpoint' in err and 'spec-decode train' in err


def test_gin_flags_become_bindings():
  assert cli.binding_from_flag('--gin.GAMMA=7') == 'GAMMA = 7'
  assert cli.binding_from_flag('--gin.GAMMA=[3, 5]') == 'GAMMA = [3, 5]'
  assert cli.binding_from_flag('--gin.TASK=debian_ende') == (
    "TASK = 'debian_ende'"
  )
  assert cli.binding_from_flag("--gin.GAMMA='auto'") == "GAMMA = 'auto'"
  assert cli.binding_from_flag('--gin.X=/a/b') == "X = '/a/b'"
  assert cli.binding_from_flag('--gin.X=None') == 'X = None'
  assert cli.binding_from_flag('--gin.X=@f()') == 'X = @f()'
  with pytest.raises(ValueError):
    cli.binding_from_flag('--gin.GAMMA')

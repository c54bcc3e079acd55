"""Eval run tests: the whole pipeline on tiny random models, resume, CLI.

Every run uses the random T5 v1.1 "tiny" target and draft of
`configs/smoke_synthetic.gin` (same configs, vocabulary and shapes), so the
decode loops compile once per shape for the whole module.
"""

import dataclasses
import json
import os

import numpy as np
import pytest

from spec_decode import gin_cli
from spec_decode.core import provenance as prov
from spec_decode.eval import cli
from spec_decode.eval import report
from spec_decode.eval import run as eval_lib
from spec_decode.eval import settings as settings_lib

REQUIRED_FIELDS = (
  'exact_match_fraction', 'alpha', 'speedup_measured', 'speedup_predicted',
  'c', 'v', 'gamma', 'temperature', 'quality', 'num_examples',
  # Also documented:
  'accepted_histogram', 'per_position_acceptance', 'target_calls',
  'draft_calls', 'tokens_per_call', 'speedup_predicted_theorem38',
  'walltime', 'plain_target_calls', 'exact_algorithm', 'sweep', 'v_of_k',
)  # fmt: skip
SETTINGS = eval_lib.EvalSettings(
  task='synthetic_tiny',
  num_examples=5,
  batch_size=2,
  max_decode_len=12,
  max_input_len=32,
  timing_repeats=1,
  timing_rounds=2,
)
RUN = dict(progress=False, print_summary=False)


def _settings(**changes):
  return dataclasses.replace(SETTINGS, **changes)


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
    target, draft, _settings(gamma=[2, 3]), output_dir=out, **RUN
  )
  return out, results


def _lines(path):
  with open(os.path.join(path, eval_lib.EXAMPLES_FILE), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def _strip_record_timings(rec):
  return report.strip_timings(rec)


def test_smoke_run_writes_every_file_and_field(full_run):
  out, r = full_run
  for name in (
    eval_lib.RESULTS_FILE, eval_lib.SUMMARY_FILE, eval_lib.EXAMPLES_FILE,
    eval_lib.STATE_FILE, eval_lib.HISTOGRAM_PLOT, eval_lib.SWEEP_PLOT,
    eval_lib.POSITION_PLOT, eval_lib.PAGE_FILE,
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
  # c and v timed apart by the batches' probes, in the same 2 rounds as
  # the decodes; the run's own cost per call is reported beside them.
  a = r['costs_apart']
  assert a['source'] == 'probes interleaved with the decodes'
  assert a['rounds'] == 2 and set(a['v_of_k']) == {'1', '3', '4'}
  assert r['c'] == a['c'] > 0 and r['v'] == a['v_of_k']['3'] > 0
  assert r['c_loops'] > 0 and r['iteration_cost'] > 0
  assert r['apart_cost'] == pytest.approx(2 * r['c'] + r['v'])
  assert r['cost_gap'] == pytest.approx(r['iteration_cost'] - r['apart_cost'])
  assert r['speedup_predicted'] == pytest.approx(
    r['expected_tokens_per_call'] / r['apart_cost']
  )
  assert r['speedup_predicted_theorem38'] == pytest.approx(
    r['expected_tokens_per_call'] / (2 * r['c'] + 1)
  )
  # The measured speedup: the median of 2 rounds' whole-run ratios.
  assert len(r['speedup_rounds']) == 2 and r['speedup_measured'] > 0
  assert r['speedup_measured'] == pytest.approx(np.median(r['speedup_rounds']))
  assert r['speedup_spread'] == [
    min(r['speedup_rounds']),
    max(r['speedup_rounds']),
  ]
  # Outputs that end and outputs that run out: every example in one group.
  e = r['by_ending']
  assert e['ends']['examples'] + e['runs_out']['examples'] == 5
  assert e['no_eos']['plain'] == e['runs_out']['examples']  # greedy: same
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
    # Each token's provenance: one code per token, an iteration start per
    # iteration, accepted codes as the counts say.
    codes = spec['provenance']
    assert len(codes) == len(spec['tokens'])
    assert sum(c & prov.START > 0 for c in codes) == spec['iterations']
    accepted = sum(c & prov.KIND_MASK == prov.ACCEPTED for c in codes)
    assert accepted == sum(spec['position_accepts'])
    for k, token in spec['rejected']:
      assert codes[k] & prov.KIND_MASK == prov.REPLACED
      assert token != spec['tokens'][k]
    assert rec['draft_alone_tokens'] >= 1
  iterations = sum(rec['speculative']['2']['iterations'] for rec in lines)
  assert sum(r['accepted_histogram']) == iterations

  with open(os.path.join(out, eval_lib.SUMMARY_FILE)) as f:
    summary = f.read()
  assert '| synthetic_tiny |' in summary and 'Thm 3.8' in summary
  assert '[examples.html](examples.html)' in summary
  assert '[position_acceptance.png](position_acceptance.png)' in summary
  with open(os.path.join(out, eval_lib.PAGE_FILE), encoding='utf-8') as f:
    page = f.read()
  assert page.count('class="ex"') == 5
  assert page.count('class="it"') == iterations + 1  # And the legend's.
  assert 'src="speedup_vs_gamma.png"' in page


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
      target, draft, _settings(gamma=[2, 3]), output_dir=out,
      on_batch_done=stop_after_two, **RUN,
    )  # fmt: skip
  assert len(_lines(out)) == 2
  assert not os.path.exists(os.path.join(out, eval_lib.RESULTS_FILE))
  # A crash in the middle of a write leaves a partial line behind.
  with open(os.path.join(out, eval_lib.EXAMPLES_FILE), 'a') as f:
    f.write('{"index": 2, "inp')

  seen = []
  resumed = eval_lib.evaluate(
    target, draft, _settings(gamma=[2, 3]), output_dir=out,
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
    eval_lib.evaluate(target, draft, _settings(gamma=[4]), output_dir=out,
                      **RUN)  # fmt: skip


def test_the_decode_method_is_part_of_the_run_identity(models, full_run):
  target, draft = models
  out, _ = full_run
  # A greedy directory is not resumed by a beam-search run (refused before
  # anything decodes).
  beam = _settings(gamma=[2, 3], decode_method='beam', num_beams=2)
  with pytest.raises(ValueError, match='other settings.*decode_method'):
    eval_lib.evaluate(target, draft, beam, output_dir=out, **RUN)

  def identity(settings):
    return eval_lib.run_identity(settings, 5, target, draft, target.vocabulary)

  greedy = identity(_settings())
  assert greedy['decode_method'] == 'greedy' and 'num_beams' not in greedy
  sampled = _settings(temperature=1.0, decode_method=None)
  assert identity(sampled)['decode_method'] == 'sample'
  assert identity(beam)['num_beams'] == 2
  assert identity(beam) != identity(dataclasses.replace(beam, num_beams=3))
  assert identity(beam) != identity(dataclasses.replace(beam, beam_alpha=1))


def test_draft_equal_to_target_accepts_everything_at_temperature_1(
  models, tmp_path
):
  # Same seeds for both decodes: a draft equal to the target reproduces
  # plain sampling token for token, and every draft token is accepted.
  target, _ = models
  r = eval_lib.evaluate(
    target, target, _settings(num_examples=2, gamma=3, temperature=1.0),
    output_dir=str(tmp_path), **RUN,
  )  # fmt: skip
  assert r['exact_match_fraction'] == 1.0
  assert r['alpha'] == pytest.approx(1.0, abs=1e-5)
  assert r['per_position_acceptance'] == [1.0, 1.0, 1.0]
  assert r['accepted_histogram'][:3] == [0, 0, 0]
  assert 3.0 < r['tokens_per_call'] <= 4.0  # Rows can end early (EOS).
  assert r['sweep'] == [] and not os.path.exists(
    os.path.join(str(tmp_path), eval_lib.SWEEP_PLOT)
  )


def test_lenient_runs_are_labelled_not_exact(full_run):
  _, r = full_run
  lenient = dict(r, exact_algorithm=False, lenience=0.5)
  assert 'NOT exact' in report.summary_markdown(lenient)
  assert 'NOT exact' not in report.summary_markdown(r)


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


def _binding(flag):
  bindings, rest = gin_cli.split_flags([flag])
  assert rest == []
  return bindings[0]


def test_gin_flags_become_bindings():
  assert _binding('--gin.GAMMA=7') == 'GAMMA = 7'
  assert _binding('--gin.GAMMA=[3, 5]') == 'GAMMA = [3, 5]'
  assert _binding('--gin.TASK=debian_ende') == "TASK = 'debian_ende'"
  assert _binding("--gin.GAMMA='auto'") == "GAMMA = 'auto'"
  assert _binding('--gin.X=/a/b') == "X = '/a/b'"
  assert _binding('--gin.X=None') == 'X = None'
  assert _binding('--gin.X=@f()') == 'X = @f()'
  with pytest.raises(ValueError):
    _binding('--gin.GAMMA')


def test_cli_reports_a_bad_gin_flag(capsys):
  assert cli.main(['--gin_file=smoke_synthetic', '--gin.GAMMA']) == 2
  assert 'expected --gin.NAME=VALUE' in capsys.readouterr().err


def test_cli_reports_a_missing_gin_file(capsys):
  assert cli.main(['--gin_file=no_such_config']) == 2
  assert 'gin file not found: no_such_config' in capsys.readouterr().err


def test_cli_gin_search_paths(models, tmp_path):
  del models  # Shares the compiled decode loops.
  search = tmp_path / 'configs'
  search.mkdir()
  (search / 'my_run.gin').write_text(
    'from __gin__ import dynamic_registration\n'
    "include 'smoke_synthetic.gin'\n"
    "include 'my_block.gin'\n"
  )
  (search / 'my_block.gin').write_text(
    'from __gin__ import dynamic_registration\nNUM_EXAMPLES = 2\n'
  )
  out = str(tmp_path / 'out')
  code = cli.main([
    '--gin_file=my_run', f'--gin_search_paths={search}',
    f'--output_dir={out}', '--no_progress',
  ])  # fmt: skip
  assert code == 0
  with open(os.path.join(out, eval_lib.RESULTS_FILE)) as f:
    assert json.load(f)['num_examples'] == 2


# -- the settings ---------------------------------------------------------


@pytest.mark.parametrize(
  'field, value',
  [
    ('task', 'no_such_task'), ('split', ''), ('split', None),
    ('num_examples', 0), ('batch_size', 0), ('batch_size', True),
    ('batch_size', 2.0), ('batch_size', '2'), ('gamma', 0), ('gamma', []),
    ('gamma', [2, -1]), ('gamma', 'fast'), ('temperature', -1.0),
    ('temperature', '1'), ('temperature', float('nan')), ('top_k', -1),
    ('top_p', 0.0), ('top_p', 1.5), ('max_decode_len', 0),
    ('max_input_len', 0), ('seed', 1.5), ('lenience', 0.0),
    ('lenience', 1.5), ('dynamic_gamma', 1.0), ('dynamic_gamma', -0.1),
    ('dynamic_gamma', True), ('vocabulary', 3), ('data_dir', 3),
    ('target_name', 3), ('draft_name', ''), ('timing_repeats', 0),
    ('max_auto_gamma', 0), ('task', None), ('max_decode_len', None),
    ('task_feature_lengths', {'inputs': 0}),
    ('task_feature_lengths', {'decoder': 8}),
    ('task_feature_lengths', {'targets': True}),
    ('task_feature_lengths', [8, 8]), ('task_feature_lengths', {}),
    ('mixture_or_task_module', 3),
    ('mixture_or_task_module', 'spec_decode_no_such_module'),
    ('seqio_vocabulary', 3),
  ],
)  # fmt: skip
def test_a_bad_setting_is_a_value_error_naming_the_field(field, value):
  with pytest.raises(ValueError, match=rf'^EvalSettings\.{field} must be'):
    _settings(**{field: value})


def test_settings_are_normalized():
  s = eval_lib.EvalSettings(
    task='synthetic_tiny', gamma='2, 4 2', temperature=1, top_p=1,
    lenience=1, dynamic_gamma=None, num_examples=None,
  )  # fmt: skip
  assert s.gamma == (2, 4)
  assert isinstance(s.temperature, float) and s.temperature == 1.0
  assert isinstance(s.top_p, float) and isinstance(s.lenience, float)
  assert s.dynamic_gamma == 0.0 and s.num_examples is None
  assert s.exact_algorithm
  assert s.sampling() == {'temperature': 1.0, 'top_k': 0, 'top_p': 1.0}
  assert _settings(gamma='Auto').gamma == 'auto'
  assert not _settings(lenience=0.5).exact_algorithm
  assert dataclasses.replace(s, gamma=7).gamma == (7,)
  # T5X's TASK_FEATURE_LENGTHS keys replace the lengths they name.
  lengths = _settings(task_feature_lengths={'targets': 9}, max_decode_len=None)
  assert (lengths.max_input_len, lengths.max_decode_len) == (32, 9)
  assert lengths.task_feature_lengths == {'targets': 9}
  both = _settings(task_feature_lengths={'inputs': 20, 'targets': 9})
  assert (both.max_input_len, both.max_decode_len) == (20, 9)
  assert _settings(mixture_or_task_module='json').mixture_or_task_module == (
    'json',
  )
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.seed = 3  # pytype: disable=not-writable
  assert settings_lib.EvalSettings is eval_lib.EvalSettings


@pytest.mark.parametrize(
  'flag, field',
  [
    ('--gin.BATCH_SIZE=0', 'batch_size'),
    ('--gin.TEMPERATURE=-1.0', 'temperature'),
    ('--gin.GAMMA=0', 'gamma'),
    ('--gin.TASK=no_such_task', 'task'),
    ('--gin.MIXTURE_OR_TASK_NAME=no_such_task', 'task'),
    ("--gin.TASK_FEATURE_LENGTHS={'targets': 0}", 'task_feature_lengths'),
  ],
)
def test_cli_checks_the_settings_before_loading_a_model(
  flag, field, tmp_path, capsys
):
  # Loading either model would fail first ("checkpoint not found").
  code = cli.main([
    '--gin_file=demo_debian_ende', '--gin.TARGET_CHECKPOINT=/nonexistent/t',
    '--gin.DRAFT_CHECKPOINT=/nonexistent/d', flag, f'--output_dir={tmp_path}',
  ])  # fmt: skip
  assert code == 1
  err = capsys.readouterr().err
  assert f'EvalSettings.{field} must be' in err
  assert 'checkpoint not found' not in err
  assert os.listdir(tmp_path) == []

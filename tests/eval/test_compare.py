"""Comparison runs (eval_compare) and eval with drafters, on tiny models."""

import dataclasses
import json
import os

import numpy as np
import pytest

import spec_decode as sd
from spec_decode.eval import cli
from spec_decode.eval import compare
from spec_decode.eval import run as eval_lib
from spec_decode.eval.load import drafters

SETTINGS = eval_lib.EvalSettings(
  task='synthetic_tiny',
  num_examples=4,
  batch_size=2,
  max_decode_len=12,
  max_input_len=32,
  timing_repeats=1,
  timing_rounds=1,
  gamma=3,
)
RUN = dict(settings=SETTINGS, progress=False)


@pytest.fixture(scope='module')
def models():
  vocab = eval_lib.task_vocabulary('synthetic_tiny', vocab_size=64)
  tiny = 'models/t5_1_1/tiny.gin'
  target = eval_lib.load_model(model_gin=tiny, seed=0, vocabulary=vocab)
  draft = eval_lib.load_model(model_gin=tiny, seed=1, vocabulary=vocab)
  return target, draft, vocab


def test_compare_runs_every_combination_and_labels_them(models, tmp_path):
  target, draft, vocab = models
  bigram = drafters.ngram_draft('synthetic_tiny', vocab, n=2)
  copy = drafters.copy_draft(vocab)
  out = str(tmp_path / 'cmp')
  rows = compare.compare(
    drafts={'draft': draft, 'bigram': bigram, 'copy': copy},
    output_dir=out,
    target=target,
    temperatures=(0.0, 1.0),
    print_summary=False,
    **RUN,
  )
  assert [(r['drafter'], r['temperature']) for r in rows] == [
    (name, t) for name in ('draft', 'bigram', 'copy') for t in (0.0, 1.0)
  ]
  for r in rows:
    assert 0.0 <= r['alpha'] <= 1.0 and r['gamma'] == 3
    assert r['exact_algorithm']
    if r['temperature'] == 0.0:
      assert r['exact_match_fraction'] == 1.0
  # Prompt lookup proposes nothing where nothing matches.
  copy_rows = [r for r in rows if r['drafter'] == 'copy']
  assert all(r['mean_proposed'] <= 3 for r in copy_rows)
  assert all(r['c'] > 0 for r in rows)  # Measured, not assumed.
  # Outputs without EOS counted, the speedup on the rest beside them.
  for r in rows:
    # (Sampled, a plain output that ends can have a speculative one that
    # runs out: the example then counts as running out.)
    assert 0 <= r['examples_ending'] <= 4 - r['no_eos']
    assert (r['speedup_ends'] is None) == (r['examples_ending'] == 0)
  with open(os.path.join(out, compare.COMPARISON_JSON)) as f:
    assert json.load(f) == json.loads(json.dumps(rows))
  with open(os.path.join(out, compare.COMPARISON_MD)) as f:
    table = f.read()
  assert '| bigram | 0 | 1 | - | 3 |' in table
  assert '| no EOS (plain) | speedup on outputs that end (x) |' in table
  assert '100% identical' in table and 'exact (Algorithm 1)' in table


def test_compare_lenience_and_dynamic_gamma_rows(models, tmp_path):
  target, draft, _ = models
  rows = compare.compare(
    drafts={'draft': draft},
    output_dir=str(tmp_path / 'len'),
    target=target,
    leniences=(1.0, 0.3),
    dynamic_gammas=(0.0, 0.6),
    print_summary=False,
    **RUN,
  )
  assert len(rows) == 4
  lenient = [r for r in rows if r['lenience'] == 0.3]
  assert all(not r['exact_algorithm'] for r in lenient)
  assert 'NOT exact' in compare.table(lenient)
  exact_dyn = [r for r in rows if r['lenience'] == 1.0 and r['dynamic_gamma']]
  assert exact_dyn[0]['exact_match_fraction'] == 1.0
  assert exact_dyn[0]['mean_proposed'] < 3.0
  fixed = [r for r in rows if r['lenience'] == 1.0 and not r['dynamic_gamma']]
  assert fixed[0]['mean_proposed'] == 3.0


def test_compare_needs_drafts(tmp_path):
  with pytest.raises(ValueError, match='draft'):
    compare.compare(drafts={}, settings=SETTINGS, output_dir=str(tmp_path))


def test_compare_checks_every_combination_before_the_first_run(tmp_path):
  calls = []
  out = str(tmp_path / 'bad')
  with pytest.raises(ValueError, match=r'EvalSettings\.temperature'):
    compare.compare(
      drafts={'a': None, 'b': None},
      settings=SETTINGS,
      output_dir=out,
      run=lambda **kw: calls.append(kw),
      temperatures=(0.0, -1.0),
    )
  with pytest.raises(ValueError, match=r'EvalSettings\.gamma'):
    compare.compare(
      drafts={'a': None, 'b': None},
      settings=SETTINGS,
      output_dir=out,
      run=lambda **kw: calls.append(kw),
      gammas={'b': 0},
    )
  assert calls == [] and not os.path.exists(out)


def test_compare_passes_each_run_its_settings(tmp_path):
  calls = []

  def run(**kw):
    calls.append(kw)
    return {
      'temperature': kw['settings'].temperature,
      'lenience': kw['settings'].lenience,
      'exact_algorithm': kw['settings'].exact_algorithm,
      'sweep': [],
      'quality': {'bleu': {'plain': 1.0, 'speculative': 1.0}},
      **{k: 0.5 for k in (
        'gamma', 'alpha', 'c', 'tokens_per_call', 'speedup_measured',
        'speedup_predicted', 'exact_match_fraction',
      )},
    }  # fmt: skip

  compare.compare(
    drafts={'a': 'draft a', 'b': 'draft b'},
    settings=SETTINGS,
    output_dir=str(tmp_path),
    run=run,
    leniences=(1.0, 0.5),
    gammas={'b': [2, 4]},
    print_summary=False,
    target='the target',
  )
  assert [(c['draft'], c['settings'].lenience) for c in calls] == [
    ('draft a', 1.0), ('draft a', 0.5), ('draft b', 1.0), ('draft b', 0.5),
  ]  # fmt: skip
  assert [c['settings'].gamma for c in calls] == [(3,), (3,), (2, 4), (2, 4)]
  assert [c['settings'].draft_name for c in calls] == ['a', 'a', 'b', 'b']
  for c in calls:
    assert c['target'] == 'the target' and c['print_summary'] is False
    assert c['settings'] == dataclasses.replace(
      SETTINGS,
      lenience=c['settings'].lenience,
      gamma=c['settings'].gamma,
      draft_name=c['settings'].draft_name,
    )
  assert calls[1]['output_dir'] == os.path.join(str(tmp_path), 'a-t0-l0.5-dyn0')


def test_compare_tabulates_a_run_without_quality_metrics(tmp_path):
  # A seqio task may define no metric functions (T5X infer tasks often do
  # not): its row says so instead of failing.
  def run(**kw):
    return {
      'temperature': 0.0, 'lenience': 1.0, 'exact_algorithm': True,
      'sweep': [], 'quality': {},
      **{k: 0.5 for k in (
        'gamma', 'alpha', 'c', 'tokens_per_call', 'speedup_measured',
        'speedup_predicted', 'exact_match_fraction',
      )},
    }  # fmt: skip

  rows = compare.compare(
    drafts={'a': 'draft a'},
    settings=SETTINGS,
    output_dir=str(tmp_path),
    run=run,
    print_summary=False,
  )
  assert rows[0]['metric'] == '-' and np.isnan(rows[0]['quality_plain'])
  assert '| - nan → nan |' in compare.table(rows)


def test_cli_checks_the_comparison_settings_before_loading_drafts(
  tmp_path, capsys
):
  code = cli.main([
    '--gin_file=smoke_compare', '--gin.DRAFT_CHECKPOINT=/nonexistent/d',
    '--gin.TARGET_CHECKPOINT=/nonexistent/t', '--gin.BATCH_SIZE=0',
    f'--output_dir={tmp_path}',
  ])  # fmt: skip
  assert code == 1
  err = capsys.readouterr().err
  assert 'EvalSettings.batch_size must be' in err
  assert 'checkpoint not found' not in err


# The comparison itself (every drafter x temperature, labels, files) is
# `test_compare_runs_every_combination_and_labels_them`'s, and the CLI's
# checks of the smoke config are tested above; this end-to-end CLI run of
# the same six decodes is `make test-slow`'s.
@pytest.mark.slow
def test_cli_runs_the_smoke_comparison(models, tmp_path, capsys):
  del models  # Shares the compiled loops.
  out = str(tmp_path / 'cli')
  code = cli.main([
    '--gin_file=smoke_compare', '--gin.NUM_EXAMPLES=2',
    f'--output_dir={out}', '--no_progress',
  ])  # fmt: skip
  assert code == 0
  with open(os.path.join(out, compare.COMPARISON_JSON)) as f:
    rows = json.load(f)
  assert [r['drafter'] for r in rows] == [
    'random tiny draft', 'random tiny draft', 'bigram', 'bigram', 'copy',
    'copy',
  ]  # fmt: skip
  assert [r['gamma'] for r in rows] == [3, 3, 2, 2, 3, 3]
  assert 'Smoke comparison' in capsys.readouterr().out


def test_resolve_vocabulary_from_a_checkpoint_dir(models, tmp_path):
  target, _, vocab = models
  path = str(tmp_path / 'ckpt')
  target.save(path)
  assert drafters.resolve_vocabulary(path) == vocab
  assert drafters.resolve_vocabulary(vocab) is vocab
  with pytest.raises(ValueError, match='vocabulary'):
    drafters.resolve_vocabulary(None)


def test_ngram_draft_fits_the_task_targets(models):
  target, _, vocab = models
  seqs = drafters.target_sequences('synthetic_tiny', vocab, 'train')
  assert all(s[-1] == sd.EOS_ID for s in seqs)
  uni = drafters.ngram_draft('synthetic_tiny', vocab, n=1)
  enc = np.asarray([vocab.encode('a test input') + [sd.EOS_ID]], np.int32)
  plain = sd.generate(target, enc, max_decode_len=10)
  out = sd.generate(target, enc, draft=uni, gamma=2, max_decode_len=10)
  np.testing.assert_array_equal(out.tokens, plain.tokens)

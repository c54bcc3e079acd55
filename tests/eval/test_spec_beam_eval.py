"""Speculative beam search in eval runs: `decode_method='beam'` with a draft
decodes every batch with plain and with speculative beam search and reports
them in the usual columns (exact: every beam and score equal)."""

import dataclasses
import json
import os

import numpy as np
import pytest

import spec_decode as sd
from spec_decode.beam import costs as beam_costs
from spec_decode.eval import decoding
from spec_decode.eval import run as eval_lib

SETTINGS = eval_lib.EvalSettings(
  task='synthetic_tiny',
  num_examples=2,
  batch_size=2,
  max_decode_len=8,
  max_input_len=32,
  timing_repeats=1,
  timing_rounds=1,
  decode_method='beam',
  num_beams=2,
  gamma=2,
  # Full draft trees (W = c^(gamma - 1), c = K): with the target as draft
  # every depth is covered.
  draft_beams=2,
  draft_children=2,
)
RUN = dict(progress=False, print_summary=False)


@pytest.fixture(scope='module')
def target():
  vocab = eval_lib.task_vocabulary('synthetic_tiny', vocab_size=64)
  return eval_lib.load_model(
    model_gin='models/t5_1_1/tiny.gin', seed=0, vocabulary=vocab
  )


def test_eval_run_with_the_target_as_draft(target, tmp_path):
  r = eval_lib.evaluate(target, target, SETTINGS, output_dir=str(tmp_path),
                        **RUN)  # fmt: skip
  assert r['decode_method'] == 'beam' and r['num_beams'] == 2
  assert r['exact_match_fraction'] == 1.0
  # The target's own beams: every draft depth is covered.
  assert r['alpha'] == pytest.approx(1.0)
  with open(os.path.join(str(tmp_path), eval_lib.EXAMPLES_FILE)) as f:
    records = [json.loads(line) for line in f]
  assert len(records) == 2
  for rec in records:
    spec = rec['speculative']['2']
    assert spec['exact'] and spec['tokens'] == rec['plain_tokens']
    assert spec['position_tries'] == spec['position_accepts']


def test_exactness_compares_every_beam_and_score(target):
  enc = np.full((2, 5), 7, np.int32)
  decode = decoding.Decoder(target, target, SETTINGS)
  plain, _ = decode(enc, np.arange(2), timed=False)
  spec, _ = decode(enc, np.arange(2), 2, timed=False)
  assert decoding.same_output(plain, spec, 0)
  stats = spec.stats
  np.testing.assert_array_equal(stats.row_iterations, spec.beams.calls)
  # Negative controls: a second beam or a score that differs is not exact,
  # though the best beam is the same.
  other = dataclasses.replace(spec.beams, tokens=spec.beams.tokens.copy())
  other.tokens[0, 1, 0] += 1
  assert not decoding.same_output(
    plain, dataclasses.replace(spec, beams=other), 0
  )
  scores = spec.beams.scores.copy()
  scores[0, 1] -= 1e-3
  other = dataclasses.replace(spec.beams, scores=scores)
  assert not decoding.same_output(
    plain, dataclasses.replace(spec, beams=other), 0
  )
  assert isinstance(spec.beams, sd.BeamSearchOutput)


def test_eval_run_with_gamma_auto(target, tmp_path, monkeypatch):
  """GAMMA='auto' with beams: each iteration a plain step or a call with
  trees of depth MAX_AUTO_GAMMA; exact; the records, results and report
  count both kinds, and the costs come from the cost cache the second time."""
  monkeypatch.setenv('SPEC_DECODE_CACHE_DIR', str(tmp_path / 'costs'))
  # Costs where a call pays (the tiny model's measured ones say it never
  # does): the records must count both kinds.
  measured = []

  def measure(*args, **kwargs):
    measured.append(1)
    return [1.0, 1.5]

  monkeypatch.setattr(beam_costs, 'measure', measure)
  settings = dataclasses.replace(SETTINGS, gamma='auto', max_auto_gamma=2)
  runs = []
  for name in ('first', 'second'):
    out = str(tmp_path / name)
    runs.append(eval_lib.evaluate(target, target, settings, output_dir=out,
                                  **RUN))  # fmt: skip
  r = runs[0]
  assert r['gamma'] == 'auto' and r['exact_match_fraction'] == 1.0
  with open(os.path.join(str(tmp_path / 'first'), eval_lib.EXAMPLES_FILE)) as f:
    records = [json.loads(line) for line in f]
  for rec in records:
    spec = rec['speculative'][decoding.AUTO]
    kinds = spec['gamma_iterations']
    assert len(kinds) == 3 and kinds[1] == 0
    assert sum(kinds) == spec['iterations']
    # The depth counts and proposed nodes are the speculative calls'.
    assert kinds[2] > 0 and sum(spec['accepted_histogram']) == kinds[2]
    assert spec['proposed'] % kinds[2] == 0
    # The target as draft: every checked depth is covered.
    assert spec['position_tries'] == spec['position_accepts']
    assert spec['exact']
  assert sum(r['gamma_iterations']) == r['target_calls']
  models = [x['gamma_policy']['cost_models'] for x in runs]
  assert [m[0]['measured'] for m in models] == [True, False]
  assert len(measured) == 1
  assert set(models[0][0]['iteration_seconds']) == {'0', '2'}
  summary = open(os.path.join(str(tmp_path / 'first'), 'summary.md')).read()
  assert 'plain steps' in summary and 'speculative calls' in summary
  assert 'Cost model' in summary

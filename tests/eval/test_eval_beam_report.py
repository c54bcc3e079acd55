"""The eval report of beam-search runs says what its numbers are: plain beam
search's target calls are its steps, speculative beam search's its calls,
steps per call stands next to alpha, exact means equal beams and scores.
Greedy and sampled runs keep their report (`test_eval.py`)."""

import numpy as np
import pytest

import spec_decode as sd
from spec_decode.eval import decoding
from spec_decode.eval import report
from spec_decode.eval import run as eval_lib

COSTS = {
  'c': 0.1,
  'v_of_k': {3: 1.2},
  'target_step_seconds': 0.01,
  'draft_step_seconds': 0.001,
}


def _score(texts, tokens):
  del tokens
  return {'bleu': float(len(texts))}, []


def _record(index, plain_len, plain_steps, spec_steps, calls, hist):
  rec = {
    'index': index,
    'plain': 'x',
    'plain_tokens': list(range(2, 2 + plain_len)),
    'plain_seconds': 1.0,
    'speculative': {
      '2': {
        'text': 'x',
        'tokens': list(range(2, 2 + plain_len)),
        'exact': True,
        'seconds': 0.5,
        'iterations': calls,
        'accepted_histogram': hist,
        'position_tries': [calls, calls - hist[0]],
        'position_accepts': [calls - hist[0], hist[2]],
        'tested': 2 * calls - hist[0],
        'beta_sum': float(calls - hist[0] + hist[2]),
        'alpha': 0.5,
        'proposed': 8 * calls,
      }
    },
  }
  if plain_steps is not None:  # A beam-search run's records.
    rec['plain_steps'] = plain_steps
    rec['speculative']['2']['steps'] = spec_steps
  return rec


def _records(beam):
  # Two rows of one batch (batch size 2): the best beams have 3 and 5
  # tokens, but beam search took 9 and 12 steps (other beams ran longer).
  return [
    _record(0, 3, 9 if beam else None, 9, 4, [1, 1, 2]),
    _record(1, 5, 12 if beam else None, 12, 5, [1, 2, 2]),
  ]


def _settings(beam):
  r = {
    'task': 't',
    'split': 'test',
    'batch_size': 2,
    'temperature': 0.0,
    'top_k': 0,
    'top_p': 1.0,
    'max_decode_len': 16,
    'exact_algorithm': True,
    'lenience': 1.0,
    'target': 'T',
    'draft': 'D',
    'decode_method': 'beam' if beam else 'greedy',
  }
  if beam:
    r.update(num_beams=4, beam_alpha=0.6)
  return r


def test_beam_report_counts_steps_not_tokens():
  r = report.results(_records(True), [2], _score, 2, COSTS, 'bleu', 16)
  r.update(_settings(True))
  # Plain beam search: one call per step, the batch's longest row.
  assert r['plain_target_calls'] == 12
  assert r['plain_steps'] == 21
  # Speculative: 21 steps in 4 + 5 calls; the batch ran 5 calls.
  assert r['steps'] == 21 and r['target_calls'] == 5
  assert r['steps_per_call'] == pytest.approx(21 / 9)
  text = report.summary_markdown(r)
  assert '| steps/call | α (depths covered) |' in text
  assert '| t | D | 4 | 2 | 2.33 |' in text
  assert '| 5 (12) |' in text  # target calls (plain beam: steps)
  assert '| 21 (21) |' in text  # steps, speculative (plain)
  assert 'exact (beams and scores)' in text
  assert 'brevity penalty alpha 0.6' in text
  assert 'Draft depths covered per speculative call' in text
  # The chain model's predictions and tokens per call are not shown.
  assert 'Thm 3.8' not in text and 'tokens/target call' not in text


def test_greedy_report_is_unchanged():
  """Negative control: records without steps report as before."""
  r = report.results(_records(False), [2], _score, 2, COSTS, 'bleu', 16)
  r.update(_settings(False))
  assert r['plain_target_calls'] == 5  # the longest row's tokens
  assert 'steps_per_call' not in r and 'plain_steps' not in r
  text = report.summary_markdown(r)
  assert 'Exp Thm 3.8 (v = 1)' in text and 'tokens/target call' in text
  assert 'steps/call' not in text


@pytest.fixture(scope='module')
def target():
  vocab = eval_lib.task_vocabulary('synthetic_tiny', vocab_size=64)
  return eval_lib.load_model(
    model_gin='models/t5_1_1/tiny.gin', seed=0, vocabulary=vocab
  )


def test_records_of_a_beam_decode_carry_its_steps(target):
  settings = eval_lib.EvalSettings(
    task='synthetic_tiny',
    batch_size=2,
    max_decode_len=8,
    decode_method='beam',
    num_beams=2,
    gamma=2,
  )
  enc = np.full((2, 5), 7, np.int32)
  enc[1, 3:] = 0
  decode = decoding.Decoder(target, target, settings)
  plain, _ = decode(enc, np.arange(2), timed=False)
  spec, _ = decode(enc, np.arange(2), 2, timed=False)
  ref = sd.beam_search(target, enc, num_beams=2, alpha=0.6, max_decode_len=8)
  for r in range(2):
    assert decoding.plain_row_record(plain, r) == {
      'plain_steps': int(ref.steps[r])
    }
    rec = decoding.row_spec_record(spec.stats, r)
    assert rec['steps'] == ref.steps[r]
    assert rec['iterations'] == spec.beams.calls[r]
  # The target as its own draft: a call commits several steps.
  assert spec.beams.steps_per_call > 1.0
  # Negative control: a greedy decode's records carry no steps.
  greedy_settings = eval_lib.EvalSettings(
    task='synthetic_tiny', batch_size=2, max_decode_len=8, gamma=2
  )
  greedy = decoding.Decoder(target, target, greedy_settings)
  out, _ = greedy(enc, np.arange(2), timed=False)
  assert decoding.plain_row_record(out, 0) == {}

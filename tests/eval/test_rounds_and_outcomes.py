"""The eval's rotating timing rounds, its outputs-that-end split and its
prediction from costs timed apart (`eval/rounds.py`, `eval/report/outcomes.py`,
`report/figures.py`), on hand-made records: exact figures, no clocks."""

import copy

import pytest

from spec_decode import theory
from spec_decode.core.ids import EOS_ID
from spec_decode.eval import report
from spec_decode.eval import rounds
from spec_decode.eval.report import outcomes

EOS = EOS_ID
MAX_LEN = 8


def _score(texts, tokens):
  del tokens
  return {'n': float(len(texts))}, []


def _record(index, tokens, iterations, plain_rounds, spec_rounds, probe):
  """One example at batch 1: greedy, exact, `iterations` target calls."""
  accepted = len(tokens) - iterations  # Each call: 1 + its accepted.
  return {
    'index': index,
    'plain': 'x',
    'plain_tokens': tokens,
    'plain_seconds': sorted(plain_rounds)[len(plain_rounds) // 2],
    'plain_seconds_rounds': plain_rounds,
    'draft_alone_tokens': len(tokens),
    'draft_alone_seconds': 0.1 * len(tokens),
    'probe': probe,
    'speculative': {
      '2': {
        'text': 'x',
        'tokens': tokens,
        'exact': True,
        'seconds': sorted(spec_rounds)[len(spec_rounds) // 2],
        'seconds_rounds': spec_rounds,
        'iterations': iterations,
        'accepted_histogram': [0, iterations - accepted, accepted],
        'position_tries': [iterations, iterations],
        'position_accepts': [iterations - 0, accepted],
        'tested': 2 * iterations,
        'beta_sum': float(accepted),
        'alpha': 0.5,
        'proposed': 2 * iterations,
      }
    },
  }


def _probe(target=1e-3, draft=1e-4, call3=1.5e-3, position=3):
  return {
    'position': position,
    'target_step': [target] * 3,
    'target_calls': {'3': [call3] * 3},
    'draft_step': [draft] * 3,
  }


def _records():
  ends = [5, 6, 7, EOS]  # 4 tokens in 2 calls.
  loops = [9] * MAX_LEN  # No EOS: ran out, 8 tokens in 3 calls.
  return [
    _record(0, ends, 2, [4.0, 4.4, 4.0], [4.0, 4.0, 4.0], _probe()),
    _record(1, loops, 3, [8.0, 8.0, 8.8], [2.0, 2.0, 2.0], _probe()),
  ]


def _results(records):
  return report.results(records, [2], _score, 1, None, 'n', MAX_LEN)


def test_rounds_rotate_the_order_and_keep_the_first_output():
  order = []

  def run(name):
    def call():
      order.append(name)
      return f'{name}{len(order)}', float(len(order))

    return call

  runs = {n: run(n) for n in 'abc'}
  outputs, seconds = rounds.run_rounds(runs, 4)
  assert order == list('abcbcacababc')
  assert outputs == {'a': 'a1', 'b': 'b2', 'c': 'c3'}
  assert seconds['a'] == [1.0, 6.0, 8.0, 10.0]


def test_speedup_is_the_median_of_the_rounds_ratios():
  r = _results(_records())
  ratios = [(4.0 + 8.0) / 6.0, (4.4 + 8.0) / 6.0, (4.0 + 8.8) / 6.0]
  assert r['speedup_rounds'] == pytest.approx(ratios)
  assert r['speedup_measured'] == pytest.approx(sorted(ratios)[1])
  assert r['speedup_spread'] == pytest.approx([min(ratios), max(ratios)])


def test_outputs_that_run_out_are_counted_and_reported_apart():
  assert outcomes.ran_out([9] * MAX_LEN, MAX_LEN)
  assert not outcomes.ran_out([9] * (MAX_LEN - 1) + [EOS], MAX_LEN)
  assert not outcomes.ran_out([9, EOS], MAX_LEN)
  e = _results(_records())['by_ending']
  assert e['no_eos'] == {
    'max_decode_len': MAX_LEN,
    'plain': 1,
    'plain_token_share': pytest.approx(8 / 12),
    'speculative': 1,
    'speculative_token_share': pytest.approx(8 / 12),
  }
  ends, out = e['ends'], e['runs_out']
  assert (ends['examples'], out['examples']) == (1, 1)
  assert ends['tokens_per_call'] == 2.0 and out['tokens_per_call'] == 8 / 3
  assert ends['speedup_measured'] == pytest.approx(1.0)  # 4.0 / 4.0
  assert out['speedup_measured'] == pytest.approx(4.0)  # 8.0 / 2.0
  assert ends['alpha'] == pytest.approx(2 / 4)
  assert out['alpha'] == pytest.approx(5 / 6)
  # Each group's prediction: its own α with the run's c and v.
  r = _results(_records())
  for group in ('ends', 'runs_out'):
    g = r['by_ending'][group]
    expected = theory.expected_tokens(g['alpha'], 2)
    assert g['speedup_predicted'] == pytest.approx(expected / r['apart_cost'])


def test_a_speculative_output_that_runs_out_puts_its_example_there():
  records = _records()
  records[0]['speculative']['2']['tokens'] = [5] * MAX_LEN  # Sampled.
  groups = outcomes.split(records, '2', MAX_LEN)
  assert [len(groups['ends']), len(groups['runs_out'])] == [0, 2]
  counts = outcomes.counts(records, '2', MAX_LEN)
  assert (counts['plain'], counts['speculative']) == (1, 2)


def test_the_prediction_moves_with_the_costs_and_not_with_the_measurement():
  records = _records()
  r = _results(records)
  # c and v from the probes: draft 0.1 ms / target 1 ms, call on 3 tokens
  # 1.5 ms / 1 ms.
  assert r['c'] == pytest.approx(0.1) and r['v'] == pytest.approx(1.5)
  expected = r['expected_tokens_per_call']
  assert r['speedup_predicted'] == pytest.approx(expected / (2 * 0.1 + 1.5))
  assert r['speedup_predicted_theorem38'] == pytest.approx(
    expected / (2 * 0.1 + 1)
  )
  # Perturbed costs (a draft step 4x slower, a 3-token call 2x slower):
  # the prediction moves, the measurement does not.
  slow = copy.deepcopy(records)
  for rec in slow:
    rec['probe'] = _probe(draft=4e-4, call3=3e-3)
  s = _results(slow)
  assert s['c'] == pytest.approx(0.4) and s['v'] == pytest.approx(3.0)
  assert s['speedup_predicted'] == pytest.approx(expected / (2 * 0.4 + 3.0))
  assert s['speedup_measured'] == r['speedup_measured']
  assert s['speedup_rounds'] == r['speedup_rounds']
  # Negative control: slower speculative decodes move the measurement and
  # leave the prediction where it was (the former prediction, solved from
  # the run's own seconds per call, moved with it).
  slower = copy.deepcopy(records)
  for rec in slower:
    spec = rec['speculative']['2']
    spec['seconds_rounds'] = [2 * x for x in spec['seconds_rounds']]
    spec['seconds'] *= 2
  m = _results(slower)
  assert m['speedup_measured'] == pytest.approx(r['speedup_measured'] / 2)
  assert m['speedup_predicted'] == r['speedup_predicted']
  assert m['iteration_cost'] == pytest.approx(2 * r['iteration_cost'])
  assert m['cost_gap'] == pytest.approx(m['iteration_cost'] - m['apart_cost'])


def test_probe_costs_weight_batches_by_their_target_calls():
  records = _records()
  records[1]['probe'] = _probe(target=2e-3, draft=2e-4, call3=4e-3)
  r = _results(records)
  # Weights: 4 and 8 plain target calls.
  t, d, k3 = 4 * 1e-3 + 8 * 2e-3, 4 * 1e-4 + 8 * 2e-4, 4 * 1.5e-3 + 8 * 4e-3
  assert r['c'] == pytest.approx(d / t)
  assert r['v'] == pytest.approx(k3 / t)
  assert r['costs_apart']['mean_position'] == pytest.approx(3.0)


def test_summary_leads_with_outputs_without_eos_and_the_rounds():
  r = _results(_records())
  r.update(
    task='t', split='s', target='T', draft='D', batch_size=1,
    temperature=0.0, top_k=0, top_p=1.0, max_decode_len=MAX_LEN,
    exact_algorithm=True, lenience=1.0, decode_method='greedy',
  )  # fmt: skip
  text = report.summary_markdown(r)
  assert 'Outputs without EOS (reached max_decode_len 8): plain 1 of 2' in text
  assert 'Outputs that end (1): **1.00x**' in text
  assert 'Outputs that run out (1): **4.00x**' in text
  assert '3 rounds in rotating order' in text
  assert 'γc+v the run implies' in text and 'Costs timed apart' in text

"""results.json's numbers from an eval run's records (`spec_decode.eval.run`).

`results` turns the per-example records of examples.jsonl and their timings
into results.json; `TIMING_KEYS` mark the figures that come from clocks
(`strip_timings` removes them).

Beam-search runs (`decode_method='beam'`) report in beam search's terms:
plain beam search's target calls are its steps (records' `plain_steps`),
speculative beam search's are its calls (`iterations`), steps per call
(`steps`/`iterations`) stands where tokens per call stands for a chain,
alpha is the fraction of draft depths that covered every new live beam,
and exact means equal beams, lengths and scores. The chain model's
predictions (Theorem 3.8, E[tokens] / (γc + v)) stay in results.json but
are not shown for them: c and v are a chain's costs.

The measured speedup is the median over timing rounds of the run's plain
over speculative seconds (`speedup.speedups`), with its spread. c and v come
from cost probes timed apart from the loops, beside them in the same rounds
(`_probe_costs`, `rounds.Probes`), so the predictions can be wrong; the
cost per call the run itself implies (`iteration_cost`: the speculative
loop's seconds per target call over the plain loop's step) is reported
beside them, with the difference (`cost_gap`). Outputs that reach
max_decode_len without EOS are counted, and every figure is given apart for
the outputs that end and those that run out (`by_ending`,
`eval/report/outcomes.py`).

Auto-γ runs (`gamma='auto'`, records keyed `'auto'`): γ varies per
iteration, so the predictions are those of the schedule the policy ran,
over the rows' iterations: E[tokens] is the mean of E(α, γ) (E(α, 0) = 1),
γ the mean γ and v the mean of v(γ + 1) timed apart over the same
iterations (`mean_v`; a γ-0 iteration is a plain step, v(1) = 1), in the
fixed-γ formulas. The report adds the batches'
iterations at each γ and the policy's cost models. The acceptance counts
follow the schedule, which follows the measured costs: two runs agree
when their cost model does (the disk cache makes that the default).
"""

import math
from typing import Any

import numpy as np

from spec_decode import theory
from spec_decode.eval.report import outcomes
from spec_decode.eval.report import speedup

# Keys of results.json (at any depth) whose values come from clocks: they
# differ between runs, everything else is a function of the decoded tokens.
TIMING_KEYS = frozenset(
  {
    'c',
    'v',
    'c_loops',
    'v_of_k',
    'apart_cost',
    'cost_gap',
    'costs_apart',
    'speedup_rounds',
    'speedup_spread',
    'plain_seconds_rounds',
    'seconds_rounds',
    'draft_alone_seconds',
    'draft_alone_seconds_rounds',
    'probe',
    'target_step_seconds',
    'draft_step_seconds',
    'walltime',
    'speedup_measured',
    'speedup_predicted',
    'speedup_predicted_theorem38',
    'speedup_predicted_from_tokens',
    'plain_seconds',
    'seconds',
    'tokens_per_second',
    'plain_tokens_per_second',
    'cost_models',
    'mean_v',
    'iteration_cost',
  }
)

# ----------------------------------------------------------------- results.


def _batch_groups(records, batch_size):
  groups: dict[int, list[dict[str, Any]]] = {}
  for rec in records:
    groups.setdefault(rec['index'] // batch_size, []).append(rec)
  return list(groups.values())


def _schedule(records, key, batch_size, alpha):
  """An auto-γ decode's γ schedule and the means the predictions use.

  Returns:
    `{'gamma_shares'` (`[G + 1]` the share of the rows' iterations at
    each γ), `'max_gamma', 'gamma_iterations'` (`[G + 1]` the batches'
    iterations at each γ: each batch's longest row saw all of them),
    `'mean_gamma'`, `'mean_expected_tokens'` (over the rows' iterations)}.
  """
  rows = np.array(
    [rec['speculative'][key]['gamma_iterations'] for rec in records],
    np.float64,
  )  # [N, G + 1]
  gammas = np.arange(rows.shape[1])
  per_gamma = rows.sum(0)
  n = max(per_gamma.sum(), 1.0)
  batches = np.zeros(rows.shape[1], np.int64)
  for group in _batch_groups(records, batch_size):
    longest = max(group, key=lambda rec: rec['speculative'][key]['iterations'])
    batches += np.asarray(longest['speculative'][key]['gamma_iterations'])
  expected = [float(theory.expected_tokens(alpha, int(g))) for g in gammas]
  return {
    'gamma_shares': (per_gamma / n).tolist(),
    'max_gamma': int(gammas[-1]),
    'gamma_iterations': batches.tolist(),
    'mean_gamma': float(per_gamma @ gammas / n),
    'mean_expected_tokens': float(per_gamma @ expected / n),
  }


def _step_costs(records, batch_size, plain, costs):
  """The loops' step times, and the costs the predictions use.

  The target step T is the plain decodes' seconds per loop iteration; the
  draft's loop step is the draft decoding alone's (records'
  `draft_alone_*`), and `c_loops` their ratio (None without such decodes).
  `apart` holds c and v(k) timed apart from the loops: from the records'
  probes (`_probe_costs`), else `costs` (`policy.timing.measure`, after the
  decodes: beam search, records of an older run).
  """
  t = plain['seconds'] / max(plain['target_calls'], 1)
  c_loops = None
  if all('draft_alone_seconds' in rec for rec in records):
    calls = sum(
      max(rec['draft_alone_tokens'] for rec in group)
      for group in _batch_groups(records, batch_size)
    )
    d = sum(rec['draft_alone_seconds'] for rec in records) / max(calls, 1)
    c_loops = d / max(t, 1e-12)
  apart = _probe_costs(records, batch_size)
  if apart is None and costs is not None:
    apart = {
      **_apart(costs),
      'source': 'policy.timing.measure after the decodes (batch, prefix 16)',
    }
  return {'target_step_seconds': t, 'c_loops': c_loops, 'apart': apart}


def _probe_costs(records, batch_size):
  """c and v(k) from the records' probes (`rounds.Probes`); None when a
  record has none.

  Per round, each batch's probe times are weighted by the batch's plain
  target calls (its longest plain output: where the decode spends its
  calls), summed, and divided (c = draft step / target step, v(k) = call
  on k tokens / target step); the figures are the medians over rounds.
  """
  if not records or not all('probe' in rec for rec in records):
    return None
  groups = _batch_groups(records, batch_size)
  probes = [group[0]['probe'] for group in groups]
  weights = [max(len(rec['plain_tokens']) for rec in g) for g in groups]
  n = min(len(p['target_step']) for p in probes)
  ks = sorted(
    set.intersection(*(set(p['target_calls']) for p in probes)), key=int
  )

  def total(get, r):
    return sum(w * get(p)[r] for w, p in zip(weights, probes, strict=True))

  t = [total(lambda p: p['target_step'], r) for r in range(n)]
  d = [total(lambda p: p['draft_step'], r) for r in range(n)]
  v = {
    k: [total(lambda p, k=k: p['target_calls'][k], r) / t[r] for r in range(n)]
    for k in ks
  }
  w = max(sum(weights), 1)
  return {
    'c': float(np.median([d[r] / t[r] for r in range(n)])),
    'v_of_k': {'1': 1.0, **{k: float(np.median(x)) for k, x in v.items()}},
    'target_step_seconds': float(np.median(t)) / w,
    'draft_step_seconds': float(np.median(d)) / w,
    'rounds': n,
    'mean_position': float(
      np.average([p['position'] for p in probes], weights=weights)
    ),
    'source': 'probes interleaved with the decodes',
  }


def _mean_v(v_of_k, shares):
  """Σ_g shares[g] v(g + 1): an auto-γ schedule's mean target-call cost
  (γ 0 is a plain step, v(1) = 1); nan where a γ it ran lacks a v."""
  return float(
    sum(
      share * v_of_k.get(str(g + 1), math.nan)
      for g, share in enumerate(shares)
      if share
    )
  )


def _gamma_results(
  records, gamma, batch_size, score, steps, plain, max_decode_len
):
  """Acceptance, calls, quality, timings and predictions of one γ (an int,
  or `'auto'`: the schedule's means, `_schedule`).

  The measured speedup is the median over rounds of the run's plain over
  speculative seconds (`rounds.speedups`). The predictions use c and v
  timed apart (`steps['apart']`): Theorem 3.8 (v = 1), E[tokens] / (γc +
  v) and tokens per call / (γc + v). `iteration_cost` is what the run
  itself implies: its seconds per target call over the plain loop's step,
  γc + v as the loops ran them; `cost_gap` is that less γc + v timed
  apart (the loops' overhead: verify, commit, the while loop, host
  syncs).
  """
  key = str(gamma)
  specs = [rec['speculative'][key] for rec in records]
  hist = np.sum([s['accepted_histogram'] for s in specs], axis=0)
  tries = np.sum([s['position_tries'] for s in specs], axis=0)
  accepts = np.sum([s['position_accepts'] for s in specs], axis=0)
  tested = sum(s['tested'] for s in specs)
  alpha = sum(s['beta_sum'] for s in specs) / max(tested, 1)
  alpha = min(max(alpha, 0.0), 1.0)
  target_calls = sum(
    max(rec['speculative'][key]['iterations'] for rec in group)
    for group in _batch_groups(records, batch_size)
  )
  tokens = sum(len(s['tokens']) for s in specs)
  iterations = sum(s['iterations'] for s in specs)
  seconds = sum(s['seconds'] for s in specs)
  apart = steps['apart']
  c = apart['c'] if apart else math.nan
  v_of_k = apart['v_of_k'] if apart else {}
  auto = {}
  if key == 'auto':
    auto = _schedule(records, key, batch_size, alpha)
    mean_gamma = auto['mean_gamma']
    expected = auto.pop('mean_expected_tokens')
    v = _mean_v(v_of_k, auto.pop('gamma_shares'))
    auto['mean_v'] = v
    draft_calls = int(np.arange(len(hist)) @ auto['gamma_iterations'])
  else:
    mean_gamma = gamma
    expected = float(theory.expected_tokens(alpha, gamma))
    v = v_of_k.get(str(gamma + 1), math.nan)
    draft_calls = gamma * target_calls
  # A target call's seconds (its iteration's, drafting included) in plain
  # loop steps: γc + v as this run's loops ran it.
  cost = seconds / max(target_calls, 1) / steps['target_step_seconds']
  values, _ = score([s['text'] for s in specs], [s['tokens'] for s in specs])
  quality = {
    name: {'plain': plain['quality'][name], 'speculative': value}
    for name, value in values.items()
  }
  exact = sum(bool(s['exact']) for s in specs)
  tokens_per_call = tokens / max(iterations, 1)
  beam = {}
  if all('steps' in s for s in specs):  # Beam search: steps per call.
    steps_done = sum(s['steps'] for s in specs)
    beam = {
      'steps': steps_done,
      'steps_per_call': steps_done / max(iterations, 1),
    }
  apart_cost = mean_gamma * c + v
  return {
    **beam,
    **auto,
    'gamma': gamma,
    'exact_match_fraction': exact / len(specs),
    'exact_match_count': exact,
    'alpha': alpha,
    'accepted_histogram': hist.tolist(),
    'per_position_acceptance': (accepts / np.maximum(tries, 1)).tolist(),
    'target_calls': target_calls,
    'draft_calls': draft_calls,
    'mean_proposed': sum(
      s.get('proposed', gamma * s['iterations']) for s in specs
    )
    / max(iterations, 1),
    'tokens_per_call': tokens_per_call,
    'expected_tokens_per_call': expected,
    'output_tokens': tokens,
    'quality': quality,
    'c': c,
    'v': v,
    'c_loops': steps['c_loops'],
    'apart_cost': apart_cost,
    'iteration_cost': cost,
    'cost_gap': cost - apart_cost,
    'seconds': seconds,
    'tokens_per_second': tokens / max(seconds, 1e-12),
    **speedup.speedups(records, key),
    'speedup_predicted': expected / apart_cost,
    'speedup_predicted_theorem38': expected / (mean_gamma * c + 1.0),
    'speedup_predicted_from_tokens': tokens_per_call / apart_cost,
    'by_ending': _predicted_by_ending(
      outcomes.by_ending(records, key, max_decode_len), gamma, c, apart_cost
    ),
  }


def _predicted_by_ending(by_ending, gamma, c, apart_cost):
  """Each group's predictions: its own α in E[tokens] with the run's c
  and v timed apart (a fixed γ; an auto-γ schedule's mix is the run's, so
  its groups get none)."""
  for name in ('ends', 'runs_out'):
    group = by_ending[name]
    if gamma == 'auto' or not group['examples']:
      continue
    expected = float(theory.expected_tokens(group['alpha'], gamma))
    group['speedup_predicted'] = expected / apart_cost
    group['speedup_predicted_theorem38'] = expected / (gamma * c + 1.0)
  return by_ending


def results(
  records, gammas, score, batch_size, costs, metric, max_decode_len
) -> dict[str, Any]:
  """results.json from the per-example records and the measured costs.

  Args:
    records: the lines of examples.jsonl.
    gammas: the run's γ values (the first is the top level's).
    score: (output texts, output ids) -> ({quality metric: value}, notes
      on metrics not reported); `task_data.TaskData.score`.
    batch_size: rows per decode.
    costs: `decoding.measure_costs` of the pair (timed after the decodes),
      or None. The predictions' c and v are the records' probes' (timed
      apart, interleaved with the decodes: `_probe_costs`), else these.
    metric: what `score` computes, for results.json.
    max_decode_len: the run's output limit (outputs that reach it without
      EOS are counted apart: `outcomes`).
  """
  plain_quality, notes = score(
    [r['plain'] for r in records], [r['plain_tokens'] for r in records]
  )
  plain_tokens = sum(len(rec['plain_tokens']) for rec in records)
  plain_seconds = sum(rec['plain_seconds'] for rec in records)
  # A decode's target calls: a batch's longest row (one call per token);
  # beam search: its most steps (one call per step).
  beam = all('plain_steps' in rec for rec in records)
  plain = {
    'quality': plain_quality,
    'seconds': plain_seconds,
    'output_tokens': plain_tokens,
    'target_calls': sum(
      max(
        rec['plain_steps'] if beam else len(rec['plain_tokens'])
        for rec in group
      )
      for group in _batch_groups(records, batch_size)
    ),
  }
  steps = _step_costs(records, batch_size, plain, costs)
  sweep = [
    _gamma_results(records, g, batch_size, score, steps, plain, max_decode_len)
    for g in gammas
  ]
  apart = steps['apart'] or {}
  top = dict(sweep[0])
  top.update(
    num_examples=len(records),
    metric=metric,
    quality_notes=notes,
    gammas=list(gammas),
    plain_target_calls=plain['target_calls'],
    plain_output_tokens=plain_tokens,
    **(
      {'plain_steps': sum(rec['plain_steps'] for rec in records)}
      if beam
      else {}
    ),
    v_of_k=apart.get('v_of_k', {'1': 1.0}),
    target_step_seconds=steps['target_step_seconds'],
    costs_apart=steps['apart'],
    walltime={
      'plain_seconds': plain_seconds,
      'speculative_seconds': sweep[0]['seconds'],
      'plain_tokens_per_second': plain_tokens / max(plain_seconds, 1e-12),
      'speculative_tokens_per_second': sweep[0]['tokens_per_second'],
    },
    plain_seconds=plain_seconds,
    plain_tokens_per_second=plain_tokens / max(plain_seconds, 1e-12),
    sweep=sweep if len(sweep) > 1 else [],
  )
  return top


def _apart(costs: dict[str, Any]) -> dict[str, Any]:
  """`policy.timing.measure`'s figures as results.json keeps them."""
  return {
    'c': costs['c'],
    'v_of_k': {str(k): v for k, v in costs['v_of_k'].items()},
    'target_step_seconds': costs['target_step_seconds'],
    'draft_step_seconds': costs['draft_step_seconds'],
  }


def strip_timings(obj: Any) -> Any:
  """`obj` without the `TIMING_KEYS` entries, at any depth."""
  if isinstance(obj, dict):
    return {k: strip_timings(v) for k, v in obj.items() if k not in TIMING_KEYS}
  if isinstance(obj, list):
    return [strip_timings(v) for v in obj]
  return obj

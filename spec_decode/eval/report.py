"""The numbers and the report of an eval run (`spec_decode.eval.run`).

`results` turns the per-example records of examples.jsonl and their timings
into results.json; `summary_markdown` writes the Markdown report, a Table 4
style row per γ, with links to the plots (`eval/plots.py`) and the examples
page (`eval/pages.py`).

Beam-search runs (`decode_method='beam'`) report in beam search's terms:
plain beam search's target calls are its steps (records' `plain_steps`),
speculative beam search's are its calls (`iterations`), steps per call
(`steps`/`iterations`) stands where tokens per call stands for a chain,
alpha is the fraction of draft depths that covered every new live beam,
and exact means equal beams, lengths and scores. The chain model's
predictions (Theorem 3.8, E[tokens] / (γc + v)) stay in results.json but
are not shown for them: c and v are a chain's costs.

The measured speedup is the median over timing rounds of the run's plain
over speculative seconds (`rounds.speedups`), with its spread. c and v come
from cost probes timed apart from the loops, beside them in the same rounds
(`_probe_costs`, `rounds.Probes`), so the predictions can be wrong; the
cost per call the run itself implies (`iteration_cost`: the speculative
loop's seconds per target call over the plain loop's step) is reported
beside them, with the difference (`cost_gap`). Outputs that reach
max_decode_len without EOS are counted, and every figure is given apart for
the outputs that end and those that run out (`by_ending`,
`eval/outcomes.py`).

Auto-γ runs (`gamma='auto'`, records keyed `'auto'`): γ varies per
iteration, so the predictions are those of the schedule the policy ran,
over the rows' iterations: E[tokens] is the mean of E(α, γ) (E(α, 0) = 1),
γ the mean γ and v the loop's mean (`mean_v`: γ-0 iterations included),
in the fixed-γ formulas. The report adds the batches'
iterations at each γ and the policy's cost models. The acceptance counts
follow the schedule, which follows the measured costs: two runs agree
when their cost model does (the disk cache makes that the default).
"""

import math
from typing import Any

import numpy as np

from spec_decode import theory
from spec_decode.eval import outcomes
from spec_decode.eval import pages
from spec_decode.eval import rounds as rounds_lib

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
  probes (`_probe_costs`), else `costs` (`costs.measure`, after the
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
      'source': 'costs.measure after the decodes (batch, prefix 16)',
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
    **rounds_lib.speedups(records, key),
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
  """`costs.measure`'s figures as results.json keeps them."""
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


# ----------------------------------------------------------------- report.


def _f(x: float, digits: int = 2) -> str:
  return f'{x:.{digits}f}' if math.isfinite(x) else str(x)


def _mesh_line(r: dict[str, Any]) -> str:
  """Where the run decoded: mesh, processes, bytes per device."""
  mesh, mem = r['mesh'], r.get('memory') or {}
  line = (
    f'mesh data {mesh["data"]} x model {mesh["model"]}, '
    f'{r.get("num_processes", 1)} process(es)'
  )
  if mem:
    mib = {k: v / 2**20 for k, v in mem.items()}
    line += (
      f'; per device: target params {mib["target_params"]:.2f} MiB + '
      f'caches {mib["target_cache"]:.2f} MiB, draft params '
      f'{mib["draft_params"]:.2f} MiB + caches {mib["draft_cache"]:.2f} MiB '
      f'(total {mib["total"]:.2f} MiB)'
    )
  return line + '.'


def summary_markdown(r: dict[str, Any]) -> str:
  """The run's report: a Table 4 style row, quality, acceptance, timings."""
  if r.get('decode_method') == 'beam':
    return _beam_summary(r)
  label = (
    'exact (Algorithm 1)'
    if r['exact_algorithm']
    else (
      f'LENIENT l={r["lenience"]}: NOT exact, the output distribution is not '
      "the target's"
    )
  )
  lines = [
    f'# Eval: {r["task"]}/{r["split"]}, {r["num_examples"]} examples',
    '',
    f'target {r["target"]}; draft {r["draft"]}; batch {r["batch_size"]}; '
    f'temperature {r["temperature"]}; top_k {r["top_k"]}; top_p '
    f'{r["top_p"]}; max_decode_len {r["max_decode_len"]}; {label}.',
    '',
  ]
  if r.get('mesh'):
    lines += [_mesh_line(r), '']
  if r['gamma'] == 'auto':
    lines += _auto_lines(r)
  rows = r['sweep'] or [r]
  lines += _ending_lines(r) + ['']
  lines += [
    '| task | draft | temp | γ | α | c | v | Exp Thm 3.8 (v = 1) '
    '| Exp E[tok]/(γc+v) | Emp (median of rounds) | Emp spread '
    '| exact match |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for s in rows:
    lo, hi = s['speedup_spread']
    lines.append(
      f'| {r["task"]} | {r["draft"]} | {r["temperature"]:g} | {_gamma(s)} | '
      f'{_f(s["alpha"])} | {_f(s["c"], 3)} | {_f(s["v"])} | '
      f'{_f(s["speedup_predicted_theorem38"])}x | '
      f'{_f(s["speedup_predicted"])}x | {_f(s["speedup_measured"])}x | '
      f'{_f(lo)}-{_f(hi)}x | '
      f'{_f(s["exact_match_fraction"] * 100, 1)}% |'
    )
  lines += [
    '',
    '| γ | outputs | examples | α | tokens/target call | Exp E[tok]/(γc+v) '
    '| Emp (median of rounds) | Emp spread |',
    '|---|---|---|---|---|---|---|---|',
  ]
  for s in rows:
    for name, label in (('ends', 'end (EOS)'), ('runs_out', 'run out')):
      g = s['by_ending'][name]
      if not g['examples']:
        lines.append(f'| {_gamma(s)} | {label} | 0 | - | - | - | - | - |')
        continue
      lo, hi = g['speedup_spread']
      lines.append(
        f'| {_gamma(s)} | {label} | {g["examples"]} | {_f(g["alpha"])} | '
        f'{_f(g["tokens_per_call"])} | '
        f'{_opt(g.get("speedup_predicted"))}x | '
        f'{_f(g["speedup_measured"])}x | {_f(lo)}-{_f(hi)}x |'
      )
  lines += [
    '',
    '| γ | γc+v timed apart | γc+v the run implies | difference '
    "(the loops' own work) |",
    '|---|---|---|---|',
  ]
  for s in rows:
    lines.append(
      f'| {_gamma(s)} | {_f(s["apart_cost"])} | {_f(s["iteration_cost"])} '
      f'| {_f(s["cost_gap"])} |'
    )
  lines += _quality_lines(r, rows, 'plain')
  lines += [
    '',
    '| γ | tokens/target call | E[tokens] (iid α) | target calls '
    '(plain) | draft calls | plain tok/s | speculative tok/s |',
    '|---|---|---|---|---|---|---|',
  ]
  for s in rows:
    lines.append(
      f'| {_gamma(s)} | {_f(s["tokens_per_call"])} | '
      f'{_f(s["expected_tokens_per_call"])} | {s["target_calls"]} '
      f'({r["plain_target_calls"]}) | {s["draft_calls"]} | '
      f'{_f(r["plain_tokens_per_second"], 1)} | '
      f'{_f(s["tokens_per_second"], 1)} |'
    )
  lines += [
    '',
    f'Accepted draft tokens per iteration (0..'
    f'{r.get("max_gamma", r["gamma"])}), γ = {r["gamma"]}'
    f'{" (drafting iterations)" if r["gamma"] == "auto" else ""}: '
    f'{r["accepted_histogram"]}',
    'Per-position acceptance: '
    + ' '.join(_f(a) for a in r['per_position_acceptance']),
    f"Walltime (compile excluded; median of each decode's "
    f'{len(r["speedup_rounds"])} rounds): plain {_f(r["plain_seconds"])} '
    f's, speculative {_f(r["walltime"]["speculative_seconds"])} s.',
    _rounds_line(r),
    _cost_line(r),
  ]
  if r['temperature'] > 0 and r['exact_algorithm']:
    lines.append(
      'Sampling: plain and speculative outputs share seeds and follow the '
      'same distribution, but only a draft equal to the target reproduces '
      'the plain draws token for token.'
    )
  return '\n'.join(lines + pages.summary_links(r)) + '\n'


def _ending_lines(r: dict[str, Any]) -> list[str]:
  """The headline: outputs without EOS named, the speedup on the outputs
  that end and on the rest, the prediction beside them (first γ)."""
  e = r['by_ending']
  n = e['no_eos']
  lines = [
    f'Outputs without EOS (reached max_decode_len {n["max_decode_len"]}): '
    f'plain {n["plain"]} of {r["num_examples"]} '
    f'({_f(n["plain_token_share"] * 100, 0)}% of plain output tokens), '
    f'speculative {n["speculative"]} '
    f'({_f(n["speculative_token_share"] * 100, 0)}%).',
  ]
  for name, label in (('ends', 'that end'), ('runs_out', 'that run out')):
    g = e[name]
    if g['examples']:
      lo, hi = g['speedup_spread']
      predicted = (
        f', predicted {_f(g["speedup_predicted"])}x (E[tok]/(γc+v), '
        f'{_f(g["speedup_predicted_theorem38"])}x Theorem 3.8, v = 1)'
        if 'speedup_predicted' in g
        else ''
      )
      lines.append(
        f'Outputs {label} ({g["examples"]}): **{_f(g["speedup_measured"])}x** '
        f'(rounds {_f(lo)}-{_f(hi)}x){predicted}, α {_f(g["alpha"])}, '
        f'{_f(g["tokens_per_call"])} tokens per target call.'
      )
  lo, hi = r['speedup_spread']
  lines.append(
    f'All {r["num_examples"]}: {_f(r["speedup_measured"])}x (rounds '
    f'{_f(lo)}-{_f(hi)}x); predicted from c and v timed apart: '
    f'{_f(r["speedup_predicted"])}x (E[tok]/(γc+v)), '
    f'{_f(r["speedup_predicted_theorem38"])}x (Theorem 3.8, v = 1).'
  )
  return lines


def _rounds_line(r: dict[str, Any]) -> str:
  """How the decodes were timed."""
  ratios = ', '.join(_f(x) + 'x' for x in r['speedup_rounds'])
  return (
    f"Timing: each batch's decodes (plain, speculative, the draft alone) "
    f'and cost probes ran once per round, {len(r["speedup_rounds"])} '
    "rounds in rotating order; Emp is the median of the rounds' plain / "
    f'speculative seconds over the run ({ratios}).'
  )


def _cost_line(r: dict[str, Any]) -> str:
  """Where the table's c and v come from, and what the loops add."""
  a = r.get('costs_apart')
  t = r['target_step_seconds'] * 1e3
  if not a:
    return 'Costs: no c and v timed apart for this run.'
  where = (
    'a target call on 1 and on k tokens and a draft step, each timed '
    'alone (a compiled loop of '
    f"{rounds_lib.PROBE_CALLS} calls) at each batch's encoder tokens and "
    f"decode buffer, at its rows' mean decode position (here "
    f'{_f(a["mean_position"], 1)}), in the rounds beside the decodes '
    '(medians over rounds, batches weighted by their target calls)'
    if a.get('rounds')
    else a['source']
  )
  g = _f(r['mean_gamma']) if r['gamma'] == 'auto' else str(r['gamma'])
  t_apart = a['target_step_seconds'] * 1e3
  call = r['iteration_cost'] * t
  call_apart = r['apart_cost'] * t_apart
  line = (
    f'Costs timed apart: {where}: target step {_f(t_apart, 3)} ms, draft '
    f'step {_f(a["draft_step_seconds"] * 1e3, 3)} ms. The loops: a plain '
    f'step {_f(t, 3)} ms ({_f((t / t_apart - 1) * 100, 0)}% over the call '
    f'alone); a speculative iteration {_f(call, 3)} ms against '
    f'{_f(call_apart, 3)} ms for its γ = {g} draft steps and target '
    "call alone: the difference is the loops' own work (verify, commit, "
    'rollback, the while loop) and host syncs, which the prediction leaves '
    'out.'
  )
  if r.get('c_loops') is not None:
    line += (
      f' c from the loops (the draft decoding alone / the plain decode, per '
      f'step): {_f(r["c_loops"], 3)}.'
    )
  return line


def _gamma(s: dict[str, Any]) -> str:
  """The γ column: the int, or auto with the mean γ of its iterations."""
  if s['gamma'] == 'auto':
    return f'auto (mean {_f(s["mean_gamma"])})'
  return str(s['gamma'])


def _auto_lines(r: dict[str, Any]) -> list[str]:
  """What the auto-γ policy did and the cost model(s) it used."""
  g_max = r['max_gamma']
  lines = [
    f"gamma = auto: the finish-time policy chose each iteration's γ in "
    f'0..{g_max} inside the loop (no calibration decode); iterations per '
    f'γ 0..{g_max}, summed over batches: {r["gamma_iterations"]}; mean γ '
    f"{_f(r['mean_gamma'])} over the rows' iterations (the predictions "
    "are the schedule's).",
  ]
  for model in (r.get('gamma_policy') or {}).get('cost_models', []):
    ms = ', '.join(
      '-' if x is None else _f(x * 1e3, 3)
      for x in model['iteration_seconds'].values()
    )
    source = (
      'measured by this run'
      if model['measured']
      else 'read from the cost cache (measured earlier)'
    )
    lines.append(
      f'Cost model {model["key"]}: ms per loop iteration at γ 0..{g_max}: '
      f'{ms}; {source}; cache file {model["path"]}.'
    )
  return lines + ['']


def _quality_lines(
  r: dict[str, Any], rows: list[dict[str, Any]], plain: str
) -> list[str]:
  """The quality table: plain against each γ's speculative decode."""
  gamma = _beam_gamma if r.get('decode_method') == 'beam' else _gamma
  lines = [
    '',
    f'| metric | {plain} | '
    + ' | '.join(f'speculative γ={gamma(s)}' for s in rows)
    + ' |',
    '|---|---|' + '---|' * len(rows),
  ]
  for name in r['quality']:
    lines.append(
      f'| {name} | {_f(r["quality"][name]["plain"])} | '
      + ' | '.join(_f(s['quality'][name]['speculative']) for s in rows)
      + ' |'
    )
  for note in r.get('quality_notes') or []:
    lines.append(f'\nNot reported: {note}.')
  return lines


def _opt(x: Any, digits: int = 2) -> str:
  return '-' if x is None else _f(x, digits)


def _beam_summary(r: dict[str, Any]) -> str:
  """The report of a beam-search run, in beam search's terms (module doc)."""
  lines = [
    f'# Eval: {r["task"]}/{r["split"]}, {r["num_examples"]} examples',
    '',
    f'target {r["target"]}; draft {r["draft"]}; batch {r["batch_size"]}; '
    f'beam search: {r["num_beams"]} beams, brevity penalty alpha '
    f'{r["beam_alpha"]:g}; max_decode_len {r["max_decode_len"]}; '
    'speculative beam search (exact: the same beams and scores as plain '
    'beam search).',
    '',
  ]
  if r.get('mesh'):
    lines += [_mesh_line(r), '']
  if r['gamma'] == 'auto':
    lines += _beam_auto_lines(r)
  rows = r['sweep'] or [r]
  plain_calls = r['plain_target_calls']
  lines += [
    '| task | draft | beams | γ | steps/call | α (depths covered) '
    '| target calls (plain beam: steps) | Emp | exact (beams and scores) |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for s in rows:
    lines.append(
      f'| {r["task"]} | {r["draft"]} | {r["num_beams"]} | {_beam_gamma(s)} | '
      f'{_opt(s.get("steps_per_call"))} | {_f(s["alpha"])} | '
      f'{s["target_calls"]} ({plain_calls}) | '
      f'{_f(s["speedup_measured"])}x | '
      f'{_f(s["exact_match_fraction"] * 100, 1)}% |'
    )
  lines += _quality_lines(r, rows, 'plain beam')
  lines += [
    '',
    '| γ | steps/target call | E[steps/call] (iid α) | steps (plain beam) '
    '| plain tok/s | speculative tok/s |',
    '|---|---|---|---|---|---|',
  ]
  for s in rows:
    lines.append(
      f'| {_beam_gamma(s)} | {_opt(s.get("steps_per_call"))} | '
      f'{_f(s["expected_tokens_per_call"])} | {s.get("steps", "-")} '
      f'({r.get("plain_steps", "-")}) | '
      f'{_f(r["plain_tokens_per_second"], 1)} | '
      f'{_f(s["tokens_per_second"], 1)} |'
    )
  lines += [
    '',
    f'Draft depths covered per speculative call (0..'
    f'{r.get("max_gamma", r["gamma"])}), γ = {r["gamma"]}: '
    f'{r["accepted_histogram"]}',
    'Per-depth coverage: '
    + ' '.join(_f(a) for a in r['per_position_acceptance']),
    f'Walltime (compile excluded): plain beam search '
    f'{_f(r["plain_seconds"])} s, speculative '
    f'{_f(r["walltime"]["speculative_seconds"])} s.',
    'steps/call: beam-search steps committed per target call, summed over '
    'rows (plain beam search: 1); a call that covers draft depths 1..a '
    'commits 1 + a steps. α: the fraction of checked draft depths whose '
    'trees held every new live beam. Target calls: one per loop iteration '
    'of a batch (plain beam search: its steps; speculative: its calls). '
    'Quality and tok/s: the best beam.',
  ]
  return '\n'.join(lines + pages.summary_links(r)) + '\n'


def _beam_gamma(s: dict[str, Any]) -> str:
  """The γ column of a beam run: the int, or auto with the share of its
  iterations that were speculative calls."""
  if s['gamma'] != 'auto':
    return str(s['gamma'])
  kinds = s['gamma_iterations']
  return f'auto ({kinds[-1]} of {sum(kinds)} calls speculative)'


def _beam_auto_lines(r: dict[str, Any]) -> list[str]:
  """What speculative beam search's auto policy did, and its costs."""
  g_max, kinds = r['max_gamma'], r['gamma_iterations']
  lines = [
    f'gamma = auto: each iteration was a plain beam step or a speculative '
    f'call with draft trees of depth {g_max}, whichever was expected to '
    f'commit more steps per second (`beam/policy.py`); summed over '
    f'batches: {kinds[0]} plain steps, {kinds[-1]} speculative calls.',
  ]
  for model in (r.get('gamma_policy') or {}).get('cost_models', []):
    seconds = model['iteration_seconds']
    plain, call = seconds.get('0'), seconds.get(str(g_max))
    source = (
      'measured by this run'
      if model['measured']
      else 'read from the cost cache (measured earlier)'
    )
    lines.append(
      f'Cost model {model["key"]}: plain step {_opt(plain and plain * 1e3, 3)}'
      f' ms, speculative call {_opt(call and call * 1e3, 3)} ms; {source}; '
      f'cache file {model["path"]}.'
    )
  return lines + ['']

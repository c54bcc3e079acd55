"""summary.md: an eval run's Markdown report from its results.

A Table 4 style row per γ led by the outputs without EOS and the speedup on
the outputs that end and on the rest (`outcomes`), the measured speedup's
rounds, the predictions from c and v timed apart beside the cost the run
implies, quality, acceptance, and links to the plots (`plots`) and the
examples page (`pages`). Beam-search runs report in beam search's terms
(`figures`' docstring).
"""

import math
from typing import Any

from spec_decode.eval import rounds as rounds_lib
from spec_decode.eval.report import pages


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

"""Several eval runs side by side: drafters, temperatures, lenience, dynamic γ.

`compare` runs an eval (`run.evaluate`, or the gin-configured one) with the
given `EvalSettings`, once per (drafter, temperature, lenience, dynamic-γ
threshold) combination (the settings with those replaced), each in its own
subdirectory of `output_dir` (so each is resumable and has its full
report), and writes

  comparison.json   one record per run (the fields of the table below)
  comparison.md     the table, one row per run and γ: drafter, temperature,
                    lenience, dynamic γ, γ, α, c, tokens per target call,
                    draft tokens proposed per iteration, measured and
                    predicted speedup, the oracle bound 1/(1-α) (section
                    3.5), outputs without EOS (plain) and the speedup on
                    outputs that end (`outcomes`), quality, exactness

`spec-decode eval` calls it when a config binds `spec_eval_compare.compare`
(configs/drafters_debian_ende.gin, lenience_debian_ende.gin,
dynamic_gamma_debian_ende.gin). Library code: no gin decorators.
"""

import dataclasses
import json
import os
import re
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from spec_decode.eval import run as run_lib
from spec_decode.eval import settings as settings_lib

COMPARISON_JSON = 'comparison.json'
COMPARISON_MD = 'comparison.md'


def _slug(*parts: Any) -> str:
  text = '_'.join(str(p) for p in parts)
  return re.sub(r'[^A-Za-z0-9.]+', '-', text).strip('-').lower()


def _rows(name: str, result: dict[str, Any]) -> list[dict[str, Any]]:
  """One row per γ of a run (a sweep gives several)."""
  rows = []
  for entry in result.get('sweep') or [result]:
    # The first quality metric; a seqio task may have none.
    metric, values = next(
      iter(entry['quality'].items()),
      ('-', {'plain': float('nan'), 'speculative': float('nan')}),
    )
    rows.append(
      {
        'drafter': name,
        'temperature': result['temperature'],
        'lenience': result['lenience'],
        'dynamic_gamma': result.get('dynamic_gamma', 0.0),
        'gamma': entry['gamma'],
        'alpha': entry['alpha'],
        'c': entry['c'],
        'tokens_per_call': entry['tokens_per_call'],
        'mean_proposed': entry.get('mean_proposed', entry['gamma']),
        'speedup_measured': entry['speedup_measured'],
        'speedup_spread': entry.get('speedup_spread'),
        'speedup_predicted': entry['speedup_predicted'],
        **_ending(entry),
        'oracle_bound': 1.0 / max(1.0 - entry['alpha'], 1e-9),
        'metric': metric,
        'quality_plain': values['plain'],
        'quality_speculative': values['speculative'],
        'exact_algorithm': bool(result['exact_algorithm']),
        'exact_match_fraction': entry['exact_match_fraction'],
      }
    )
  return rows


def _ending(entry: dict[str, Any]) -> dict[str, Any]:
  """The row's outputs without EOS and its speedup on outputs that end
  (`outcomes.by_ending`; None for a run without them)."""
  e = entry.get('by_ending')
  if not e:
    return {'no_eos': None, 'speedup_ends': None, 'alpha_ends': None}
  ends = e['ends']
  return {
    'no_eos': e['no_eos']['plain'],
    'no_eos_token_share': e['no_eos']['plain_token_share'],
    'examples_ending': ends['examples'],
    'speedup_ends': ends.get('speedup_measured'),
    'alpha_ends': ends.get('alpha'),
  }


def _opt(x: Any, fmt: str) -> str:
  return '-' if x is None else format(x, fmt)


def _exactness(row: dict[str, Any]) -> str:
  if not row['exact_algorithm']:
    return f'NOT exact (lenient l={row["lenience"]:g})'
  if row['temperature'] == 0:
    return f'{row["exact_match_fraction"] * 100:.0f}% identical'
  return 'exact (Algorithm 1)'


def table(rows: Sequence[dict[str, Any]]) -> str:
  """The Markdown comparison table."""
  lines = [
    '| drafter | t | l | dyn. γ | γ | α | c | tok/call | proposed/iter '
    '| speedup | predicted | 1/(1-α) | no EOS (plain) | speedup on '
    'outputs that end (x) | quality (plain → spec.) | exactness |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    dyn = f'{r["dynamic_gamma"]:g}' if r['dynamic_gamma'] else '-'
    lines.append(
      f'| {r["drafter"]} | {r["temperature"]:g} | {r["lenience"]:g} | {dyn} '
      f'| {r["gamma"]} | {r["alpha"]:.3f} | {r["c"]:.3f} '
      f'| {r["tokens_per_call"]:.2f} | {r["mean_proposed"]:.2f} '
      f'| {r["speedup_measured"]:.2f}x | {r["speedup_predicted"]:.2f}x '
      f'| {r["oracle_bound"]:.2f} | {_opt(r.get("no_eos"), "d")} '
      f'| {_opt(r.get("speedup_ends"), ".2f")} '
      f'| {r["metric"]} {r["quality_plain"]:.2f} → '
      f'{r["quality_speculative"]:.2f} | {_exactness(r)} |'
    )
  return '\n'.join(lines)


def compare(
  *,
  drafts: dict[str, Any],
  settings: settings_lib.EvalSettings,
  output_dir: str,
  run: Callable[..., dict[str, Any]] = run_lib.evaluate,
  temperatures: Sequence[float] = (0.0,),
  leniences: Sequence[float] = (1.0,),
  dynamic_gammas: Sequence[float] = (0.0,),
  gammas: dict[str, Any] | None = None,
  title: str = 'Comparison',
  print_summary: bool = True,
  **run_kwargs,
) -> list[dict[str, Any]]:
  """Runs every combination; returns the comparison rows.

  Every combination's settings are built (and so checked) before the first
  run starts.

  Args:
    drafts: drafter name -> draft (model or drafter), in table order.
    settings: the runs' common settings; each run replaces `temperature`,
      `lenience`, `dynamic_gamma`, `draft_name` (and `gamma` for drafters
      in `gammas`).
    output_dir: runs go to `output_dir/<drafter>_t<t>_l<l>_dyn<tau>/`.
    run: the eval function (`run.evaluate` or its gin-configured form);
      called with `draft`, `settings`, `output_dir` and `print_summary`.
    temperatures: sampling temperatures (0 is greedy).
    leniences: l values (1 is exact).
    dynamic_gammas: 0 (fixed γ) or draft-confidence thresholds.
    gammas: per-drafter γ (an int, a sweep list or 'auto'; a sweep gives
      a row per γ); others use `settings.gamma`.
    title: heading of comparison.md.
    print_summary: print the table at the end.
    **run_kwargs: passed to `run` (e.g. `target` for the library
      `evaluate`; `progress`, `overwrite`).

  Raises:
    ValueError: no drafts, or a value that makes bad settings (the message
      names the `EvalSettings` field).
  """
  if not drafts:
    raise ValueError('compare needs at least one draft')
  runs = []
  for name, draft in drafts.items():
    gamma = (gammas or {}).get(name, settings.gamma)
    for t in temperatures:
      for lenience in leniences:
        for tau in dynamic_gammas:
          sub = _slug(name, f't{t:g}', f'l{lenience:g}', f'dyn{tau:g}')
          run_settings = dataclasses.replace(
            settings,
            temperature=t,
            lenience=lenience,
            dynamic_gamma=tau,
            draft_name=name,
            gamma=gamma,
          )
          runs.append((name, draft, sub, run_settings))
  os.makedirs(output_dir, exist_ok=True)
  rows = []
  for name, draft, sub, run_settings in runs:
    result = run(
      draft=draft,
      settings=run_settings,
      output_dir=os.path.join(output_dir, sub),
      print_summary=False,
      **run_kwargs,
    )
    rows.extend(dict(r, run_dir=sub) for r in _rows(name, result))
    _write(output_dir, title, rows)
  if print_summary:
    print(f'\n## {title}\n\n{table(rows)}\n')
  return rows


def _write(output_dir: str, title: str, rows: list[dict[str, Any]]) -> None:
  with open(os.path.join(output_dir, COMPARISON_JSON), 'w') as f:
    json.dump(rows, f, indent=1)
  with open(os.path.join(output_dir, COMPARISON_MD), 'w') as f:
    f.write(f'# {title}\n\n{table(rows)}\n')

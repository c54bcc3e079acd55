"""`spec-decode theory`: the paper's analytic tables and figures.

Prints Table 1 of Leviathan et al. (2023) (operations and speed for c = ĉ = 0)
and a table of the optimal γ over a grid of α and c (the data of Figure 3),
and writes PNG plots of Figure 2 (expected tokens per iteration vs α),
Figure 3 (optimal γ and its speedup vs α) and Figure 4 (speedup and
arithmetic-operations increase vs γ), plus the printed numbers as JSON.

Example:

  spec-decode theory --out_dir=/tmp/theory \
      --alphas=0.6,0.7,0.8,0.9 --cs=0.01,0.05,0.1
"""

import argparse
import json
import os
import sys
from collections.abc import Sequence

import numpy as np

from spec_decode import theory

# Table 1 of the paper: (α, γ) rows at c = ĉ = 0.
TABLE1_ROWS = ((0.6, 2), (0.7, 3), (0.8, 2), (0.8, 5), (0.9, 2), (0.9, 10))

_DEFAULT_ALPHAS = '0.5,0.6,0.7,0.75,0.8,0.85,0.9,0.95'
_DEFAULT_CS = '0.01,0.02,0.05,0.1,0.2,0.5'
_FIG2_GAMMAS = (1, 2, 3, 5, 7, 10)
_FIG4_ALPHAS = (0.6, 0.7, 0.8, 0.9)

FIGURE_FILES = (
  'figure2_expected_tokens.png',
  'figure3_optimal_gamma.png',
  'figure4_speedup_and_ops.png',
)


def _float_list(text: str) -> list[float]:
  """Parses '0.1,0.2' (or space separated) into floats."""
  try:
    values = [float(x) for x in text.replace(',', ' ').split()]
  except ValueError as e:
    raise argparse.ArgumentTypeError(f'not a list of numbers: {text!r}') from e
  if not values:
    raise argparse.ArgumentTypeError('empty list')
  return values


def _unit_interval_list(text: str) -> list[float]:
  values = _float_list(text)
  if any(not 0 <= a <= 1 for a in values):
    raise argparse.ArgumentTypeError(f'alphas must lie in [0, 1]: {text!r}')
  return values


def _nonnegative_list(text: str) -> list[float]:
  values = _float_list(text)
  if any(x < 0 for x in values):
    raise argparse.ArgumentTypeError(f'values must be >= 0: {text!r}')
  return values


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog='spec-decode theory',
    description=(
      'Analytic speedup, operations and optimal gamma of speculative '
      'decoding (Leviathan et al., 2023, section 3).'
    ),
  )
  parser.add_argument(
    '--out_dir',
    default='theory_out',
    help='Directory for the PNG figures and theory.json.',
  )
  parser.add_argument(
    '--alphas',
    type=_unit_interval_list,
    default=_unit_interval_list(_DEFAULT_ALPHAS),
    help='Comma-separated alphas for the optimal-gamma table.',
  )
  parser.add_argument(
    '--cs',
    type=_nonnegative_list,
    default=_nonnegative_list(_DEFAULT_CS),
    help='Comma-separated cost ratios c for the optimal-gamma table and '
    'Figure 3.',
  )
  parser.add_argument(
    '--max_gamma',
    type=int,
    default=64,
    help='Largest gamma searched for the optimum.',
  )
  parser.add_argument(
    '--fig4_c',
    type=float,
    default=0.05,
    help='Cost ratio c of Figure 4.',
  )
  parser.add_argument(
    '--fig4_c_hat',
    type=float,
    default=0.05,
    help='Operations ratio c_hat of Figure 4.',
  )
  return parser


def table1() -> list[dict[str, float]]:
  """Rows of Table 1: operations and speed at c = ĉ = 0."""
  rows = []
  for a, g in TABLE1_ROWS:
    rows.append(
      {
        'alpha': a,
        'gamma': g,
        'operations': float(theory.ops_increase(a, g, 0.0)),
        'speed': float(theory.walltime_improvement(a, g, 0.0)),
      }
    )
  return rows


def format_table1(rows: Sequence[dict[str, float]]) -> str:
  """Table 1 as printed by the paper (2 decimals)."""
  lines = [
    'Table 1 (c = c_hat = 0)',
    f'{"alpha":>6} {"gamma":>6} {"operations":>11} {"speed":>7}',
  ]
  for r in rows:
    lines.append(
      f'{r["alpha"]:>6.2f} {r["gamma"]:>6d} {r["operations"]:>10.2f}x'
      f' {r["speed"]:>6.2f}x'
    )
  return '\n'.join(lines)


def optimal_gamma_table(
  alphas: Sequence[float], cs: Sequence[float], max_gamma: int
) -> dict[str, list]:
  """Optimal γ and its speedup on the grid alphas x cs (Theorem 3.8)."""
  a = np.asarray(alphas, dtype=np.float64)[:, None]
  c = np.asarray(cs, dtype=np.float64)[None, :]
  gamma, speedup = theory.choose_gamma(a, c, 1.0, max_gamma=max_gamma)
  return {
    'alphas': list(alphas),
    'cs': list(cs),
    'gamma': np.asarray(gamma).tolist(),
    'speedup': np.asarray(speedup).tolist(),
  }


def format_optimal_gamma_table(table: dict[str, list], max_gamma: int) -> str:
  """The optimal-γ grid as text; each cell is 'γ* (speedup x)'."""
  width = 14
  corner = 'alpha \\ c'
  header = f'{corner:>9}' + ''.join(f'{c:>{width}g}' for c in table['cs'])
  lines = [
    f'Optimal gamma (speedup at it), Theorem 3.8, gamma <= {max_gamma}',
    header,
  ]
  for i, a in enumerate(table['alphas']):
    cells = ''.join(
      f'{f"{g} ({s:.2f}x)":>{width}}'
      for g, s in zip(table['gamma'][i], table['speedup'][i], strict=True)
    )
    lines.append(f'{a:>9.2f}{cells}')
  return '\n'.join(lines)


def _new_figure(ncols: int):
  # Figure + Agg canvas directly: no pyplot, so no global backend state.
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  fig = Figure(figsize=(5.5 * ncols, 4.2), layout='constrained')
  FigureCanvasAgg(fig)
  axes = fig.subplots(1, ncols, squeeze=False)[0]
  return fig, axes


def plot_figure2(path: str) -> None:
  """Figure 2: expected tokens per iteration vs α for several γ."""
  fig, (ax,) = _new_figure(1)
  alphas = np.linspace(0.0, 0.99, 199)
  for g in _FIG2_GAMMAS:
    ax.plot(alphas, theory.expected_tokens(alphas, g), label=f'γ = {g}')
  ax.plot(
    alphas,
    np.minimum(theory.oracle_bound(alphas), 12.0),
    'k:',
    label='1 / (1 - α) (γ → ∞)',
  )
  ax.set_xlabel('α')
  ax.set_ylabel('expected tokens per iteration')
  ax.set_ylim(1, 12)
  ax.set_title('Figure 2: (1 - α^(γ+1)) / (1 - α)')
  ax.grid(alpha=0.3)
  ax.legend()
  fig.savefig(path, dpi=100)


def plot_figure3(path: str, cs: Sequence[float], max_gamma: int) -> None:
  """Figure 3: optimal γ and the speedup at it vs α for several c."""
  fig, (ax_g, ax_s) = _new_figure(2)
  alphas = np.linspace(0.01, 0.99, 197)
  for c in cs:
    gamma, speedup = theory.choose_gamma(alphas, c, 1.0, max_gamma=max_gamma)
    ax_g.step(alphas, gamma, where='mid', label=f'c = {c:g}')
    ax_s.plot(alphas, speedup, label=f'c = {c:g}')
  ax_g.set_yscale('log')
  ax_g.set_xlabel('α')
  ax_g.set_ylabel('optimal γ')
  ax_g.set_title(f'Figure 3: optimal γ (searched up to {max_gamma})')
  ax_s.axhline(1.0, color='k', lw=0.8)
  ax_s.set_xlabel('α')
  ax_s.set_ylabel('walltime improvement at optimal γ')
  ax_s.set_title('Theorem 3.8 at the optimal γ')
  for ax in (ax_g, ax_s):
    ax.grid(alpha=0.3)
    ax.legend()
  fig.savefig(path, dpi=100)


def plot_figure4(path: str, c: float, c_hat: float) -> None:
  """Figure 4: speedup and ops increase vs γ for several α."""
  fig, (ax_s, ax_o) = _new_figure(2)
  gammas = np.arange(1, 21)
  for a in _FIG4_ALPHAS:
    ax_s.plot(
      gammas,
      theory.walltime_improvement(a, gammas, c),
      marker='.',
      label=f'α = {a:g}',
    )
    ax_o.plot(
      gammas,
      theory.ops_increase(a, gammas, c_hat),
      marker='.',
      label=f'α = {a:g}',
    )
  ax_s.set_ylabel(f'walltime improvement (c = {c:g})')
  ax_s.set_title('Figure 4: Theorem 3.8')
  ax_o.set_ylabel(f'arithmetic operations increase (ĉ = {c_hat:g})')
  ax_o.set_title('Figure 4: Theorem 3.11')
  for ax in (ax_s, ax_o):
    ax.set_xlabel('γ')
    ax.grid(alpha=0.3)
    ax.legend()
  fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
  """Runs the CLI.

  Args:
    argv: command-line arguments without the program name (None:
      `sys.argv[1:]`).

  Returns:
    The process exit code (0 on success).
  """
  args = _parser().parse_args(argv)
  if args.max_gamma < 1:
    print('--max_gamma must be >= 1', file=sys.stderr)
    return 2

  rows = table1()
  grid = optimal_gamma_table(args.alphas, args.cs, args.max_gamma)
  print(format_table1(rows))
  print()
  print(format_optimal_gamma_table(grid, args.max_gamma))

  os.makedirs(args.out_dir, exist_ok=True)
  paths = [os.path.join(args.out_dir, name) for name in FIGURE_FILES]
  plot_figure2(paths[0])
  plot_figure3(paths[1], args.cs, args.max_gamma)
  plot_figure4(paths[2], args.fig4_c, args.fig4_c_hat)
  with open(os.path.join(args.out_dir, 'theory.json'), 'w') as f:
    json.dump({'table1': rows, 'optimal_gamma': grid}, f, indent=2)
  print()
  for path in paths:
    print(f'wrote {path}')
  return 0

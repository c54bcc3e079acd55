"""The plots of an eval run, from results.json's figures.

  accepted_histogram.png   draft tokens accepted per iteration (beam search:
                           draft depths covered per call), with the iid
                           curve of a fixed γ
  position_acceptance.png  per-position acceptance (beam search: per-depth
                           coverage) against α
  speedup_vs_gamma.png     a γ sweep's measured and predicted speedups

summary.md and examples.html link them (`PLOTS` in that order).
"""

import os
from typing import Any

import numpy as np

HISTOGRAM_PLOT = 'accepted_histogram.png'
POSITION_PLOT = 'position_acceptance.png'
SWEEP_PLOT = 'speedup_vs_gamma.png'
PLOTS = (HISTOGRAM_PLOT, POSITION_PLOT, SWEEP_PLOT)


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  return plt


def _title(r: dict[str, Any], beam: bool) -> str:
  if beam:
    return f'{r["task"]}, γ = {r["gamma"]}, {r["num_beams"]} beams'
  return f'{r["task"]}, γ = {r["gamma"]}, temperature {r["temperature"]:g}'


def _save(plt, fig, output_dir: str, name: str) -> str:
  fig.tight_layout()
  fig.savefig(os.path.join(output_dir, name), dpi=100)
  plt.close(fig)
  return name


def write(r: dict[str, Any], output_dir: str) -> list[str]:
  """Draws the run's plots into `output_dir`; returns their file names."""
  plt = _pyplot()
  beam = r.get('decode_method') == 'beam'
  hist = np.asarray(r['accepted_histogram'], np.float64)
  g, a = r['gamma'], r['alpha']
  n = np.arange(len(hist))
  fig, ax = plt.subplots(figsize=(5, 3.5))
  ax.bar(n, hist / max(hist.sum(), 1), label='measured')
  if g != 'auto':  # The iid curve is a fixed γ's; auto mixes γs.
    iid = np.where(n < g, a**n * (1 - a), a**g)
    ax.plot(n, iid, 'ko--', label=f'iid α = {a:.2f}')
  if beam:
    ax.set_xlabel('draft depths covered per target call')
    ax.set_ylabel('fraction of target calls')
  else:
    ax.set_xlabel('draft tokens accepted per iteration')
    ax.set_ylabel('fraction of iterations')
  ax.set_title(_title(r, beam))
  ax.legend()
  written = [_save(plt, fig, output_dir, HISTOGRAM_PLOT)]

  per_position = np.asarray(r['per_position_acceptance'], np.float64)
  if per_position.size:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    pos = np.arange(1, per_position.size + 1)
    ax.bar(pos, per_position, label='measured')
    ax.axhline(a, color='k', ls='--', lw=1, label=f'α = {a:.2f}')
    ax.set_ylim(0, 1.05)
    ax.set_xticks(pos)
    if beam:
      ax.set_xlabel('draft depth')
      ax.set_ylabel('P(covered | depths before covered)')
    else:
      ax.set_xlabel('draft position in the iteration')
      ax.set_ylabel('P(accepted | tokens before accepted)')
    ax.set_title(_title(r, beam))
    ax.legend()
    written.append(_save(plt, fig, output_dir, POSITION_PLOT))

  if r['sweep']:
    gs = [s['gamma'] for s in r['sweep']]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    curves = [('speedup_measured', 'measured', 'o-')]
    if not beam:  # The predictions are a chain's.
      curves += [
        ('speedup_predicted', 'E[tokens]/(γc+v)', 's--'),
        ('speedup_predicted_theorem38', 'Theorem 3.8', '^:'),
      ]
    for key, label, style in curves:
      ax.plot(gs, [s[key] for s in r['sweep']], style, label=label)
    ax.axhline(1.0, color='gray', lw=0.8)
    ax.set_xticks(gs)
    ax.set_xlabel('γ')
    if beam:
      ax.set_ylabel('speedup over plain beam search')
      ax.set_title(f'{r["task"]}, {r["num_beams"]} beams')
    else:
      ax.set_ylabel('speedup over plain decoding')
      ax.set_title(f'{r["task"]}, temperature {r["temperature"]:g}')
    ax.legend()
    written.append(_save(plt, fig, output_dir, SWEEP_PLOT))
  return written


def names(r: dict[str, Any]) -> list[str]:
  """The plots `write` draws for results `r`, in `PLOTS` order."""
  out = [HISTOGRAM_PLOT]
  if len(r['per_position_acceptance']):
    out.append(POSITION_PLOT)
  if r['sweep']:
    out.append(SWEEP_PLOT)
  return out

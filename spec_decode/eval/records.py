"""The files of an eval run, written so that a crash loses at most a batch.

  results.json     every figure (`report.TIMING_KEYS` mark the timing ones)
  summary.md       the Markdown report
  examples.jsonl   one line per example, appended (flushed and fsynced)
                   batch by batch as the run goes
  run_state.json   the run's settings (and an auto-γ choice)
  examples.html    every example with its tokens' provenance (`pages.py`)
  accepted_histogram.png, position_acceptance.png, speedup_vs_gamma.png
  <task>-predict.jsonl-00000-of-00001
                   the outputs as T5X's infer writes them

JSON files are replaced atomically (written aside, then renamed). A rerun
in the same directory with the same settings resumes: `read_records` keeps
the complete batches of examples.jsonl and cuts the file back to them.
Other settings are refused unless the directory is overwritten.
"""

import glob
import json
import os
from collections.abc import Sequence
from typing import Any

from spec_decode.eval.report import pages
from spec_decode.eval.report import plots

RESULTS_FILE = 'results.json'
SUMMARY_FILE = 'summary.md'
EXAMPLES_FILE = 'examples.jsonl'
STATE_FILE = 'run_state.json'
PAGE_FILE = pages.PAGE_FILE
HISTOGRAM_PLOT = plots.HISTOGRAM_PLOT
POSITION_PLOT = plots.POSITION_PLOT
SWEEP_PLOT = plots.SWEEP_PLOT
# Everything a run writes but its state: removed when a run starts afresh.
_OUTPUTS = (
  EXAMPLES_FILE,
  RESULTS_FILE,
  SUMMARY_FILE,
  PAGE_FILE,
  HISTOGRAM_PLOT,
  POSITION_PLOT,
  SWEEP_PLOT,
)


def write_json(path: str, obj: Any) -> None:
  """Writes `obj` to `path` atomically (a crash leaves the old file)."""
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(obj, f, indent=2, ensure_ascii=False)
    f.write('\n')
  os.replace(tmp, path)


def read_records(
  path: str, batch_size: int, total: int
) -> list[dict[str, Any]]:
  """Complete batches of `examples.jsonl`; the file is cut back to them.

  A crash can leave a partial last line or a partial batch: both are
  dropped (and truncated away) so that the rerun redoes whole batches.
  """
  if not os.path.exists(path):
    return []
  records, offsets, offset = [], [0], 0
  with open(path, 'rb') as f:
    for line in f:
      if not line.endswith(b'\n'):
        break
      try:
        rec = json.loads(line)
      except ValueError:
        break
      if rec.get('index') != len(records):
        break
      records.append(rec)
      offset += len(line)
      offsets.append(offset)
  keep = min(len(records), total)
  if keep < total:
    keep = keep // batch_size * batch_size
  with open(path, 'r+b') as f:
    f.truncate(offsets[keep])
  return records[:keep]


def append_records(path: str, records: list[dict[str, Any]]) -> None:
  """Appends one JSON line per record and syncs the file to disk."""
  text = ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records)
  with open(path, 'a', encoding='utf-8') as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


def prepare_dir(
  output_dir: str, settings: dict[str, Any], overwrite: bool
) -> dict[str, Any]:
  """Creates or reopens the output directory; returns the stored state.

  Args:
    output_dir: the run's directory.
    settings: what identifies the run (JSON values); a directory holding a
      run with other settings is refused unless `overwrite`.
    overwrite: start afresh whatever the directory holds.

  Returns:
    The state of run_state.json: `{'settings': ...}` and whatever the run
    saved with `save_state` (a reopened run's auto-γ choice).

  Raises:
    ValueError: the directory holds a run with other settings.
  """
  os.makedirs(output_dir, exist_ok=True)
  state_path = os.path.join(output_dir, STATE_FILE)
  if os.path.exists(state_path) and not overwrite:
    with open(state_path, encoding='utf-8') as f:
      state = json.load(f)
    if state.get('settings') == settings:
      return state
    old = state.get('settings', {})
    diff = sorted(
      k for k in set(old) | set(settings) if old.get(k) != settings.get(k)
    )
    raise ValueError(
      f'{output_dir} holds a run with other settings (differing: '
      f'{", ".join(diff)}); choose another output directory, or overwrite '
      'it (--overwrite / overwrite=True)'
    )
  for name in _OUTPUTS:
    path = os.path.join(output_dir, name)
    if os.path.exists(path):
      os.remove(path)
  for path in glob.glob(os.path.join(output_dir, predictions_file('*'))):
    os.remove(path)
  state = {'settings': settings}
  save_state(output_dir, state)
  return state


def save_state(output_dir: str, state: dict[str, Any]) -> None:
  """Writes run_state.json."""
  write_json(os.path.join(output_dir, STATE_FILE), state)


def write_results(
  output_dir: str, results: dict[str, Any], summary: str
) -> None:
  """Writes results.json, summary.md and the plots."""
  write_json(os.path.join(output_dir, RESULTS_FILE), results)
  with open(os.path.join(output_dir, SUMMARY_FILE), 'w', encoding='utf-8') as f:
    f.write(summary)
  plots.write(results, output_dir)


def predictions_file(task: str) -> str:
  """The file T5X's infer writes for `task` (one shard)."""
  return f'{task}-predict.jsonl-00000-of-00001'


def write_predictions(
  output_dir: str,
  subtasks: Sequence[str],
  pretokenized: Sequence[dict[str, Any]],
  records: Sequence[dict[str, Any]],
  gamma: int | str,
) -> list[str]:
  """Writes the outputs as T5X's infer does, one file per (sub)task.

  Each line: `inputs` (the example's `*_pretokenized` features),
  `prediction` (the speculative output at `gamma`, decoded, not
  postprocessed; `gamma` is a γ or 'auto', the key of the records'
  speculative outputs), `targets` (the target text) and `plain_prediction`
  (the target model's own decode).

  Returns:
    The files written.
  """
  lines: dict[str, list[str]] = {}
  for task, inputs, rec in zip(subtasks, pretokenized, records, strict=True):
    row = {
      'inputs': inputs,
      'prediction': rec['speculative'][str(gamma)]['text'],
      'targets': inputs.get('targets_pretokenized', rec['reference']),
      'plain_prediction': rec['plain'],
    }
    lines.setdefault(task, []).append(json.dumps(row, ensure_ascii=False))
  written = []
  for task, rows in lines.items():
    path = os.path.join(output_dir, predictions_file(task))
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
      f.write('\n'.join(rows) + '\n')
    os.replace(path + '.tmp', path)
    written.append(path)
  return written

"""An infer run's files: chunks written whole, merged into T5X's files.

As T5X's infer.py does, the examples are decoded in chunks of
`checkpoint_period` batches, and each chunk is written to a temporary
directory before the next starts:

  tmp-infer/chunk00000.jsonl   one line per example of the chunk: its
                               index, (sub)task, T5X line and counts;
                               written aside, synced, then renamed, so a
                               chunk file is whole or absent
  run_state.json               the run's settings (`eval/records.py`):
                               a rerun with others is refused

A rerun (after kill -9, a preemption, Ctrl-C) keeps the chunks on disk,
which run from chunk 0 without a gap, and decodes from the next: no line is
lost or written twice. When every chunk is there, `merge` writes per
(sub)task T5X's `{task}-{mode}.jsonl-00000-of-00001` (its lines in input
order, as T5X's `json.dumps`), a `.COMPLETED` file beside it as T5X does,
and the summary; then the temporary directory goes and run_state.json
records the run complete (a rerun does nothing).
"""

import glob
import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

from spec_decode.eval import records as records_lib

TMP_DIR = 'tmp-infer'
SUMMARY_FILE = 'infer_summary.json'
COMPLETED = '.COMPLETED'
STATE_KEY = 'infer'


def predictions_file(task: str, mode: str) -> str:
  """T5X's name for `task`'s predictions in `mode` (one shard)."""
  return f'{task}-{mode}.jsonl-00000-of-00001'


def chunk_path(output_dir: str, chunk: int) -> str:
  return os.path.join(output_dir, TMP_DIR, f'chunk{chunk:05}.jsonl')


def open_dir(
  output_dir: str, identity: dict[str, Any], overwrite: bool
) -> dict[str, Any]:
  """Creates or reopens the run's directory; returns its state.

  A fresh run (or `overwrite`) removes an earlier run's chunks,
  predictions and summary. The state's `'infer'` entry says whether the
  run is complete.

  Raises:
    ValueError: the directory holds a run with other settings.
  """
  state = records_lib.prepare_dir(output_dir, identity, overwrite)
  if STATE_KEY not in state:
    shutil.rmtree(os.path.join(output_dir, TMP_DIR), ignore_errors=True)
    for path in glob.glob(os.path.join(output_dir, '*.jsonl-00000-of-00001*')):
      os.remove(path)
    summary = os.path.join(output_dir, SUMMARY_FILE)
    if os.path.exists(summary):
      os.remove(summary)
    state[STATE_KEY] = {'complete': False}
    records_lib.save_state(output_dir, state)
  os.makedirs(os.path.join(output_dir, TMP_DIR), exist_ok=True)
  return state


def chunks_done(output_dir: str) -> int:
  """How many chunks from chunk 0 on are on disk, without a gap (a chunk
  after a gap cannot exist, but is redone if it does)."""
  n = 0
  while os.path.exists(chunk_path(output_dir, n)):
    n += 1
  return n


def write_chunk(
  output_dir: str, chunk: int, rows: Sequence[dict[str, Any]]
) -> None:
  """Writes a chunk's rows whole: aside, synced, renamed into place."""
  path = chunk_path(output_dir, chunk)
  text = ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in rows)
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(path + '.tmp', path)


def read_chunks(output_dir: str, count: int) -> list[dict[str, Any]]:
  """The rows of chunks 0..count-1, in order."""
  rows = []
  for chunk in range(count):
    with open(chunk_path(output_dir, chunk), encoding='utf-8') as f:
      rows.extend(json.loads(line) for line in f)
  return rows


def merge(
  output_dir: str,
  rows: Sequence[dict[str, Any]],
  mode: str,
  summary: dict[str, Any],
  state: dict[str, Any],
) -> list[str]:
  """Writes the predictions files, their `.COMPLETED` and the summary,
  removes the chunks and records the run complete; returns the files."""
  lines: dict[str, list[str]] = {}
  for row in rows:
    # T5X's `json.dumps(json_dict)`: ASCII, default separators.
    lines.setdefault(row['task'], []).append(json.dumps(row['line']))
  written = []
  for task, texts in lines.items():
    path = os.path.join(output_dir, predictions_file(task, mode))
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
      f.write('\n'.join(texts) + '\n')
    os.replace(path + '.tmp', path)
    with open(path + COMPLETED, 'w', encoding='utf-8'):
      pass
    written.append(path)
  summary = {**summary, 'files': [os.path.basename(p) for p in written]}
  records_lib.write_json(os.path.join(output_dir, SUMMARY_FILE), summary)
  state[STATE_KEY] = {'complete': True}
  records_lib.save_state(output_dir, state)
  shutil.rmtree(os.path.join(output_dir, TMP_DIR), ignore_errors=True)
  return written


def read_summary(output_dir: str) -> dict[str, Any]:
  with open(os.path.join(output_dir, SUMMARY_FILE), encoding='utf-8') as f:
    return json.load(f)

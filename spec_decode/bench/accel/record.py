"""The run's results, written after every measurement.

`Recorder` keeps one JSON document (`accel.json`) and its Markdown tables
(`accel.md`) in the output directory and rewrites both, atomically, each
time a measurement lands: a run cut off by its time limit (or a crash)
keeps everything it measured, and says what it skipped and why. The item
in progress is written before it starts (`running`) and `finished` only at
the end, so a run killed mid-item says where it stopped.
"""

import json
import math
import os
import time
import traceback
from typing import Any

JSON_FILE = 'accel.json'
MARKDOWN_FILE = 'accel.md'


def _clean(x: Any) -> Any:
  """JSON-safe: numpy scalars to Python, non-finite floats to None."""
  if isinstance(x, dict):
    return {str(k): _clean(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_clean(v) for v in x]
  if hasattr(x, 'item') and getattr(x, 'shape', None) == ():
    x = x.item()
  if hasattr(x, 'tolist'):
    return _clean(x.tolist())
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


class Recorder:
  """Results of one run under `out_dir`; every call rewrites the files.

  Attributes:
    data: `{'meta', 'sections': {name: ...}, 'timeline': [...],
      'skipped': [...], 'errors': [...], 'running': item or None,
      'finished': bool}`; a timeline entry is `{section, item, seconds,
      predicted, at}` (seconds from the start, compilation included).
  """

  def __init__(self, out_dir: str, meta: dict[str, Any], render=None):
    self.out_dir = out_dir
    self.render = render
    self.start = time.monotonic()
    self.data = {
      'meta': meta,
      'sections': {},
      'timeline': [],
      'skipped': [],
      'errors': [],
      'running': None,
      'finished': False,
    }
    os.makedirs(out_dir, exist_ok=True)
    self.write()

  def put(self, section: str, key: str | None, value: Any) -> None:
    """Sets `sections[section][key]` (or the section itself) and writes."""
    if key is None:
      self.data['sections'][section] = value
    else:
      self.data['sections'].setdefault(section, {})[key] = value
    self.write()

  def append(self, section: str, row: dict[str, Any]) -> None:
    """Appends `row` to the list `sections[section]` and writes."""
    self.data['sections'].setdefault(section, []).append(row)
    self.write()

  def begin(self, section: str, item: str, predicted: float | None) -> None:
    """Marks `item` as running (a run killed now stops here)."""
    self.data['running'] = {
      'section': section,
      'item': item,
      'predicted': None if predicted is None else round(predicted, 3),
      'at': round(time.monotonic() - self.start, 3),
    }
    self.write()

  def event(
    self,
    section: str,
    item: str,
    seconds: float,
    predicted: float | None = None,
  ) -> None:
    self.data['timeline'].append({
      'section': section,
      'item': item,
      'seconds': round(seconds, 3),
      'predicted': None if predicted is None else round(predicted, 3),
      'at': round(time.monotonic() - self.start, 3),
    })  # fmt: skip
    self.data['running'] = None
    self.write()

  def finish(self) -> None:
    self.data['running'] = None
    self.data['finished'] = True
    self.write()

  def skip(self, section: str, item: str, why: str) -> None:
    """Records `item` as skipped (and as no longer running)."""
    self.data['skipped'].append({'section': section, 'item': item, 'why': why})
    self.data['running'] = None
    self.write()

  def error(self, section: str, exc: BaseException) -> None:
    self.data['errors'].append({
      'section': section,
      'error': f'{type(exc).__name__}: {exc}'[:2000],
      'trace': traceback.format_exc()[-4000:],
    })  # fmt: skip
    self.write()

  def write(self) -> None:
    self.data['meta']['elapsed_seconds'] = round(
      time.monotonic() - self.start, 3
    )
    doc = _clean(self.data)
    _atomic(
      os.path.join(self.out_dir, JSON_FILE), json.dumps(doc, indent=1) + '\n'
    )
    if self.render is not None:
      _atomic(os.path.join(self.out_dir, MARKDOWN_FILE), self.render(doc))


def _atomic(path: str, text: str) -> None:
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write(text)
  os.replace(tmp, path)

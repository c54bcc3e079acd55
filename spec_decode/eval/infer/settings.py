"""What an infer run decodes and how: `InferSettings`, checked when built.

`InferSettings` is `EvalSettings` (task, split, lengths, batch size, γ,
sampling, beams, seeds, ...; `eval/settings.py`) plus what only the infer
run reads: an input file instead of a task, what a bad line of it does,
token trees, T5X's infer mode and chunk size, and the optional columns of
the predictions. Like `EvalSettings` it checks every field when built, so a
bad value is a `ValueError` naming the field before a model loads.

An infer run decodes speculatively only, with one γ (an int or 'auto') or a
tree; plain decoding is the eval run's (`spec-decode eval`).
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

from spec_decode.eval import settings as settings_lib

# T5X infer.py's modes that decode ('score' decodes nothing).
MODES = ('predict', 'predict_with_aux')
# What a bad line of an input file does: seqio's trimming, or an error.
BAD_LINES = ('trim', 'fail')


def _fail(name: str, what: str, value: Any) -> ValueError:
  return ValueError(f'InferSettings.{name} must be {what}, got {value!r}')


def _tree(value: Any) -> Any:
  """None, 'auto', a per-depth branching tuple or paths of child ranks, as
  `sd.generate(tree=)` takes them (lists become tuples: hashable)."""
  if value is None:
    return None
  if isinstance(value, str) and value.strip().lower() == 'auto':
    return 'auto'
  what = "None, 'auto', a tuple of ints >= 1 or a list of rank paths"
  if not isinstance(value, Sequence) or isinstance(value, str) or not value:
    raise _fail('tree', what, value)
  if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
    if min(value) < 1:
      raise _fail('tree', what, value)
    return tuple(int(v) for v in value)
  try:
    paths = tuple(tuple(int(r) for r in path) for path in value)
  except (TypeError, ValueError):
    raise _fail('tree', what, value) from None
  if any(not p or min(p) < 0 for p in paths):
    raise _fail('tree', what, value)
  return paths


def _optional_text(name: str, value: Any) -> str | None:
  if value is None or (isinstance(value, str) and value):
    return value
  raise _fail(name, 'a non-empty string or None', value)


@dataclasses.dataclass(frozen=True)
class InferSettings(settings_lib.EvalSettings):
  """The settings of an infer run (`infer.run.infer`); checked when built.

  Attributes (besides `EvalSettings`'s; `num_examples` defaults to the
  whole input here):
    input_file: a text file (one input per line) or, with `input_field`, a
      JSONL file; None reads the task split. With a file the task is not
      read: the predictions are named after the file.
    input_field: the JSONL field holding each input (None: a text file).
    id_field: a JSONL field copied into each prediction's `inputs` (None:
      none); predictions keep the input order either way.
    bad_lines: `'trim'` (seqio's way: an input longer than
      `max_input_len` is cut to its first max_input_len - 1 tokens and EOS,
      bytes that are not UTF-8 become U+FFFD, an empty line is an input of
      EOS alone) or `'fail'` (a `ValueError` naming the line).
    tree: None (chains of γ), or `sd.generate`'s `tree=`: 'auto', a
      per-depth branching tuple or paths of child ranks; replaces γ.
    mode: T5X's infer mode, `'predict'` or `'predict_with_aux'` (adds
      `aux.scores`: the target's log-probability of the prediction, EOS
      included; beam search's own score).
    provenance: add each prediction token's provenance (accepted,
      replaced, bonus; `core.provenance` codes) as `aux.provenance`.
    output_ids: add `prediction_tokens` (T5X's `output_ids`).
    checkpoint_period: batches per chunk (T5X's `infer.checkpoint_period`):
      each chunk is written whole before the next starts, and a rerun
      resumes after the last one written.
    page_examples: draw the first this many predictions as the paper's
      Figure 1 in examples.html (`infer/page.py`); 0 writes no page.
  """

  num_examples: int | None = None
  input_file: str | None = None
  input_field: str | None = None
  id_field: str | None = None
  bad_lines: str = 'trim'
  tree: Any = None
  mode: str = 'predict'
  provenance: bool = False
  output_ids: bool = False
  checkpoint_period: int = 100
  page_examples: int = 0

  def checked_task(self, value: Any) -> str | None:
    """With an input file the task is not read (nor checked)."""
    if self.input_file is not None:
      return value
    return super().checked_task(value)

  def __post_init__(self):
    super().__post_init__()
    values = {
      'input_file': _optional_text('input_file', self.input_file),
      'input_field': _optional_text('input_field', self.input_field),
      'id_field': _optional_text('id_field', self.id_field),
      'tree': _tree(self.tree),
    }
    if self.bad_lines not in BAD_LINES:
      raise _fail('bad_lines', f'one of {BAD_LINES}', self.bad_lines)
    if self.mode not in MODES:
      raise _fail('mode', f'one of {MODES}', self.mode)
    for name in ('provenance', 'output_ids'):
      if not isinstance(getattr(self, name), bool):
        raise _fail(name, 'True or False', getattr(self, name))
    period = self.checkpoint_period
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
      raise _fail('checkpoint_period', 'an int >= 1', period)
    pages = self.page_examples
    if isinstance(pages, bool) or not isinstance(pages, int) or pages < 0:
      raise _fail('page_examples', 'an int >= 0', pages)
    if values['id_field'] and not values['input_field']:
      raise _fail('id_field', 'None without input_field (a JSONL file)', True)
    if self.gamma != 'auto' and len(self.gamma) > 1:
      raise ValueError(
        'InferSettings.gamma must be one int or auto (an infer run decodes '
        f'once; `spec-decode eval` sweeps γ), got {list(self.gamma)}'
      )
    if values['tree'] is not None and self.beam:
      raise ValueError(
        'InferSettings.tree: beam search grows its own draft trees (set '
        'DRAFT_BEAMS / DRAFT_CHILDREN instead), got tree='
        f'{values["tree"]!r}'
      )
    if values['tree'] is not None and (
      self.lenience != 1.0 or self.dynamic_gamma
    ):
      raise ValueError(
        'InferSettings.tree verifies exactly: lenience and dynamic_gamma '
        'apply to chains only'
      )
    for name, value in values.items():
      object.__setattr__(self, name, value)

  @property
  def gamma_value(self) -> int | str:
    """The run's one γ: an int or 'auto'."""
    return 'auto' if self.gamma == 'auto' else self.gamma[0]

  def identity(self) -> dict[str, Any]:
    """Every setting that changes a written line (JSON values)."""
    return {
      **self.reported(),
      'num_examples': self.num_examples,
      'gamma': self.gamma_value,
      'max_auto_gamma': self.max_auto_gamma,
      'input_file': self.input_file,
      'input_field': self.input_field,
      'id_field': self.id_field,
      'bad_lines': self.bad_lines,
      'tree': self.tree,
      'mode': self.mode,
      'provenance': self.provenance,
      'output_ids': self.output_ids,
      'checkpoint_period': self.checkpoint_period,
      'page_examples': self.page_examples,
    }

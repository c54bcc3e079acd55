"""What an eval run decodes and how: `EvalSettings`, checked when built.

`EvalSettings` holds every setting of `run.evaluate` except the models and
where the files go. It is a frozen dataclass whose `__post_init__` checks
and normalizes every field, so a bad value is a `ValueError` naming the
field (`EvalSettings.batch_size must be an int >= 1, got 0`) raised when the
settings are built: before a model loads, a task is read or a decode loop
compiles. `gin/runs/eval.gin` builds it from the run's macros
(`spec_eval.evaluate.settings = @spec_eval.EvalSettings()`), and
`compare.compare` derives one per combination with `dataclasses.replace`
(which checks again).
"""

import dataclasses
import os
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np

from spec_decode.data import tasks as tasks_lib
from spec_decode.t5 import vocab as vocab_lib

_INTS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)


def parse_gamma(gamma: Any) -> list[int] | str:
  """`'auto'`, or a non-empty list of distinct ints >= 1 (order kept)."""
  if isinstance(gamma, str) and gamma.strip().lower() == 'auto':
    return 'auto'
  try:
    if isinstance(gamma, str):
      values = gamma.replace(',', ' ').split()
    elif isinstance(gamma, _INTS) and not isinstance(gamma, bool):
      values = [gamma]
    else:
      values = gamma
    gammas = list(dict.fromkeys(int(g) for g in values))
  except (TypeError, ValueError):
    gammas = []
  if not gammas or min(gammas) < 1:
    raise ValueError(
      f"gamma must be an int >= 1, a list of them or 'auto', got {gamma!r}"
    )
  return gammas


def _fail(name: str, what: str, value: Any) -> ValueError:
  return ValueError(f'EvalSettings.{name} must be {what}, got {value!r}')


def _int(name: str, value: Any, low: int | None, none_ok: bool = False) -> Any:
  if value is None and none_ok:
    return None
  if (
    isinstance(value, bool)
    or not isinstance(value, _INTS)
    or (low is not None and value < low)
  ):
    what = 'an int' + (f' >= {low}' if low is not None else '')
    raise _fail(name, what + (' or None' if none_ok else ''), value)
  return int(value)


def _real(
  name: str, value: Any, ok: Callable[[float], bool], what: str
) -> float:
  if (
    isinstance(value, bool)
    or not isinstance(value, _REALS)
    or not ok(float(value))
  ):
    raise _fail(name, what, value)
  return float(value)


def _text(name: str, value: Any, none_ok: bool = False) -> Any:
  if value is None and none_ok:
    return None
  if not isinstance(value, str) or not value:
    what = 'a non-empty string' + (' or None' if none_ok else '')
    raise _fail(name, what, value)
  return value


def _path(name: str, value: Any, also: tuple[type, ...] = ()) -> Any:
  if value is None or isinstance(value, (str, os.PathLike, *also)):
    return value
  kinds = ', '.join(['None', 'a path', *(c.__name__ for c in also)])
  raise _fail(name, f'one of: {kinds}', value)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """The settings of an eval run (`run.evaluate`); checked when built.

  Integer fields accept ints (not bools); number fields ints or floats,
  stored as floats.

  Attributes:
    task: a `data.tasks.task_names()` name.
    split: the split to read (`train`, `validation`, `test`).
    num_examples: the first this many examples (None: the whole split).
    batch_size: rows per decode (the paper: 1).
    gamma: an int, a list of ints (a sweep: every γ is decoded; the
      top-level results describe the first) or `'auto'` (calibrated);
      stored as a tuple of distinct ints or `'auto'` (`parse_gamma`).
    temperature: >= 0; 0 is greedy.
    top_k: >= 0; 0 keeps every id.
    top_p: in (0, 1]; 1.0 keeps every id.
    max_decode_len: output tokens per example at most (EOS included).
    max_input_len: inputs are cut to this many tokens (EOS included).
    seed: example i is decoded with seed `seed + i`, plainly and
      speculatively alike.
    lenience: in (0, 1]; 1.0 is Algorithm 1. Below 1 (appendix A.5) the
      output is no longer the target's distribution, and the run is
      labelled not exact.
    dynamic_gamma: 0 (fixed γ; None and False mean 0) or a draft-confidence
      threshold in (0, 1): γ is then the most tokens an iteration proposes
      (see `sd.generate`); exact either way.
    vocabulary: a `Vocabulary` or a sentencepiece `.model` path (relative
      paths are also looked up in the repository), for a target that
      carries none; None uses the target's.
    data_dir: the task's data directory (None: its default).
    target_name: label of the target in the report (None: its size).
    draft_name: label of the draft in the report.
    timing_repeats: repeats of each step-time measurement (medians).
    calibration_batches: batches decoded by the auto-γ calibration.
    calibration_gamma: γ of the calibration decodes.
    max_auto_gamma: the largest γ auto-γ considers.
  """

  task: str
  split: str = 'test'
  num_examples: int | None = 100
  batch_size: int = 1
  gamma: int | Sequence[int] | str = 4
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  max_decode_len: int = 64
  max_input_len: int = 512
  seed: int = 0
  lenience: float = 1.0
  dynamic_gamma: float = 0.0
  vocabulary: Any = None
  data_dir: str | None = None
  target_name: str | None = None
  draft_name: str | None = None
  timing_repeats: int = 5
  calibration_batches: int = 4
  calibration_gamma: int = 4
  max_auto_gamma: int = 8

  def __post_init__(self):
    if self.task not in tasks_lib.task_names():
      raise _fail('task', f'one of {tasks_lib.task_names()}', self.task)
    try:
      gamma = parse_gamma(self.gamma)
    except ValueError as e:
      raise ValueError(f'EvalSettings.{e}') from None
    dynamic_gamma = self.dynamic_gamma
    if dynamic_gamma is None or dynamic_gamma is False:
      dynamic_gamma = 0.0
    values = {
      'split': _text('split', self.split),
      'num_examples': _int('num_examples', self.num_examples, 1, True),
      'batch_size': _int('batch_size', self.batch_size, 1),
      'gamma': gamma if gamma == 'auto' else tuple(gamma),
      'temperature': _real(
        'temperature', self.temperature, lambda x: x >= 0, 'a number >= 0'
      ),
      'top_k': _int('top_k', self.top_k, 0),
      'top_p': _real(
        'top_p', self.top_p, lambda x: 0 < x <= 1, 'a number in (0, 1]'
      ),
      'max_decode_len': _int('max_decode_len', self.max_decode_len, 1),
      'max_input_len': _int('max_input_len', self.max_input_len, 1),
      'seed': _int('seed', self.seed, None),
      'lenience': _real(
        'lenience', self.lenience, lambda x: 0 < x <= 1, 'a number in (0, 1]'
      ),
      'dynamic_gamma': _real(
        'dynamic_gamma',
        dynamic_gamma,
        lambda x: 0 <= x < 1,
        '0 (off) or a threshold in (0, 1)',
      ),
      'vocabulary': _path(
        'vocabulary', self.vocabulary, (vocab_lib.Vocabulary,)
      ),
      'data_dir': _path('data_dir', self.data_dir),
      'target_name': _text('target_name', self.target_name, True),
      'draft_name': _text('draft_name', self.draft_name, True),
      'timing_repeats': _int('timing_repeats', self.timing_repeats, 1),
      'calibration_batches': _int(
        'calibration_batches', self.calibration_batches, 1
      ),
      'calibration_gamma': _int('calibration_gamma', self.calibration_gamma, 1),
      'max_auto_gamma': _int('max_auto_gamma', self.max_auto_gamma, 1),
    }
    for name, value in values.items():
      object.__setattr__(self, name, value)

  @property
  def exact_algorithm(self) -> bool:
    """Whether the run is Algorithm 1 (not lenient)."""
    return self.lenience == 1.0

  def sampling(self) -> dict[str, Any]:
    """`temperature`, `top_k` and `top_p` (the `sd.Sampler` arguments)."""
    return {
      'temperature': self.temperature,
      'top_k': self.top_k,
      'top_p': self.top_p,
    }

  def reported(self) -> dict[str, Any]:
    """The settings results.json repeats (JSON values)."""
    return {
      'task': self.task,
      'split': self.split,
      'batch_size': self.batch_size,
      **self.sampling(),
      'max_decode_len': self.max_decode_len,
      'max_input_len': self.max_input_len,
      'seed': self.seed,
      'lenience': self.lenience,
      'dynamic_gamma': self.dynamic_gamma,
    }

"""What an eval run decodes and how: `EvalSettings`, checked when built.

`EvalSettings` holds every setting of `run.evaluate` except the models and
where the files go. Its task is a built-in one (`data/tasks.py`) or any
name in seqio's TaskRegistry or MixtureRegistry (`data/seqio_data.py`
says which registry serves a name); T5X's `DatasetConfig.module`
(`mixture_or_task_module`) is imported first, as T5X does.

It is a frozen dataclass whose `__post_init__` checks and normalizes every
field, so a bad value is a `ValueError` naming the field
(`EvalSettings.batch_size must be an int >= 1, got 0`) raised when the
settings are built: before a model loads, a task is read or a decode loop
compiles. What the decode itself takes (γ, sampling, lengths, lenience,
dynamic γ) goes through `sd.generate`'s own checks
(`chain.generation.decode_settings`, at every γ of a sweep), so its error
is generate's text after `EvalSettings.`. `gin/runs/eval.gin` builds it
from the run's macros
(`spec_eval.evaluate.settings = @spec_eval.EvalSettings()`), and
`compare.compare` derives one per combination with `dataclasses.replace`
(which checks again).
"""

import dataclasses
import importlib
import math
import os
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from spec_decode.chain import generation
from spec_decode.core import inputs
from spec_decode.data import seqio_data
from spec_decode.t5 import vocab as vocab_lib

_INTS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)


def parse_gamma(gamma: Any) -> list[int] | str:
  """`'auto'`, or a non-empty list of distinct ints >= 1 (order kept): one
  γ as every entry point reads it (`core.inputs.parse_gamma`, with its
  error text), or a sweep (a list, or a text of them separated by commas
  or spaces) of such ints."""
  if isinstance(gamma, str):
    values = gamma.replace(',', ' ').split()
    if len(values) <= 1:  # One γ, 'auto' included ('' is refused there).
      values = [gamma]
  elif isinstance(gamma, (list, tuple)):
    values = list(gamma)
  else:
    values = [gamma]
  if not values:
    raise ValueError(f'gamma must be a non-empty list, got {gamma!r}')
  parsed = [inputs.parse_gamma(g) for g in values]
  if len(parsed) == 1 and parsed[0] == inputs.AUTO:
    return inputs.AUTO
  if inputs.AUTO in parsed:
    raise ValueError(f"gamma: 'auto' cannot be part of a sweep, got {gamma!r}")
  return list(dict.fromkeys(parsed))


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


def _modules(value: Any) -> tuple[str, ...]:
  """T5X's `DatasetConfig.module`: imported (it registers seqio tasks)."""
  names = [value] if isinstance(value, str) else value
  if names is None:
    return ()
  if not isinstance(names, Sequence) or not all(
    isinstance(n, str) and n for n in names
  ):
    raise _fail(
      'mixture_or_task_module', 'a module name, a list of them or None', value
    )
  for name in names:
    try:
      importlib.import_module(name)
    except Exception as e:  # The user's module may fail in any way.
      raise ValueError(
        'EvalSettings.mixture_or_task_module must be importable: importing '
        f'{name!r} failed ({type(e).__name__}: {e})'
      ) from e
  return tuple(names)


def _seqio_vocabulary(value: Any) -> Any:
  """Registers spec_decode's seqio tasks again with this vocabulary."""
  if value is None:
    return None
  if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
    raise _fail('seqio_vocabulary', 'a sentencepiece .model path', value)
  value = os.fspath(value)
  if not seqio_data.installed():
    raise ValueError(
      "EvalSettings.seqio_vocabulary needs seqio: pip install -e '.[seqio]'"
    )
  from spec_decode.data import seqio_tasks  # pylint: disable=g-import-not-at-top

  try:
    seqio_tasks.register(vocabulary=value)
  except (OSError, ValueError) as e:
    raise ValueError(f'EvalSettings.seqio_vocabulary: {e}') from None
  return value


def _task(value: Any) -> str:
  """A name one of the registries serves; a seqio task's vocabulary must be
  readable (a `gs://` one offline is not)."""
  if value is None:
    raise ValueError(
      'EvalSettings.task must be a task name (gin: MIXTURE_OR_TASK_NAME, or '
      'its alias TASK), got None'
    )
  name = _text('task', value)
  source = seqio_data.lookup(name)
  if source is None:
    raise ValueError(
      'EvalSettings.task must be a task name: '
      + seqio_data.unknown_task_message(name)
    )
  if source == seqio_data.SEQIO:
    try:
      seqio_data.SeqioTask(name).check_readable()
    except (OSError, ValueError) as e:
      raise ValueError(f'EvalSettings.task {name!r}: {e}') from None
  return name


def _max_decode_len(value: Any) -> int:
  if value is None:
    raise ValueError(
      'EvalSettings.max_decode_len must be an int >= 1 (gin: MAX_DECODE_LEN '
      "or TASK_FEATURE_LENGTHS['targets']), got None"
    )
  return _int('max_decode_len', value, 1)


def _feature_lengths(value: Any) -> dict[str, int] | None:
  """T5X's `{'inputs': N, 'targets': M}` (either key may be left out)."""
  if value is None:
    return None
  what = "a dict {'inputs': int >= 1, 'targets': int >= 1} or None"
  if not isinstance(value, Mapping) or not value:
    raise _fail('task_feature_lengths', what, value)
  out = {}
  for key, n in value.items():
    if key not in ('inputs', 'targets') or isinstance(n, bool):
      raise _fail('task_feature_lengths', what, value)
    if not isinstance(n, _INTS) or n < 1:
      raise _fail('task_feature_lengths', what, value)
    out[key] = int(n)
  return out


DECODE_METHODS = ('greedy', 'sample', 'beam')


def _decode_method(value: Any, temperature: float, top_k, top_p) -> str:
  """The decode method, checked against the sampling settings."""
  if value is None:
    return 'greedy' if temperature == 0 else 'sample'
  if value not in DECODE_METHODS:
    raise _fail('decode_method', f'one of {DECODE_METHODS} or None', value)
  if value == 'sample' and temperature == 0:
    raise ValueError(
      "EvalSettings.decode_method 'sample' needs a temperature > 0 "
      '(TEMPERATURE), got 0'
    )
  if value != 'sample' and temperature != 0:
    raise ValueError(
      f'EvalSettings.decode_method {value!r} needs temperature 0 '
      f'(TEMPERATURE), got {temperature!r}'
    )
  if value == 'beam' and (top_k != 0 or top_p != 1.0):
    raise ValueError(
      "EvalSettings.decode_method 'beam' takes no top_k/top_p, got "
      f'top_k={top_k!r}, top_p={top_p!r}'
    )
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
    task: a built-in task (`data.tasks.task_names()`) or a seqio task or
      mixture; `data.seqio_data.lookup` says which registry serves a name
      (seqio's first once seqio is imported, e.g. by
      `mixture_or_task_module`). An unknown name is an error listing both
      registries.
    split: the split to read (`train`, `validation`, `test`).
    num_examples: the first this many examples (None: the whole split); of
      each subtask of a seqio mixture.
    batch_size: rows per decode (the paper: 1).
    gamma: an int, a list of ints (a sweep: every γ is decoded; the
      top-level results describe the first) or `'auto'` (the in-loop
      finish-time policy of `sd.generate(gamma='auto')`: each iteration picks
      its γ in {0, ..., max_auto_gamma}); stored as a tuple of distinct
      ints or `'auto'` (`parse_gamma`).
    temperature: >= 0; 0 is greedy.
    top_k: >= 0; 0 keeps every id.
    top_p: in (0, 1]; 1.0 keeps every id.
    decode_method: `'greedy'`, `'sample'` or `'beam'` (T5X's beam search,
      `sd.beam_search`); None (the default) is `'greedy'` at temperature 0
      and `'sample'` above. `'greedy'` needs temperature 0, `'sample'` a
      temperature > 0, `'beam'` temperature 0 and no top-k/top-p (beam
      search is deterministic).
    num_beams: beams of `'beam'` (T5X's `num_decodes`), >= 1.
    beam_alpha: brevity-penalty exponent of `'beam'`, >= 0 (T5X's 0.6).
    draft_beams: speculative `'beam'`: nodes per level of a beam's draft
      tree that get children (`sd.beam_search(draft_beams=)`); None: the
      default.
    draft_children: speculative `'beam'`: children per such node; None:
      the default.
    max_decode_len: output tokens per example at most (EOS included).
    max_input_len: inputs are cut to this many tokens (EOS included).
    task_feature_lengths: T5X's `{'inputs': N, 'targets': M}`; a key it
      has replaces `max_input_len` (N) or `max_decode_len` (M), and both
      are a seqio task's `sequence_length`.
    mixture_or_task_module: T5X's `MIXTURE_OR_TASK_MODULE`: a module (or a
      list) imported before the task is looked up; it registers the user's
      seqio tasks.
    seqio_vocabulary: a sentencepiece `.model` for spec_decode's own seqio
      tasks (`data/seqio_tasks.py`, which this registers again with it);
      None leaves them as registered (`$SPEC_DECODE_SEQIO_VOCABULARY`, else
      T5's `gs://` vocabulary).
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
    data_dir: a built-in task's data directory (Debian TSVs, TFDS), or the
      TFDS data directory of seqio tasks (None: the default).
    target_name: label of the target in the report (None: its size).
    draft_name: label of the draft in the report.
    timing_repeats: repeats of each step-time measurement timed after the
      decodes (`policy.timing.measure`: beam search, records of an older run).
    timing_rounds: rounds of each batch's timed work (`eval/rounds.py`):
      its plain, speculative and draft-alone decodes and its cost probes
      run once per round, in rotating order; the speedup is the median of
      the rounds' ratios, with their spread. Each round adds about one
      run's decoding time.
    max_auto_gamma: the largest γ `gamma='auto'` considers (>= 1); with
      `decode_method='beam'`, the draft-tree depth of the speculative calls
      (each iteration is a plain beam step or such a call; set it to 2,
      `sd.beam_search`'s default: the eval's 8 builds deep trees).
  """

  task: str | None
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
  timing_rounds: int = 3
  max_auto_gamma: int = 8
  task_feature_lengths: dict[str, int] | None = None
  mixture_or_task_module: str | Sequence[str] | None = None
  seqio_vocabulary: str | None = None
  decode_method: str | None = None
  num_beams: int = 4
  beam_alpha: float = 0.6
  draft_beams: int | None = None
  draft_children: int | None = None

  def __post_init__(self):
    # In T5X's order: the module registers tasks, then the task is found.
    modules = _modules(self.mixture_or_task_module)
    seqio_vocabulary = _seqio_vocabulary(self.seqio_vocabulary)
    task = self.checked_task(self.task)
    lengths = _feature_lengths(self.task_feature_lengths) or {}
    dynamic_gamma = self.dynamic_gamma
    if dynamic_gamma is None or dynamic_gamma is False:
      dynamic_gamma = 0.0
    # 0 is off here (a float field), not a threshold `generate` refuses.
    dynamic_gamma = _real(
      'dynamic_gamma',
      dynamic_gamma,
      lambda x: 0 <= x < 1,
      '0 (off) or a threshold in (0, 1)',
    )
    max_decode_len = lengths.get('targets') or _max_decode_len(
      self.max_decode_len
    )
    try:
      gamma = parse_gamma(self.gamma)
      # `generate`'s own checks, for every γ the run decodes at: a value
      # it would refuse is refused here, in its words, before a model
      # loads.
      for g in [gamma] if gamma == inputs.AUTO else gamma:
        generation.decode_settings(
          speculative=True,
          gamma=g,
          temperature=self.temperature,
          top_k=self.top_k,
          top_p=self.top_p,
          max_decode_len=max_decode_len,
          lenience=self.lenience,
          dynamic_gamma=dynamic_gamma or False,
          max_auto_gamma=self.max_auto_gamma,
        )
    except ValueError as e:
      raise ValueError(f'EvalSettings.{e}') from None
    values = {
      'mixture_or_task_module': modules,
      'seqio_vocabulary': seqio_vocabulary,
      'task': task,
      'task_feature_lengths': lengths or None,
      'split': _text('split', self.split),
      'num_examples': _int('num_examples', self.num_examples, 1, True),
      'batch_size': _int('batch_size', self.batch_size, 1),
      'gamma': gamma if gamma == 'auto' else tuple(gamma),
      'temperature': float(self.temperature),
      'top_k': int(self.top_k),
      'top_p': float(self.top_p),
      'max_decode_len': int(max_decode_len),
      'max_input_len': lengths.get('inputs')
      or _int('max_input_len', self.max_input_len, 1),
      'seed': _int('seed', self.seed, None),
      'lenience': float(self.lenience),
      'dynamic_gamma': dynamic_gamma,
      'vocabulary': _path(
        'vocabulary', self.vocabulary, (vocab_lib.Vocabulary,)
      ),
      'data_dir': _path('data_dir', self.data_dir),
      'target_name': _text('target_name', self.target_name, True),
      'draft_name': _text('draft_name', self.draft_name, True),
      'timing_repeats': _int('timing_repeats', self.timing_repeats, 1),
      'timing_rounds': _int('timing_rounds', self.timing_rounds, 1),
      'max_auto_gamma': _int('max_auto_gamma', self.max_auto_gamma, 1),
    }
    # Checked here, resolved by `method`: the field keeps what was given
    # (None: from the temperature), so `dataclasses.replace(s,
    # temperature=...)` of a run that named no method stays valid.
    _decode_method(
      self.decode_method,
      values['temperature'],
      values['top_k'],
      values['top_p'],
    )
    values['num_beams'] = _int('num_beams', self.num_beams, 1)
    for name in ('draft_beams', 'draft_children'):
      values[name] = _int(name, getattr(self, name), 1, none_ok=True)
    values['beam_alpha'] = _real(
      'beam_alpha',
      self.beam_alpha,
      lambda x: 0 <= x < math.inf,
      'a finite number >= 0',
    )
    for name, value in values.items():
      object.__setattr__(self, name, value)

  def checked_task(self, value: Any) -> str | None:
    """The `task` field, checked (a name one of the registries serves).

    A subclass whose examples may come from elsewhere (the infer run's
    input file) overrides it to allow None.
    """
    return _task(value)

  @property
  def method(self) -> str:
    """The decode method: `decode_method`, or from the temperature."""
    return _decode_method(
      self.decode_method, self.temperature, self.top_k, self.top_p
    )

  @property
  def gammas(self) -> tuple[int | str, ...]:
    """The γs the run decodes at: the sweep, or `('auto',)`."""
    return (inputs.AUTO,) if self.gamma == inputs.AUTO else self.gamma

  @property
  def beam(self) -> bool:
    """Whether the run decodes with beam search."""
    return self.method == 'beam'

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
      'decode_method': self.method,
      **(
        {
          'num_beams': self.num_beams,
          'beam_alpha': self.beam_alpha,
          'draft_beams': self.draft_beams,
          'draft_children': self.draft_children,
        }
        if self.beam
        else {}
      ),
    }

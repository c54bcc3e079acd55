"""Any seqio task or mixture as eval data, read and scored as T5X does.

Nothing here imports seqio or TensorFlow until a seqio task is used:
`installed` only looks for the package, and `lookup` of a built-in name
imports nothing unless seqio is imported already.

* `lookup(name)`: which registry serves a task name. When seqio has been
  imported (by T5X's `MIXTURE_OR_TASK_MODULE`, an `import` in a gin file, or
  the caller's code), its `TaskRegistry` and `MixtureRegistry` come first:
  the user registered those names. Then ours (`tasks.task_names()`), then
  seqio's when it is installed (imported for the look-up).
* `unknown_task_message(name)`: the names of both registries.
* `SeqioTask(name)`: a task, or each subtask of a mixture (as T5X's
  evaluator and infer treat mixtures): examples from `get_dataset(
  sequence_length=..., split=..., shuffle=False)` with the task's
  preprocessors; the check that the task tokenizes with the model's
  vocabulary; outputs decoded with the task's output vocabulary; metrics as
  seqio's `Evaluator` computes them (targets and predictions through the
  task's `postprocess_fn`, then its `metric_fns` and metric objects).

Reading a `gs://` vocabulary needs network access; without it the error
says how to point the task at a local sentencepiece file.
"""

import dataclasses
import difflib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np

from spec_decode.data import tasks as tasks_lib
from spec_decode.t5 import byte_vocab
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.byte_vocab import ByteVocabulary

BUILTIN = 'builtin'
SEQIO = 'seqio'
# Names listed in full in an unknown-task error; longer lists are cut.
_MAX_LISTED = 40


def installed() -> bool:
  """Whether seqio can be imported (nothing is imported)."""
  return importlib.util.find_spec('seqio') is not None


def loaded() -> bool:
  """Whether seqio has been imported in this process."""
  return 'seqio' in sys.modules


def _seqio():
  """seqio, with TensorFlow kept off the accelerators (JAX owns them, as in
  T5X's launchers)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    tf.config.set_visible_devices([], 'GPU')
  except (RuntimeError, ValueError):  # TensorFlow already placed something.
    pass
  import seqio  # pylint: disable=g-import-not-at-top

  return seqio


def set_tfds_data_dir(data_dir: str) -> None:
  """Where seqio's TFDS sources read (T5X's `--tfds_data_dir`)."""
  _seqio().set_tfds_data_dir_override(data_dir)


def registry_names() -> list[str]:
  """The names in seqio's TaskRegistry and MixtureRegistry (imports seqio)."""
  seqio = _seqio()
  return sorted(
    set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())
  )


def _registered(name: str) -> bool:
  seqio = _seqio()
  return name in seqio.TaskRegistry.names() or (
    name in seqio.MixtureRegistry.names()
  )


def lookup(name: str) -> str | None:
  """`SEQIO`, `BUILTIN` or None (unknown); see the module docstring."""
  if loaded() and _registered(name):
    return SEQIO
  if name in tasks_lib.task_names():
    return BUILTIN
  if not loaded() and installed() and _registered(name):
    return SEQIO
  return None


def _listing(names: Sequence[str]) -> str:
  if len(names) <= _MAX_LISTED:
    return ', '.join(names) or '(none)'
  return (
    ', '.join(names[:_MAX_LISTED]) + f', ... ({len(names) - _MAX_LISTED} more)'
  )


def unknown_task_message(name: str) -> str:
  """Why `name` is not a task, with the names of both registries."""
  ours = tasks_lib.task_names()
  lines = [f'unknown task {name!r}.', f'spec_decode tasks: {_listing(ours)}.']
  theirs: list[str] = []
  if installed():
    theirs = registry_names()
    lines.append(
      f'seqio TaskRegistry and MixtureRegistry: {_listing(theirs)}. '
      'Register your own with MIXTURE_OR_TASK_MODULE (the module that '
      'registers them), as in T5X.'
    )
  else:
    lines.append(
      "seqio is not installed (pip install -e '.[seqio]'); with it, any "
      'seqio task or mixture name is a task.'
    )
  close = difflib.get_close_matches(name, ours + theirs, n=3)
  if close:
    lines.append(f'Did you mean: {", ".join(close)}?')
  return ' '.join(lines)


# ------------------------------------------------------------ vocabularies.


def read_vocabulary_file(path: str) -> bytes:
  """The bytes of a sentencepiece model, local or remote (`gs://`).

  Raises:
    ValueError: a remote file that cannot be read (no network, no access),
      with how to use a local copy instead.
    FileNotFoundError: a local file that does not exist.
  """
  if '://' not in path:
    if not os.path.isfile(path):
      raise FileNotFoundError(f'sentencepiece model not found: {path}')
    with open(path, 'rb') as f:
      return f.read()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    with tf.io.gfile.GFile(path, 'rb') as f:
      return f.read()
  except tf.errors.OpError as e:
    first_line = str(e).strip().splitlines()[0]
    raise ValueError(
      f'cannot read the vocabulary {path} ({type(e).__name__}: '
      f'{first_line}). Without network access, copy it (gsutil cp {path} '
      '/local/spiece.model) and point the task at the copy: for '
      "spec_decode's own seqio tasks set SPEC_DECODE_SEQIO_VOCABULARY="
      '/local/spiece.model or --gin.SEQIO_VOCABULARY=/local/spiece.model; '
      'for your task, pass the local path to seqio.SentencePieceVocabulary.'
    ) from None


def describe_vocabulary(vocabulary: Any) -> str:
  """A seqio vocabulary in one line (file and extra ids when it has them)."""
  path = getattr(vocabulary, 'sentencepiece_model_file', None)
  if path is None:
    if _is_seqio_bytes(vocabulary):
      return f'seqio.ByteVocabulary(extra_ids={vocabulary.extra_ids})'
    return repr(vocabulary)
  return (
    f'{type(vocabulary).__name__}(file={path}, '
    f'extra_ids={vocabulary.extra_ids})'
  )


def vocabulary_differences(
  task_vocab: Any, model_vocab: vocab_lib.Vocabulary
) -> list[str]:
  """How a seqio vocabulary tokenizes differently from `model_vocab`.

  Byte vocabularies: see `_byte_differences`. Otherwise both are
  sentencepiece models plus extra ids; they agree when the model
  files have the same contents (wherever they lie), the extra ids are as
  many, numbered downwards from the top (T5's and seqio's default), and
  seqio overrides no normalizer setting.
  """
  seqio = _seqio()
  if _is_seqio_bytes(task_vocab) or isinstance(model_vocab, ByteVocabulary):
    return _byte_differences(task_vocab, model_vocab)
  if not isinstance(task_vocab, seqio.SentencePieceVocabulary):
    return [f"the task's is a {type(task_vocab).__name__}, not sentencepiece"]
  problems = []
  data = read_vocabulary_file(task_vocab.sentencepiece_model_file)
  if data != model_vocab.serialized:
    theirs = vocab_lib.Vocabulary(data, extra_ids=0).digest[:12]
    ours = vocab_lib.Vocabulary(model_vocab.serialized, extra_ids=0)
    problems.append(
      'different sentencepiece models (sha256 of the model file '
      f'{theirs} for the task, {ours.digest[:12]} for the model)'
    )
  if task_vocab.extra_ids != model_vocab.extra_ids:
    problems.append(
      f'{task_vocab.extra_ids} extra ids for the task, '
      f'{model_vocab.extra_ids} for the model'
    )
  # seqio keeps these two constructor arguments private; both change ids.
  if not getattr(task_vocab, '_reverse_extra_ids', True):
    problems.append('the task numbers its extra ids upwards')
  if getattr(task_vocab, '_normalizer_spec_overrides', None) is not None:
    problems.append('the task overrides the normalizer')
  return problems


def _is_seqio_bytes(vocab: Any) -> bool:
  seqio = sys.modules.get('seqio')
  return seqio is not None and isinstance(vocab, seqio.ByteVocabulary)


def _byte_differences(task_vocab: Any, model_vocab: Any) -> list[str]:
  """seqio's `ByteVocabulary` against ours (`t5/byte_vocab.py`).

  Bytes and special ids are the same in both; seqio never turns text into
  an extra id, so only its extra ids (the top ids, span corruption's
  sentinels) can differ. With seqio's numbering they must be as many (T5X's
  equality). An HF ByT5 model (transformers' numbering: `<extra_id_0>` =
  259 up, ids seqio's default of 0 extra ids never gives) agrees with a
  task without extra ids: the ByT5 checkpoints were trained with
  `seqio.ByteVocabulary()`.
  """
  task_bytes = _is_seqio_bytes(task_vocab)
  model_bytes = isinstance(model_vocab, ByteVocabulary)
  if not (task_bytes and model_bytes):
    task_kind = 'bytes' if task_bytes else type(task_vocab).__name__
    model_kind = 'bytes' if model_bytes else 'sentencepiece'
    return [f"the task's is {task_kind}, the model's {model_kind}"]
  k, m = task_vocab.extra_ids, model_vocab.extra_ids
  if model_vocab.sentinels == byte_vocab.HF:
    if k == 0:
      return []
    return [
      f'the task numbers its {k} extra ids down from id {258 + k}, the '
      "model's (transformers' ByT5Tokenizer) <extra_id_0> is 259 counting up"
    ]
  if k != m:
    return [f'{k} extra ids for the task, {m} for the model']
  return []


# ------------------------------------------------------------------ tasks.


@dataclasses.dataclass(frozen=True)
class Example:
  """One example of a seqio task, as `get_dataset` produced it.

  Attributes:
    task: the (sub)task it comes from.
    raw: the example's features (numpy), passed to `postprocess_fn`.
    inputs: the input text (`inputs_pretokenized`, else the decoded ids).
    targets: the target text (`targets_pretokenized`, else decoded).
    input_tokens: the encoder ids, cut to the input length.
    pretokenized: the `*_pretokenized` features as text (T5X's infer writes
      them as `inputs`).
  """

  task: str
  raw: dict[str, Any]
  inputs: str
  targets: str
  input_tokens: list[int]
  pretokenized: dict[str, Any]


def _text(value: Any) -> Any:
  if isinstance(value, bytes):
    return value.decode('utf-8')
  if isinstance(value, np.ndarray):
    return [_text(v) for v in value.tolist()]
  if isinstance(value, np.generic):
    return value.item()
  return value


def _numpy(element: Any) -> Any:
  """A dataset element's tensors as numpy (as `as_numpy_iterator` gives)."""
  if isinstance(element, dict):
    return {k: _numpy(v) for k, v in element.items()}
  return element.numpy()


def _number(value: Any) -> float | None:
  value = getattr(value, 'value', value)  # seqio.metrics.Scalar
  if isinstance(value, bool) or np.ndim(value) != 0:
    return None
  try:
    return float(value)
  except (TypeError, ValueError):
    return None


class SeqioTask:
  """A seqio task or mixture, read as T5X's evaluator and infer read it.

  Attributes:
    name: the registered name.
    tasks: the task, or the mixture's subtasks.
  """

  def __init__(self, name: str):
    seqio = _seqio()
    provider = seqio.get_mixture_or_task(name)
    self.name = name
    self.tasks = list(seqio.get_subtasks(provider))
    self._metrics = importlib.import_module('seqio.metrics')
    for task in self.tasks:
      if 'inputs' not in task.output_features:
        raise ValueError(
          f'seqio task {task.name!r} has no `inputs` feature (features: '
          f'{sorted(task.output_features)}); an encoder-decoder needs one'
        )

  @property
  def output_vocabulary(self) -> Any:
    return self.tasks[0].output_features['targets'].vocabulary

  def vocabularies(self) -> list[tuple[str, str, Any]]:
    """(task, feature, vocabulary) of every input and target feature."""
    return [
      (task.name, feature, task.output_features[feature].vocabulary)
      for task in self.tasks
      for feature in ('inputs', 'targets')
    ]

  def check_readable(self) -> None:
    """Reads every vocabulary file once (a `gs://` one offline fails)."""
    for _, _, vocab in self.vocabularies():
      path = getattr(vocab, 'sentencepiece_model_file', None)
      if path is not None:
        read_vocabulary_file(path)

  def model_vocabulary(self) -> vocab_lib.Vocabulary:
    """The task's output vocabulary as ours (for a model that has none)."""
    vocab = self.output_vocabulary
    if _is_seqio_bytes(vocab):
      return ByteVocabulary(extra_ids=vocab.extra_ids)
    path = getattr(vocab, 'sentencepiece_model_file', None)
    if path is None:
      raise ValueError(
        f'seqio task {self.name!r}: its vocabulary '
        f'{describe_vocabulary(vocab)} is not sentencepiece, and the model '
        'has none'
      )
    return vocab_lib.Vocabulary(
      read_vocabulary_file(path), extra_ids=vocab.extra_ids, name=path
    )

  def check_vocabulary(self, model_vocab: vocab_lib.Vocabulary) -> None:
    """Raises ValueError, naming both, when the task's vocabulary (inputs
    or targets) is not the model's."""
    for task, feature, vocab in self.vocabularies():
      problems = vocabulary_differences(vocab, model_vocab)
      if problems:
        raise ValueError(
          f'seqio task {task!r}: its {feature} vocabulary '
          f"{describe_vocabulary(vocab)} is not the model's "
          f'{model_vocab!r}: {"; ".join(problems)}. The task must tokenize '
          "with the model's vocabulary (T5X's verify_matching_vocabs)."
        )

  def read(
    self, split: str, lengths: dict[str, int], limit: int | None
  ) -> list[Example]:
    """The first `limit` examples of `split` of each (sub)task, in order
    (`read_share` with every example kept)."""
    return [ex for _, ex in self.read_share(split, lengths, limit)]

  def read_share(
    self,
    split: str,
    lengths: dict[str, int],
    limit: int | None,
    keep: Callable[[str, int], bool] | None = None,
  ) -> list[tuple[str, Example | None]]:
    """The first `limit` examples of `split` of each (sub)task, in order,
    converted where `keep` says so.

    Args:
      split: the split; mixture subtasks without it are skipped, as T5X's
        evaluator skips them.
      lengths: `{'inputs': N, 'targets': M}`, the `sequence_length` of
        `get_dataset`; encoder ids are also cut to N (T5X's feature
        converter does).
      limit: examples per (sub)task (None: all).
      keep: `keep(subtask, position)`, asked in order for each example:
        whether to convert it (a process reads its share of a multi-process
        run); None: all.

    Returns:
      `(subtask, example)` in order; the example is None where `keep` said
      no (it went through the preprocessors, nothing else).
    """
    with_split = [t for t in self.tasks if split in t.splits]
    if not with_split:
      splits = sorted({s for t in self.tasks for s in t.splits})
      raise ValueError(
        f'seqio task {self.name!r} has no split {split!r}; its splits: '
        f'{", ".join(splits)}'
      )
    out = []
    for task in with_split:
      ds = task.get_dataset(
        sequence_length=dict(lengths),
        split=split,
        shuffle=False,
        num_epochs=1,
        use_cached=False,
      )
      if limit is not None:
        ds = ds.take(limit)
      features = task.output_features
      for position, element in enumerate(ds):
        if keep is not None and not keep(task.name, position):
          out.append((task.name, None))
          continue
        raw = _numpy(element)
        tokens = [int(t) for t in raw['inputs'][: lengths['inputs']]]
        pretokenized = {
          k: _text(v) for k, v in raw.items() if k.endswith('_pretokenized')
        }
        inputs = pretokenized.get('inputs_pretokenized')
        targets = pretokenized.get('targets_pretokenized')
        out.append(
          (
            task.name,
            Example(
              task=task.name,
              raw=raw,
              inputs=(
                inputs
                if isinstance(inputs, str)
                else features['inputs'].vocabulary.decode(tokens)
              ),
              targets=(
                targets
                if isinstance(targets, str)
                else features['targets'].vocabulary.decode(
                  [int(t) for t in raw['targets']]
                )
              ),
              input_tokens=tokens,
              pretokenized=pretokenized,
            ),
          )
        )
    return out

  def decode(self, tokens: Sequence[int]) -> str:
    """Output ids as text, with the task's output vocabulary."""
    return self.output_vocabulary.decode([int(t) for t in tokens])

  def _metrics_of(self, task: Any) -> list[tuple[str, Any]]:
    # `task.metric_objs` lists the task's metric objects, then one per
    # metric function (seqio's Task.metric_objs).
    objs = task.metric_objs
    fns = list(task.metric_fns)
    own = objs[: len(objs) - len(fns)]
    return [(type(m).__name__, m) for m in own] + [
      (getattr(f, '__name__', repr(f)), m)
      for f, m in zip(fns, objs[len(own) :], strict=True)
    ]

  def metric_names(self) -> list[str]:
    """The metric functions and objects of every (sub)task."""
    names = [n for task in self.tasks for n, _ in self._metrics_of(task)]
    return list(dict.fromkeys(names))

  def score(
    self, examples: Sequence[Example], predictions: Sequence[Sequence[int]]
  ) -> tuple[dict[str, float], list[str]]:
    """The task's metrics of `predictions` (output ids, one per example).

    As seqio's Evaluator: targets and decoded predictions go through the
    task's `postprocess_fn`, then every metric that scores predictions.
    Metrics of a mixture's subtasks are named `<subtask>/<metric>`.

    Returns:
      `{metric: value}` and notes on what was not reported (metrics that
      need model scores or auxiliary outputs, values that are not numbers).
    """
    if len(examples) != len(predictions):
      raise ValueError(
        f'{len(predictions)} predictions for {len(examples)} examples'
      )
    prediction_type = self._metrics.ModelOutputType.PREDICTION
    values: dict[str, float] = {}
    notes: list[str] = []
    for task in self.tasks:
      rows = [i for i, ex in enumerate(examples) if ex.task == task.name]
      if not rows:
        continue
      raw = [examples[i].raw for i in rows]
      width = max(1, max(len(predictions[i]) for i in rows))
      output = np.zeros((len(rows), width), np.int32)
      for r, i in enumerate(rows):
        output[r, : len(predictions[i])] = predictions[i]
      prefix = f'{task.name}/' if len(self.tasks) > 1 else ''
      for name, metric in self._metrics_of(task):
        if metric.model_output_type != prediction_type:
          notes.append(
            f'{prefix}{name}: not computed, it needs '
            f'{metric.model_output_type.name} model outputs'
          )
          continue
        instance = metric.from_model_output(
          raw, output, task.output_features, 'targets'
        )
        if isinstance(instance, self._metrics.CollectingMetric):
          result, _ = instance.actual_compute(
            raw, task.output_features, 'targets', None
          )
        else:
          result = instance.compute()
        for key, value in result.items():
          number = _number(value)
          if number is None:
            notes.append(
              f'{prefix}{key}: a {type(value).__name__}, not a number; '
              'not reported'
            )
          else:
            values[prefix + key] = number
    return values, notes

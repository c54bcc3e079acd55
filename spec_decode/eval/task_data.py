"""A task split as an eval run uses it: from our readers or from seqio.

`load(settings, vocabulary, extra)` returns a `TaskData`: the examples' text
(for examples.jsonl), their encoder ids, the ids of up to `extra` examples
after them (the auto-γ calibration), how output ids become text, how they
are scored, and the rows of T5X's infer jsonl.

Built-in tasks (`data/tasks.py`; no TensorFlow): `prefix + source` is
tokenized with the model's vocabulary (cut to max_input_len - 1 ids, then
EOS), outputs are decoded with it and scored with the task's BLEU or ROUGE.

seqio tasks and mixtures (`data/seqio_data.py`): examples come from
`get_dataset(sequence_length={'inputs': max_input_len, 'targets':
max_decode_len}, split=..., shuffle=False)` with the task's preprocessors
(`num_examples` per subtask of a mixture, as T5X's evaluator takes them);
encoder ids are the task's (cut to max_input_len); outputs are decoded with
the task's output vocabulary and scored by its `postprocess_fn` and
metrics. The task's vocabulary must be the model's (a model without one
uses the task's).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from spec_decode.data import quality as metrics_lib
from spec_decode.data import seqio_data
from spec_decode.data import tasks as tasks_lib
from spec_decode.eval import decoding
from spec_decode.eval import settings as settings_lib
from spec_decode.t5 import vocab as vocab_lib

# (output texts, output ids) -> ({metric: value}, notes on what is missing).
Scorer = Callable[
  [list[str], list[list[int]]], tuple[dict[str, float], list[str]]
]


@dataclasses.dataclass
class TaskData:
  """The examples of a run and what to do with its outputs.

  Attributes:
    source: `seqio_data.BUILTIN` or `seqio_data.SEQIO`.
    metric: what `score` reports (`bleu`, `rouge`, or the seqio metric
      functions' names).
    vocabulary: the model vocabulary the ids belong to.
    examples: `{'inputs', 'targets'}` text per example.
    token_lists: encoder ids per example (None: another process's).
    calibration_tokens: encoder ids of the examples after those.
    decode: output ids -> text.
    score: see `Scorer`.
    subtasks: the (sub)task of each example (T5X writes a file per task).
    pretokenized: per example, the `*_pretokenized` features T5X's infer
      writes as `inputs`.
  """

  source: str
  metric: str
  vocabulary: vocab_lib.Vocabulary
  examples: list[dict[str, str]]
  token_lists: list[list[int] | None]
  calibration_tokens: list[list[int] | None]
  decode: Callable[[list[int]], str]
  score: Scorer
  subtasks: list[str]
  pretokenized: list[dict[str, Any]]


def load(
  settings: settings_lib.EvalSettings,
  vocabulary: vocab_lib.Vocabulary | None,
  extra: int = 0,
  owner: Callable[[int], Callable[[int], bool]] | None = None,
) -> TaskData:
  """The settings' task split (see the module docstring).

  Args:
    settings: the run's settings (task, split, num_examples, lengths).
    vocabulary: the model's vocabulary (None: the model has none).
    extra: examples to read after the evaluated ones, for calibration.
    owner: in a multi-process run, `owner(n)` (n: the number of evaluated
      examples) is the predicate of the examples this process feeds
      (`hosts.Hosts.owner`); a built-in task's other examples are not
      tokenized (their `token_lists` entries are None). seqio tasks
      tokenize in their preprocessors, so every process has every id.

  Raises:
    ValueError: an unknown task, no vocabulary, a seqio task whose
      vocabulary is not the model's, an empty split.
  """
  source = seqio_data.lookup(settings.task)
  if source is None:
    raise ValueError(seqio_data.unknown_task_message(settings.task))
  if source == seqio_data.SEQIO:
    data = _seqio(settings, vocabulary, extra)
  else:
    data = _builtin(settings, vocabulary, extra, owner)
  if not data.examples:
    raise ValueError(f'{settings.task}/{settings.split} has no examples')
  return data


def _limit(settings: settings_lib.EvalSettings, extra: int) -> int | None:
  if settings.num_examples is None:
    return None
  return settings.num_examples + extra


def _builtin(
  s: settings_lib.EvalSettings,
  vocab: vocab_lib.Vocabulary | None,
  extra: int,
  owner: Callable[[int], Callable[[int], bool]] | None,
) -> TaskData:
  if vocab is None:
    raise ValueError(
      'the target has no vocabulary; set EvalSettings.vocabulary'
    )
  task = tasks_lib.get_task(s.task, s.data_dir)
  exs = list(tasks_lib.examples(task, s.split, limit=_limit(s, extra)))
  n = len(exs) if s.num_examples is None else min(s.num_examples, len(exs))
  owns = owner(n) if owner is not None else (lambda i: True)
  tokens = [
    decoding.tokenize(vocab, [ex], s.max_input_len)[0] if owns(i) else None
    for i, ex in enumerate(exs)
  ]
  references = [ex['targets'] for ex in exs[:n]]

  def score(texts, _):
    return metrics_lib.compute(task.metric, texts, references), []

  return TaskData(
    source=seqio_data.BUILTIN,
    metric=task.metric,
    vocabulary=vocab,
    examples=exs[:n],
    token_lists=tokens[:n],
    calibration_tokens=tokens[n:],
    decode=vocab.decode,
    score=score,
    subtasks=[s.task] * n,
    pretokenized=[
      {
        'inputs_pretokenized': ex['inputs'],
        'targets_pretokenized': ex['targets'],
      }
      for ex in exs[:n]
    ],
  )


def _seqio(
  s: settings_lib.EvalSettings,
  vocab: vocab_lib.Vocabulary | None,
  extra: int,
) -> TaskData:
  if s.data_dir:
    seqio_data.set_tfds_data_dir(s.data_dir)
  task = seqio_data.SeqioTask(s.task)
  if vocab is None:
    vocab = task.model_vocabulary()
  task.check_vocabulary(vocab)
  lengths = {'inputs': s.max_input_len, 'targets': s.max_decode_len}
  everything = task.read(s.split, lengths, _limit(s, extra))
  # The first num_examples of each (sub)task are evaluated; the rest of
  # what was read calibrates auto γ.
  per_task: dict[str, int] = {}
  exs, rest = [], []
  for ex in everything:
    per_task[ex.task] = per_task.get(ex.task, 0) + 1
    if s.num_examples is None or per_task[ex.task] <= s.num_examples:
      exs.append(ex)
    else:
      rest.append(ex)

  def score(_, token_lists):
    return task.score(exs, token_lists)

  return TaskData(
    source=seqio_data.SEQIO,
    metric=', '.join(task.metric_names()) or '(no metrics)',
    vocabulary=vocab,
    examples=[{'inputs': ex.inputs, 'targets': ex.targets} for ex in exs],
    token_lists=[ex.input_tokens for ex in exs],
    calibration_tokens=[ex.input_tokens for ex in rest],
    decode=task.decode,
    score=score,
    subtasks=[ex.task for ex in exs],
    pretokenized=[ex.pretokenized for ex in exs],
  )

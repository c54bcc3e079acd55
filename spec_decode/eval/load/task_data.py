"""A task split as an eval run uses it: from our readers or from seqio.

`load(settings, vocabulary)` returns a `TaskData`: the examples' text (for
examples.jsonl), their encoder ids, how output ids become text, how they
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

In a multi-process run `owns(i)` (`hosts.Hosts.owns`) names this process's
share: only those examples are kept, tokenized and, for seqio, converted
from TensorFlow (the others are None). The split is still iterated in full
(a TSV's lines are scanned; a seqio task's preprocessors run on every
example, as `tf.data.Dataset.shard` would): the share is taken after the
preprocessors, so that the examples, their order and the first
`num_examples` are those of a single process and the results are the same.
"""

import dataclasses
import itertools
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
    examples: per example `{'inputs', 'targets'}` (text); None: another
      process's (until `hosts.Hosts.gather_examples` fills the writer's).
    features: per example (None likewise) `'subtask'` (T5X writes a file
      per task), `'pretokenized'` (the `*_pretokenized` features T5X's
      infer writes as `inputs`) and, for seqio, `'raw'` (the features the
      metrics read).
    token_lists: encoder ids per example (None: another process's).
    decode: output ids -> text.
    score: see `Scorer` (reads `examples`, so only where they are all).
  """

  source: str
  metric: str
  vocabulary: vocab_lib.Vocabulary
  examples: list[dict[str, str] | None]
  features: list[dict[str, Any] | None]
  token_lists: list[list[int] | None]
  decode: Callable[[list[int]], str]
  score: Scorer

  @property
  def num_read(self) -> int:
    """How many examples this process read."""
    return sum(t is not None for t in self.token_lists)

  @property
  def subtasks(self) -> list[str]:
    return [f['subtask'] for f in self.features]

  @property
  def pretokenized(self) -> list[dict[str, Any]]:
    return [f['pretokenized'] for f in self.features]


def load(
  settings: settings_lib.EvalSettings,
  vocabulary: vocab_lib.Vocabulary | None,
  owns: Callable[[int], bool] | None = None,
) -> TaskData:
  """The settings' task split (see the module docstring).

  Args:
    settings: the run's settings (task, split, num_examples, lengths).
    vocabulary: the model's vocabulary (None: the model has none).
    owns: in a multi-process run, whether this process reads the example
      at a position (`hosts.Hosts.owns`); the others are None. None: all.

  Raises:
    ValueError: an unknown task, no vocabulary, a seqio task whose
      vocabulary is not the model's, an empty split.
  """
  source = seqio_data.lookup(settings.task)
  if source is None:
    raise ValueError(seqio_data.unknown_task_message(settings.task))
  owns = owns or (lambda i: True)
  if source == seqio_data.SEQIO:
    data = _seqio(settings, vocabulary, owns)
  else:
    data = _builtin(settings, vocabulary, owns)
  if not data.examples:
    raise ValueError(f'{settings.task}/{settings.split} has no examples')
  return data


def _builtin(
  s: settings_lib.EvalSettings,
  vocab: vocab_lib.Vocabulary | None,
  owns: Callable[[int], bool],
) -> TaskData:
  if vocab is None:
    raise ValueError(
      'the target has no vocabulary; set EvalSettings.vocabulary'
    )
  task = tasks_lib.get_task(s.task, s.data_dir)
  exs, features, tokens = [], [], []
  pairs = itertools.islice(task.split_reader(s.split), s.num_examples)
  for i, (source, target) in enumerate(pairs):
    if not owns(i):
      exs.append(None)
      features.append(None)
      tokens.append(None)
      continue
    ex = {'inputs': task.input_prefix + source, 'targets': target}
    tokens.append(decoding.tokenize(vocab, [ex], s.max_input_len)[0])
    exs.append(ex)
    pretokenized = {
      'inputs_pretokenized': ex['inputs'],
      'targets_pretokenized': ex['targets'],
    }
    features.append({'subtask': s.task, 'pretokenized': pretokenized})
  examples = exs

  def score(texts, _):
    references = [ex['targets'] for ex in examples]
    return metrics_lib.compute(task.metric, texts, references), []

  return TaskData(
    source=seqio_data.BUILTIN,
    metric=task.metric,
    vocabulary=vocab,
    examples=examples,
    features=features,
    token_lists=tokens,
    decode=vocab.decode,
    score=score,
  )


def _seqio(
  s: settings_lib.EvalSettings,
  vocab: vocab_lib.Vocabulary | None,
  owns: Callable[[int], bool],
) -> TaskData:
  if s.data_dir:
    seqio_data.set_tfds_data_dir(s.data_dir)
  task = seqio_data.SeqioTask(s.task)
  if vocab is None:
    vocab = task.model_vocabulary()
  task.check_vocabulary(vocab)
  lengths = {'inputs': s.max_input_len, 'targets': s.max_decode_len}
  # The first num_examples of each (sub)task; `keep` is asked in reading
  # order, so its count is the example's position in the run.
  read = {'count': 0}

  def keep(_: str, __: int) -> bool:
    read['count'] += 1
    return owns(read['count'] - 1)

  exs = [
    ex for _, ex in task.read_share(s.split, lengths, s.num_examples, keep)
  ]
  examples = [
    None if ex is None else {'inputs': ex.inputs, 'targets': ex.targets}
    for ex in exs
  ]
  features = [
    None
    if ex is None
    else {'subtask': ex.task, 'pretokenized': ex.pretokenized, 'raw': ex.raw}
    for ex in exs
  ]

  def score(_, token_lists):
    read = [
      seqio_data.Example(
        task=f['subtask'],
        raw=f['raw'],
        inputs=ex['inputs'],
        targets=ex['targets'],
        input_tokens=[],
        pretokenized=f['pretokenized'],
      )
      for ex, f in zip(examples, features, strict=True)
    ]
    return task.score(read, token_lists)

  return TaskData(
    source=seqio_data.SEQIO,
    metric=', '.join(task.metric_names()) or '(no metrics)',
    vocabulary=vocab,
    examples=examples,
    features=features,
    token_lists=[None if ex is None else ex.input_tokens for ex in exs],
    decode=task.decode,
    score=score,
  )

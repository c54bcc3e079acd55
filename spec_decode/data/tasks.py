"""Tasks: where eval and training examples come from, as text pairs.

A `Task` names a split reader (split -> raw `(source, target)` text pairs),
the T5 input prefix and the metric. `examples(task, split, limit)` yields
`{'inputs': prefix + source, 'targets': target}` dicts, the text that T5's
preprocessors produce before tokenization. No TensorFlow is needed for the
Debian and synthetic tasks.

Registered tasks (`task_names()`):

* `debian_ende`, `debian_summarize`: the offline Debian data built by
  `spec-decode data build` (TSV splits under `data/debian`, or
  `$SPEC_DECODE_DEBIAN_DIR`, or the `data_dir` given to `get_task`).
* `wmt_t2t_ende_v003`, `cnn_dailymail_v002`: the paper's tasks from TFDS
  (`wmt_t2t_translate/de-en`, `cnn_dailymail`), read with
  tensorflow-datasets; `data_dir` is the TFDS data directory.
* `synthetic_tiny`, `synthetic_tiny_summarize`: deterministic fake sentences
  for tests, no files.

This module never imports seqio or TensorFlow. `data/seqio_tasks.py`
registers the TFDS and Debian tasks in `seqio.TaskRegistry` (import it, e.g.
as T5X's `MIXTURE_OR_TASK_MODULE`), and `data/seqio_data.py` reads any seqio
task or mixture for an eval run.
"""

import dataclasses
import hashlib
import itertools
import os
import random
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator

from spec_decode import paths
from spec_decode.data import debian
from spec_decode.data import quality as metrics_lib

TRANSLATE_EN_DE_PREFIX = 'translate English to German: '
SUMMARIZE_PREFIX = 'summarize: '
SPLITS = ('train', 'validation', 'test')

# T5's default vocabulary (`t5.data.DEFAULT_SPM_PATH`), the default of the
# seqio registrations (`seqio_tasks.py`).
T5_SPM_PATH = 'gs://t5-data/vocabs/cc_all.32000/sentencepiece.model'
T5_EXTRA_IDS = 100
WMT_T2T_TFDS_NAME = 'wmt_t2t_translate/de-en:1.0.0'
# T5 registered cnn_dailymail:3.1.0; current TFDS only prepares 3.4.0 (the
# same articles and highlights).
CNN_DAILYMAIL_TFDS_NAME = 'cnn_dailymail:3.4.0'

SplitReader = Callable[[str], Iterable[tuple[str, str]]]


@dataclasses.dataclass(frozen=True)
class Task:
  """A text-to-text task.

  Attributes:
    name: the registry name.
    split_reader: maps a split name to an iterable of raw `(source, target)`
      text pairs, in a fixed order.
    input_prefix: prepended to every source (T5's task prefix).
    metric: a `metrics.METRICS` key (`bleu` or `rouge`).
  """

  name: str
  split_reader: SplitReader
  input_prefix: str
  metric: str

  def __post_init__(self):
    if self.metric not in metrics_lib.METRICS:
      raise ValueError(f'Task {self.name}: unknown metric {self.metric!r}')


# -------------------------------------------------------------- TSV tasks.


def read_tsv(path: str) -> Iterator[tuple[str, str]]:
  """Yields `(source, target)` from an `id<TAB>source<TAB>target` file.

  A first line equal to the header `id source target` is skipped.

  Args:
    path: the TSV file.
  """
  header = '\t'.join(debian.TSV_HEADER)
  with open(path, encoding='utf-8') as f:
    for lineno, line in enumerate(f, 1):
      line = line.rstrip('\n')
      if lineno == 1 and line == header:
        continue
      fields = line.split('\t')
      if len(fields) != 3:
        raise ValueError(
          f'{path}:{lineno}: expected 3 tab-separated fields, got {len(fields)}'
        )
      yield fields[1], fields[2]


def tsv_reader(subdir: str, data_dir: str | None = None) -> SplitReader:
  """A split reader of `<data_dir>/<subdir>/<split>.tsv`.

  Args:
    subdir: the task's directory inside the data directory.
    data_dir: the data directory (a relative one not found from the
      working directory is looked up in the repository, `paths.resolve`:
      the demo's `data/demo`); None resolves `debian.default_data_dir()`
      when a split is read.

  Returns:
    The split reader; it raises FileNotFoundError with the build command if
    the split file is missing.
  """

  def read(split: str) -> Iterator[tuple[str, str]]:
    root = paths.resolve(data_dir) if data_dir else debian.default_data_dir()
    path = os.path.join(root, subdir, f'{split}.tsv')
    if not os.path.exists(path):
      build = debian.BUILD_COMMAND.format(out_dir=root)
      raise FileNotFoundError(
        f'No split file {path}. Build the Debian data with\n  {build}\n'
        f'(add --fetch to run `{debian.FETCH_COMMAND}` first, as root).'
      )
    yield from read_tsv(path)

  return read


def debian_task(kind: str, data_dir: str | None = None) -> Task:
  """The Debian `ende` or `summarize` task reading from `data_dir`."""
  if kind == 'ende':
    return Task(
      'debian_ende',
      tsv_reader('ende', data_dir),
      TRANSLATE_EN_DE_PREFIX,
      'bleu',
    )
  if kind == 'summarize':
    return Task(
      'debian_summarize',
      tsv_reader('summarize', data_dir),
      SUMMARIZE_PREFIX,
      'rouge',
    )
  raise ValueError(f'Unknown Debian task kind {kind!r}')


# ------------------------------------------------------------- TFDS tasks.


def tfds_reader(
  tfds_name: str, source_key: str, target_key: str, data_dir: str | None
) -> SplitReader:
  """A split reader of a TFDS text dataset (needs tensorflow-datasets)."""

  def read(split: str) -> Iterator[tuple[str, str]]:
    try:
      import tensorflow_datasets as tfds  # Optional dependency.
    except ImportError as e:
      raise ImportError(
        f'Reading {tfds_name} needs tensorflow-datasets and the prepared '
        'TFDS data: pip install -e ".[seqio]" tensorflow-datasets, then '
        'pass the TFDS data_dir.'
      ) from e
    ds = tfds.load(tfds_name, split=split, data_dir=data_dir)
    for ex in tfds.as_numpy(ds):
      yield ex[source_key].decode('utf-8'), ex[target_key].decode('utf-8')

  return read


# --------------------------------------------------------- synthetic tasks.

# A fixed toy lexicon: English word -> fake "German" word. The target is the
# word-by-word image of the source, so a tiny model can learn it.
_LEXICON = {
  'the': 'die', 'a': 'eine', 'small': 'kleine', 'red': 'rote',
  'old': 'alte', 'quick': 'schnelle', 'cat': 'Katze', 'dog': 'Hund',
  'house': 'Haus', 'tree': 'Baum', 'river': 'Fluss', 'bird': 'Vogel',
  'sees': 'sieht', 'likes': 'mag', 'finds': 'findet', 'paints': 'malt',
  'near': 'nahe', 'under': 'unter', 'today': 'heute', 'again': 'wieder',
}  # fmt: skip
_DETS = ('the', 'a')
_ADJS = ('small', 'red', 'old', 'quick')
_NOUNS = ('cat', 'dog', 'house', 'tree', 'river', 'bird')
_VERBS = ('sees', 'likes', 'finds', 'paints')
_PREPS = ('near', 'under')
_ADVS = ('today', 'again')
SYNTHETIC_SIZES = {'train': 256, 'validation': 32, 'test': 32}


def _rng(*parts: object) -> random.Random:
  digest = hashlib.sha256('/'.join(map(str, parts)).encode('utf-8')).digest()
  return random.Random(int.from_bytes(digest[:8], 'big'))


def _noun_phrase(rng: random.Random) -> list[str]:
  words = [rng.choice(_DETS)]
  if rng.random() < 0.5:
    words.append(rng.choice(_ADJS))
  return words + [rng.choice(_NOUNS)]


def fake_sentence(rng: random.Random) -> str:
  """A deterministic (given `rng`) toy English sentence of 4-11 words."""
  words = _noun_phrase(rng) + [rng.choice(_VERBS)] + _noun_phrase(rng)
  if rng.random() < 0.4:
    words += [rng.choice(_PREPS)] + _noun_phrase(rng)
  if rng.random() < 0.3:
    words.append(rng.choice(_ADVS))
  return ' '.join(words) + ' .'


def fake_translation(sentence: str) -> str:
  """The toy German image of a `fake_sentence`, word by word."""
  return ' '.join(_LEXICON.get(w, w) for w in sentence.split())


def synthetic_reader(
  kind: str, sizes: dict[str, int] | None = None
) -> SplitReader:
  """A split reader of deterministic toy pairs (`ende` or `summarize`).

  Example i of a split depends only on (kind, split, i), so a prefix of a
  split is the same whatever the size.

  Args:
    kind: `ende` (sentence -> word-by-word toy German) or `summarize` (2-4
      sentences -> the first one).
    sizes: examples per split (default `SYNTHETIC_SIZES`).
  """
  sizes = dict(SYNTHETIC_SIZES if sizes is None else sizes)
  if kind not in ('ende', 'summarize'):
    raise ValueError(f'Unknown synthetic task kind {kind!r}')

  def read(split: str) -> Iterator[tuple[str, str]]:
    if split not in sizes:
      raise ValueError(f'Unknown split {split!r}; known: {sorted(sizes)}')
    for i in range(sizes[split]):
      rng = _rng('synthetic', kind, split, i)
      if kind == 'ende':
        sentence = fake_sentence(rng)
        yield sentence, fake_translation(sentence)
      else:
        sentences = [fake_sentence(rng) for _ in range(rng.randint(2, 4))]
        yield ' '.join(sentences), sentences[0]

  return read


def synthetic_task(
  kind: str = 'ende', sizes: dict[str, int] | None = None
) -> Task:
  """The synthetic translation (`ende`) or summarization task."""
  if kind == 'ende':
    return Task(
      'synthetic_tiny',
      synthetic_reader('ende', sizes),
      TRANSLATE_EN_DE_PREFIX,
      'bleu',
    )
  return Task(
    'synthetic_tiny_summarize',
    synthetic_reader(kind, sizes),
    SUMMARIZE_PREFIX,
    'rouge',
  )


# --------------------------------------------------------------- registry.

TaskFactory = Callable[[str | None], Task]

_FACTORIES: dict[str, TaskFactory] = {
  'debian_ende': lambda d: debian_task('ende', d),
  'debian_summarize': lambda d: debian_task('summarize', d),
  'wmt_t2t_ende_v003': lambda d: Task(
    'wmt_t2t_ende_v003',
    tfds_reader(WMT_T2T_TFDS_NAME, 'en', 'de', d),
    TRANSLATE_EN_DE_PREFIX,
    'bleu',
  ),
  'cnn_dailymail_v002': lambda d: Task(
    'cnn_dailymail_v002',
    tfds_reader(CNN_DAILYMAIL_TFDS_NAME, 'article', 'highlights', d),
    SUMMARIZE_PREFIX,
    'rouge',
  ),
  'synthetic_tiny': lambda d: synthetic_task('ende'),
  'synthetic_tiny_summarize': lambda d: synthetic_task('summarize'),
}


def task_names() -> list[str]:
  """The names `get_task` knows."""
  return sorted(_FACTORIES)


def get_task(name: str, data_dir: str | None = None) -> Task:
  """Returns the task called `name`.

  Args:
    name: one of `task_names()`.
    data_dir: the Debian data directory (Debian tasks) or the TFDS data
      directory (TFDS tasks); ignored by the synthetic tasks. None: the
      default location.
  """
  if name not in _FACTORIES:
    raise ValueError(f'Unknown task {name!r}; known: {task_names()}')
  return _FACTORIES[name](data_dir)


def examples(
  task: Task | str, split: str, limit: int | None = None
) -> Iterator[dict[str, str]]:
  """Yields `{'inputs': prefix + source, 'targets': target}` of a split.

  Args:
    task: a `Task` or a registered task name.
    split: `train`, `validation` or `test`.
    limit: stop after this many examples (None: all).
  """
  if isinstance(task, str):
    task = get_task(task)
  pairs = iter(task.split_reader(split))
  if limit is not None:
    pairs = itertools.islice(pairs, limit)
  for source, target in pairs:
    yield {'inputs': task.input_prefix + source, 'targets': target}

"""spec_decode's TFDS and Debian tasks, registered in seqio.

`import spec_decode.data.seqio_tasks` registers `wmt_t2t_ende_v003`,
`cnn_dailymail_v002`, `debian_ende` and `debian_summarize` in
`seqio.TaskRegistry` with T5's pipeline (prefix, tokenize, cache placeholder,
append EOS after trim), as `t5.data.tasks` registers T5's, so that T5X runs
and `spec-decode eval` read them through seqio: T5X's
`MIXTURE_OR_TASK_MODULE = 'spec_decode.data.seqio_tasks'`. Names that are
already registered (e.g. by `t5.data.tasks`) are left alone.

Their vocabulary, in this order:
  * `register(vocabulary=...)` (`spec-decode eval`'s `SEQIO_VOCABULARY`
    macro calls it), which registers the tasks again with that one;
  * `$SPEC_DECODE_SEQIO_VOCABULARY`: a sentencepiece `.model` path (with
    `$SPEC_DECODE_SEQIO_EXTRA_IDS` extra ids, default 100);
  * T5's `gs://t5-data/vocabs/cc_all.32000/sentencepiece.model`, 100 extra
    ids. Reading a `gs://` path needs network access; offline, copy the file
    and point one of the above at the copy.

Importing this module imports seqio and TensorFlow; `data/tasks.py` does not.
"""

import os
from typing import Any

import seqio
import tensorflow as tf

from spec_decode import paths
from spec_decode.data import debian
from spec_decode.data import quality as metrics_lib
from spec_decode.data import tasks as tasks_lib

VOCABULARY_ENV = 'SPEC_DECODE_SEQIO_VOCABULARY'
EXTRA_IDS_ENV = 'SPEC_DECODE_SEQIO_EXTRA_IDS'

# The names this module registered (and may register again).
_OURS: set[str] = set()


def _bleu(targets, predictions):
  return metrics_lib.bleu(predictions, targets)


def _rouge(targets, predictions):
  return metrics_lib.rouge(predictions, targets)


def default_vocabulary() -> seqio.SentencePieceVocabulary:
  """`$SPEC_DECODE_SEQIO_VOCABULARY`, else T5's default vocabulary."""
  path = os.environ.get(VOCABULARY_ENV) or tasks_lib.T5_SPM_PATH
  extra_ids = os.environ.get(EXTRA_IDS_ENV) or tasks_lib.T5_EXTRA_IDS
  try:
    extra_ids = int(extra_ids)
  except ValueError:
    raise ValueError(
      f'${EXTRA_IDS_ENV} must be an int, got {extra_ids!r}'
    ) from None
  return as_vocabulary(path, extra_ids)


def as_vocabulary(
  vocabulary: Any, extra_ids: int = tasks_lib.T5_EXTRA_IDS
) -> seqio.Vocabulary:
  """A `seqio.Vocabulary` as is; a sentencepiece `.model` path loaded lazily.

  A local path must exist (relative ones are also looked up in the
  repository); `gs://` and other remote paths are read when first used.
  """
  if isinstance(vocabulary, seqio.Vocabulary):
    return vocabulary
  if not isinstance(vocabulary, (str, os.PathLike)) or not str(vocabulary):
    raise ValueError(
      'a seqio task vocabulary must be a sentencepiece .model path or a '
      f'seqio.Vocabulary, got {vocabulary!r}'
    )
  path = os.fspath(vocabulary)
  if '://' not in path:
    path = os.path.abspath(paths.resolve(path))
    if not os.path.isfile(path):
      raise FileNotFoundError(f'sentencepiece model not found: {vocabulary}')
  return seqio.SentencePieceVocabulary(path, extra_ids=int(extra_ids))


def _text_to_text(prefix: str, source_key: str, target_key: str):
  # What t5.data.preprocessors.translate / summarize produce.
  def preprocess(dataset):
    def fn(ex):
      return {
        'inputs': tf.strings.join([prefix, ex[source_key]]),
        'targets': ex[target_key],
      }

    return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)

  return preprocess


def _parse_tsv(dataset):
  def fn(line):
    fields = tf.io.decode_csv(
      line,
      record_defaults=['', '', ''],
      field_delim='\t',
      use_quote_delim=False,
    )
    return dict(zip(debian.TSV_HEADER, fields, strict=True))

  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


def _specs(debian_dir: str | None) -> list[tuple[str, Any, list[Any], Any]]:
  root = os.path.abspath(debian_dir or debian.default_data_dir())

  def tsv_source(subdir):
    return seqio.TextLineDataSource(
      {s: os.path.join(root, subdir, f'{s}.tsv') for s in tasks_lib.SPLITS},
      skip_header_lines=1,
    )

  en_de = tasks_lib.TRANSLATE_EN_DE_PREFIX
  summarize = tasks_lib.SUMMARIZE_PREFIX
  return [
    (
      'wmt_t2t_ende_v003',
      seqio.TfdsDataSource(tfds_name=tasks_lib.WMT_T2T_TFDS_NAME),
      [_text_to_text(en_de, 'en', 'de')],
      _bleu,
    ),
    (
      'cnn_dailymail_v002',
      seqio.TfdsDataSource(tfds_name=tasks_lib.CNN_DAILYMAIL_TFDS_NAME),
      [_text_to_text(summarize, 'article', 'highlights')],
      _rouge,
    ),
    (
      'debian_ende',
      tsv_source('ende'),
      [_parse_tsv, _text_to_text(en_de, 'source', 'target')],
      _bleu,
    ),
    (
      'debian_summarize',
      tsv_source('summarize'),
      [_parse_tsv, _text_to_text(summarize, 'source', 'target')],
      _rouge,
    ),
  ]


def register(
  vocabulary: Any = None,
  extra_ids: int = tasks_lib.T5_EXTRA_IDS,
  debian_dir: str | None = None,
) -> list[str]:
  """Registers (again) the TFDS and Debian tasks in `seqio.TaskRegistry`.

  Names registered by someone else (e.g. `t5.data.tasks`) are left alone;
  those this module registered before are replaced, so a second call
  changes their vocabulary.

  Args:
    vocabulary: a `seqio.Vocabulary` or a sentencepiece `.model` path; None
      uses `default_vocabulary()` (the environment, else T5's).
    extra_ids: extra ids of a vocabulary given as a path.
    debian_dir: the Debian data directory (default: `default_data_dir()`).

  Returns:
    The names this call registered.
  """
  if vocabulary is None:
    vocab = default_vocabulary()
  else:
    vocab = as_vocabulary(vocabulary, extra_ids)
  features = {
    'inputs': seqio.Feature(vocab, add_eos=True, required=False),
    'targets': seqio.Feature(vocab, add_eos=True),
  }
  registered = []
  existing = set(seqio.TaskRegistry.names())
  for name, source, text_preprocessors, metric_fn in _specs(debian_dir):
    if name in existing and name not in _OURS:
      continue
    if name in existing:
      seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=text_preprocessors
      + [
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=features,
      metric_fns=[metric_fn],
    )
    _OURS.add(name)
    registered.append(name)
  return registered


def unregister() -> list[str]:
  """Removes the tasks this module registered; returns their names."""
  removed = sorted(_OURS & set(seqio.TaskRegistry.names()))
  for name in removed:
    seqio.TaskRegistry.remove(name)
  _OURS.clear()
  return removed


register()

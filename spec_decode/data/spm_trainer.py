"""Trains the demo sentencepiece vocabulary on the Debian training splits.

The model is a unigram sentencepiece model with T5's special ids (pad 0,
EOS 1, unk 2, no BOS), so `vocab.Vocabulary` accepts it; `extra_ids` sentinel
ids are added on top by `Vocabulary`, so a vocabulary of `vocab_size` ids
has `vocab_size - extra_ids` sentencepiece pieces.

The corpus is every text of the train splits of the Debian tasks: both sides
of `ende` (English and German) and both sides of `summarize` (English), in
file order. Training is deterministic: no sampling of sentences, no
shuffling, one thread; the same corpus gives a byte-identical model.

    spec-decode data vocab --data_dir data/debian \
        --output runs/demo/spiece.model
"""

import argparse
import io
import os
import sys
from collections.abc import Iterable
from collections.abc import Iterator

import sentencepiece as spm

from spec_decode.data import debian
from spec_decode.data import tasks
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.config import EOS_ID
from spec_decode.t5.config import PAD_ID
from spec_decode.t5.config import UNK_ID

DEFAULT_VOCAB_SIZE = 4096  # Extra ids included.
DEFAULT_TASKS = ('ende', 'summarize')


def debian_corpus(
  data_dir: str | None = None, kinds: Iterable[str] = DEFAULT_TASKS
) -> Iterator[str]:
  """Yields the source and target texts of the Debian train splits.

  Args:
    data_dir: the Debian data directory (default
      `debian.default_data_dir()`).
    kinds: task directories to read (`ende`, `summarize`).
  """
  for kind in kinds:
    for source, target in tasks.tsv_reader(kind, data_dir)('train'):
      yield source
      yield target


def train_sentencepiece(
  texts: Iterable[str],
  vocab_size: int = DEFAULT_VOCAB_SIZE,
  extra_ids: int = vocab_lib.DEFAULT_EXTRA_IDS,
  character_coverage: float = 1.0,
  max_sentence_length: int = 8192,
) -> bytes:
  """Trains a unigram sentencepiece model with T5's special ids.

  Args:
    texts: the training corpus, one text per item (newlines are replaced by
      spaces).
    vocab_size: ids of the final vocabulary, `extra_ids` included.
    extra_ids: sentinel ids `Vocabulary` will add above the pieces.
    character_coverage: fraction of characters covered by single pieces;
      the rest map to unk.
    max_sentence_length: longer texts (in bytes) are skipped.

  Returns:
    The serialized `ModelProto`.
  """
  pieces = vocab_size - extra_ids
  if pieces < 4:
    raise ValueError(
      f'vocab_size {vocab_size} leaves {pieces} pieces after {extra_ids} '
      'extra ids'
    )
  sentences = (' '.join(t.split()) for t in texts)
  out = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=(s for s in sentences if s),
    model_writer=out,
    model_type='unigram',
    vocab_size=pieces,
    pad_id=PAD_ID,
    eos_id=EOS_ID,
    unk_id=UNK_ID,
    bos_id=-1,
    character_coverage=character_coverage,
    input_sentence_size=0,
    shuffle_input_sentence=False,
    max_sentence_length=max_sentence_length,
    num_threads=1,
    minloglevel=2,
  )
  return out.getvalue()


def build(
  output: str,
  data_dir: str | None = None,
  vocab_size: int = DEFAULT_VOCAB_SIZE,
  extra_ids: int = vocab_lib.DEFAULT_EXTRA_IDS,
  kinds: Iterable[str] = DEFAULT_TASKS,
) -> vocab_lib.Vocabulary:
  """Trains the Debian vocabulary and writes the `.model` file to `output`.

  Args:
    output: path of the sentencepiece model file to write.
    data_dir: the Debian data directory.
    vocab_size: ids including the extra ids.
    extra_ids: number of T5 sentinel ids.
    kinds: Debian task directories whose train splits form the corpus.

  Returns:
    The vocabulary.
  """
  model = train_sentencepiece(
    debian_corpus(data_dir, kinds), vocab_size, extra_ids
  )
  vocabulary = vocab_lib.Vocabulary(model, extra_ids=extra_ids, name=output)
  parent = os.path.dirname(os.path.abspath(output))
  os.makedirs(parent, exist_ok=True)
  with open(output, 'wb') as f:
    f.write(model)
  return vocabulary


def main(argv: list[str] | None = None) -> int:
  """`spec-decode data vocab`: trains and writes the vocabulary."""
  parser = argparse.ArgumentParser(
    prog='spec-decode data vocab',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
    '--data_dir',
    default=None,
    help='Debian data directory (default: '
    f'${debian.DATA_DIR_ENV} or data/debian)',
  )
  parser.add_argument(
    '--output', required=True, help='the .model file to write'
  )
  parser.add_argument(
    '--vocab_size',
    type=int,
    default=DEFAULT_VOCAB_SIZE,
    help='ids including the extra ids',
  )
  parser.add_argument(
    '--extra_ids', type=int, default=vocab_lib.DEFAULT_EXTRA_IDS
  )
  args = parser.parse_args(argv)
  try:
    vocabulary = build(
      args.output, args.data_dir, args.vocab_size, args.extra_ids
    )
  except FileNotFoundError as e:
    print(e, file=sys.stderr)
    return 1
  print(f'wrote {args.output}: {vocabulary!r}')
  return 0

"""Trains tiny sentencepiece models with T5's special ids, for tests."""

import os

import sentencepiece as spm

from spec_decode.t5 import vocab as vocab_lib

_WORDS = (
  'the quick brown fox jumps over lazy dog and cat sat on mat while '
  'a bird sang in tree near river under blue sky today we translate '
  'english into german das ist gut haus katze hund'
).split()


def corpus(n: int = 400) -> list[str]:
  """Deterministic pseudo-sentences over a small word list."""
  lines = []
  for i in range(n):
    k = 3 + i % 7
    lines.append(
      ' '.join(_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(k))
    )
  return lines


def train(
  directory, vocab_size: int = 60, seed_text: str = '', name: str = 'spm'
) -> str:
  """Trains a unigram model in `directory`; returns the `.model` path."""
  directory = os.fspath(directory)
  text = os.path.join(directory, f'{name}.txt')
  with open(text, 'w') as f:
    f.write('\n'.join(corpus() + ([seed_text] if seed_text else [])))
  prefix = os.path.join(directory, name)
  spm.SentencePieceTrainer.train(
    input=text,
    model_prefix=prefix,
    vocab_size=vocab_size,
    pad_id=0,
    eos_id=1,
    unk_id=2,
    bos_id=-1,
    minloglevel=2,
    hard_vocab_limit=False,
  )
  return prefix + '.model'


def vocabulary(directory, **kwargs) -> vocab_lib.Vocabulary:
  return vocab_lib.Vocabulary.from_file(train(directory, **kwargs))

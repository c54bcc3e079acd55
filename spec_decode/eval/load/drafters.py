"""Drafters for eval runs, built from gin: n-gram, copy, heads, feature
drafts, early exit, hierarchical.

Library functions (no gin decorators); `gin/runs/eval.gin` registers them
dynamically, so a config can say

    DRAFT = @spec_eval_drafters.ngram_draft()
    spec_eval_drafters.ngram_draft.n = 2

and `spec-decode eval` decodes with it like with a draft model. The
drafts that live on the target (`feature_draft`, `early_exit_draft`) take
it as `target = %TARGET` (runs/compare.gin's singleton: loaded once).
"""

import os
from typing import Any

from tqdm import auto as tqdm

from spec_decode import checkpoints
from spec_decode import drafters
from spec_decode import paths
from spec_decode.data import tasks as tasks_lib
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.config import EOS_ID


def resolve_vocabulary(vocabulary: Any) -> vocab_lib.Vocabulary:
  """A `Vocabulary`, a sentencepiece `.model` file, or a checkpoint dir.

  Drafters take the vocabulary size from it; a target whose embedding has
  more rows than its vocabulary (T5's 32128 for 32100 ids) needs
  `vocab_size=` passed to the drafter function as well.
  """
  if isinstance(vocabulary, vocab_lib.Vocabulary):
    return vocabulary
  if vocabulary is None:
    raise ValueError('a drafter needs the target vocabulary (vocabulary=)')
  path = paths.resolve(str(vocabulary))
  if os.path.isdir(path):
    vocab = checkpoints.read_vocabulary(path)
    if vocab is None:
      raise ValueError(f'{path} holds no {checkpoints.VOCAB_FILE}')
    return vocab
  return vocab_lib.Vocabulary.from_file(path)


def target_sequences(
  task: str,
  vocabulary: vocab_lib.Vocabulary,
  split: str = 'train',
  data_dir: str | None = None,
  max_examples: int | None = None,
  max_target_len: int = 512,
) -> list[list[int]]:
  """The split's target texts as token ids, each ending in EOS."""
  task_obj = tasks_lib.get_task(task, data_dir)
  exs = tasks_lib.examples(task_obj, split, limit=max_examples)
  return [
    vocabulary.encode(ex['targets'])[: max_target_len - 1] + [EOS_ID]
    for ex in tqdm.tqdm(exs, desc=f'tokenizing {task}/{split}', unit='ex')
  ]


def ngram_draft(
  task: str,
  vocabulary: Any,
  n: int = 2,
  split: str = 'train',
  data_dir: str | None = None,
  max_examples: int | None = None,
  vocab_size: int | None = None,
  **fit_kwargs,
) -> drafters.NGram:
  """An order-`n` table fit on a task split's targets (1 = unigram)."""
  vocab = resolve_vocabulary(vocabulary)
  seqs = target_sequences(task, vocab, split, data_dir, max_examples)
  return drafters.NGram.fit(
    seqs,
    n=n,
    vocab_size=vocab_size or vocab.vocab_size,
    vocabulary=vocab,
    **fit_kwargs,
  )


def copy_draft(
  vocabulary: Any,
  max_ngram: int = 3,
  min_ngram: int = 1,
  vocab_size: int | None = None,
):
  """Prompt lookup over the input and the output so far."""
  vocab = resolve_vocabulary(vocabulary)
  return drafters.Copy(
    vocab_size=vocab_size or vocab.vocab_size,
    max_ngram=max_ngram,
    min_ngram=min_ngram,
    vocabulary=vocab,
  )


def heads_draft(path: str):
  """Medusa heads saved by `spec-decode train` (train_heads)."""
  return drafters.Heads.load(paths.resolve(path))


def feature_draft(path: str, target: Any):
  """An EAGLE-style feature draft saved by `spec-decode train`
  (`train_feature`; `configs/train_demo_feature.gin`), on `target`."""
  return drafters.FeatureDraft.load(paths.resolve(path), target)


def early_exit_draft(target: Any, num_layers: int = 1):
  """The target's first `num_layers` decoder layers as its own draft."""
  return drafters.EarlyExit.of(target, num_layers)


def hierarchical_draft(draft_model: Any, sub_draft: Any, gamma: int = 2):
  """`draft_model` drafting through its own `sub_draft` (inner gamma)."""
  return drafters.Hierarchical(
    draft_model=draft_model, sub_draft=sub_draft, gamma=gamma
  )

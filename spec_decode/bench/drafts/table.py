"""Acceptance of the cheap drafters (unigram, bigram, Copy) on a Debian task.

The paper's Table 3 for our demo pair: the n-grams are fit on the train
split's target token sequences, every drafter drafts for the demo target on
the first examples of the test split (one batch), greedy and at t = 1, and
the table reports alpha, output tokens per target call and draft tokens
proposed per iteration (Copy proposes fewer when it finds no match). With
`--tree` (default `2,2,1,1`, 14 nodes) every drafter also drafts token trees
(`generate(tree=...)`), a row set beside the chains (alpha there is the
rank-0 children's; proposed / iter counts the tree's nodes).

  JAX_PLATFORMS=cpu spec-decode bench drafters \
      --task debian_ende --num_examples 50 --gamma 4

Measured on the demo target (Debian EnDe test, 50 examples, gamma 4),
alpha at t = 0 / t = 1: unigram 0.03 / 0.31, bigram 0.35 / 0.52, trigram
0.37 / 0.44, Copy (max_ngram 3) 0.86 / 0.09 with 1.66 / 0.70 tokens
proposed per iteration. Copy's greedy acceptance comes from the small
target's repetition loops (searching the output alone gives 0.91), not
from copying the English input.

Tree rows (`--tree 2,2,1,1`, 14 nodes; measured 2026-11-23, same command,
50 examples), output tokens per target call, chain gamma 4 -> tree, at
t = 0 / t = 1: unigram 1.11 -> 1.33 / 1.40 -> 1.57, bigram 1.39 -> 1.69 /
1.79 -> 2.14, trigram 1.48 -> 1.72 / 1.69 -> 1.94, Copy 2.08 -> 2.09 /
1.01 -> 1.01 (a second match rarely starts the right continuation).
"""

import argparse
import itertools
import time

import numpy as np

import spec_decode as sd
from spec_decode.core import inputs
from spec_decode.data import tasks as tasks_lib
from spec_decode.drafters import Copy
from spec_decode.drafters import NGram
from spec_decode.eval.load import drafters as eval_drafters


def encoder_tokens(task, vocabulary, split, num_examples, max_input_len):
  """`[B, S] int32` inputs of the split's first examples, EOS appended."""
  exs = tasks_lib.examples(tasks_lib.get_task(task), split, num_examples)
  rows = [
    vocabulary.encode(ex['inputs'])[: max_input_len - 1] + [sd.EOS_ID]
    for ex in exs
  ]
  enc = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
  for b, r in enumerate(rows):
    enc[b, : len(r)] = r
  return enc


def drafters(target, fit_task, max_ngram):
  vocab = target.vocabulary
  seqs = eval_drafters.target_sequences(fit_task, vocab, 'train')
  v = target.vocab_size
  return {
    'unigram': NGram.fit(seqs, n=1, vocab_size=v, vocabulary=vocab),
    'bigram': NGram.fit(seqs, n=2, vocab_size=v, vocabulary=vocab),
    'trigram': NGram.fit(seqs, n=3, vocab_size=v, vocabulary=vocab),
    f'copy (max_ngram={max_ngram})': Copy(
      vocab_size=v, max_ngram=max_ngram, vocabulary=vocab
    ),
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench drafters', description=__doc__.split('\n')[0]
  )
  parser.add_argument('--target', default='checkpoints/demo/target')
  parser.add_argument('--task', default='debian_ende')
  parser.add_argument(
    '--fit_task', default=None, help='task whose train targets the n-grams fit'
  )
  parser.add_argument('--split', default='test')
  parser.add_argument('--num_examples', type=int, default=50)
  parser.add_argument('--gamma', type=inputs.gamma_flag(), default=4)
  parser.add_argument('--max_input_len', type=int, default=256)
  parser.add_argument('--max_decode_len', type=int, default=128)
  parser.add_argument('--max_ngram', type=int, default=3)
  parser.add_argument(
    '--tree',
    default='2,2,1,1',
    help="branching of the token-tree rows ('' for chains only)",
  )
  args = parser.parse_args(argv)
  tree = tuple(int(b) for b in args.tree.split(',')) if args.tree else None

  target = sd.Model.load(args.target)
  enc = encoder_tokens(
    args.task,
    target.vocabulary,
    args.split,
    args.num_examples,
    args.max_input_len,
  )
  print(
    f'{args.task}/{args.split}: {enc.shape[0]} examples, gamma {args.gamma}'
  )
  rows = []
  for name, draft in drafters(
    target, args.fit_task or args.task, args.max_ngram
  ).items():
    shapes = [('', dict(gamma=args.gamma))]
    if tree is not None:
      shapes.append((f' tree {tree}', dict(tree=tree)))
    for (suffix, shape), t in itertools.product(shapes, (0.0, 1.0)):
      start = time.perf_counter()
      out = sd.generate(
        target,
        enc,
        draft=draft,
        temperature=t,
        max_decode_len=args.max_decode_len,
        seed=0,
        **shape,
      )
      s = out.stats
      rows.append(
        (
          name + suffix,
          t,
          s.alpha,
          s.tokens_per_call,
          s.mean_proposed,
          float(out.lengths.mean()),
          time.perf_counter() - start,
        )
      )
      print(
        f'| {name}{suffix} | {t:g} | {s.alpha:.3f} | {s.tokens_per_call:.2f} | '
        f'{s.mean_proposed:.2f} | {out.lengths.mean():.1f} |',
        flush=True,
      )
  print()
  print('| drafter | t | alpha | tokens / target call | proposed / iter |')
  print('|---|---|---|---|---|')
  for name, t, alpha, tpc, prop, _, _ in rows:
    print(f'| {name} | {t:g} | {alpha:.3f} | {tpc:.2f} | {prop:.2f} |')
  return 0

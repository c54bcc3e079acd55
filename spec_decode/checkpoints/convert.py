"""`spec-decode convert`: a Hugging Face or T5X checkpoint to our format.

    spec-decode convert --from ~/hf/t5-v1_1-small --to ckpt/t5_1_1_small
    spec-decode convert --from t5x/checkpoint_1000000 --to ckpt/xxl \\
        --gin_file models/t5_1_1/xxl.gin --vocab cc_all.32000.100extra.model

The output directory holds parameters (orbax), `config.json` and the
vocabulary, and loads with `Model.load(DIR)` alone.
"""

import argparse
import sys
import time

import jax
import numpy as np

from spec_decode import checkpoints
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.byte_vocab import ByteVocabulary
from spec_decode.t5.config import T5Config


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog='spec-decode convert',
    description='Convert a Hugging Face T5 directory or a T5X checkpoint '
    'into a spec_decode checkpoint directory.',
  )
  p.add_argument(
    '--from',
    dest='source',
    required=True,
    help='Hugging Face T5 directory or T5X checkpoint directory',
  )
  p.add_argument(
    '--to', dest='target', required=True, help='new output directory'
  )
  p.add_argument(
    '--gin_file',
    help='model gin file with the hyperparameters (T5X): ours, e.g. '
    "models/t5_1_1/xxl.gin, or T5X's own; its local sentencepiece file is "
    'the vocabulary unless --vocab is given',
  )
  p.add_argument(
    '--gin_search_paths',
    default='',
    help="comma-separated directories the gin file's includes are looked "
    'up in first (e.g. your t5x checkout)',
  )
  p.add_argument(
    '--config', help='T5Config JSON file with the hyperparameters (T5X)'
  )
  p.add_argument(
    '--vocab',
    help='sentencepiece model to store with the weights (T5X checkpoints '
    "carry none; overrides a Hugging Face spiece.model), or 'byte' for "
    "ByT5's byte vocabulary (with --extra_ids)",
  )
  p.add_argument(
    '--extra_ids',
    type=int,
    default=vocab_lib.DEFAULT_EXTRA_IDS,
    help='extra ids of --vocab (default %(default)s)',
  )
  p.add_argument('--dtype', help='parameter dtype to store (default: float32)')
  return p


def main(argv=None) -> int:
  """Runs the conversion; returns a process exit code."""
  args = _parser().parse_args(argv)
  config = None
  if args.config:
    with open(args.config) as f:
      config = T5Config.from_json(f.read())
  vocabulary = None
  if args.vocab == 'byte':
    vocabulary = ByteVocabulary(extra_ids=args.extra_ids)
  elif args.vocab:
    vocabulary = vocab_lib.Vocabulary.from_file(
      args.vocab, extra_ids=args.extra_ids
    )
  start = time.perf_counter()
  try:
    if args.gin_file:
      if config is not None:
        raise ValueError('pass --config or --gin_file, not both')
      search = [p for p in args.gin_search_paths.split(',') if p]
      model_file = T5Config.read_gin(args.gin_file, search_paths=search)
      config = T5Config.from_model_file(model_file)
      if vocabulary is None:
        vocabulary = model_file.local_vocabulary()
    ckpt = checkpoints.read(
      args.source,
      config=config,
      dtype=args.dtype,
      vocabulary=vocabulary,
      progress=True,
    )
    checkpoints.write(args.target, ckpt.config, ckpt.params, ckpt.vocabulary)
  except (OSError, ValueError) as e:
    print(f'spec-decode convert: error: {e}', file=sys.stderr)
    return 1
  print(
    f'converted {ckpt.format} checkpoint {args.source} -> {args.target}: '
    f'{ckpt.config}, {_count(ckpt.params):,} parameters '
    f'in {time.perf_counter() - start:.1f}s'
  )
  if ckpt.vocabulary is None:
    print(
      'warning: no vocabulary stored (pass --vocab spiece.model, or '
      '--vocab byte for ByT5)',
      file=sys.stderr,
    )
  return 0


def _count(params) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))

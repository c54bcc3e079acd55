"""`spec-decode convert`: a Hugging Face or T5X checkpoint to our format, and
a T5Gemma one back to a Hugging Face directory.

    spec-decode convert --from ~/hf/t5-v1_1-small --to ckpt/t5_1_1_small
    spec-decode convert --from t5x/checkpoint_1000000 --to ckpt/xxl \\
        --gin_file models/t5_1_1/xxl.gin --vocab cc_all.32000.100extra.model
    spec-decode convert --from ~/hf/t5gemma-2b-2b-ul2 --to ckpt/t5gemma_2b \\
        --model_type t5gemma
    spec-decode convert --from ckpt/t5gemma_2b --to ~/hf/back \\
        --to_format huggingface

The output directory of our format holds parameters (orbax), `config.json`
and the vocabulary, and loads with `Model.load(DIR)` alone; from a T5Gemma
directory it also keeps the source's `config.json` as `hf_config.json`, so
that the way back writes the fields spec_decode does not model unchanged.
`--to_format huggingface` writes what transformers'
`T5GemmaForConditionalGeneration` / `T5Gemma2ForConditionalGeneration`
read (`t5gemma_export.py`; T5 directories: `huggingface.save_safetensors`).
`--model_type` states what the source must be: a source of another family
or version is refused before any weight is read.
"""

import argparse
import os
import shutil
import sys
import time

import jax
import numpy as np

from spec_decode import checkpoints
from spec_decode.checkpoints import gin_model
from spec_decode.checkpoints import huggingface
from spec_decode.checkpoints import loader
from spec_decode.checkpoints import t5gemma_export
from spec_decode.checkpoints import t5gemma_hf
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.byte_vocab import ByteVocabulary
from spec_decode.t5.config import T5Config
from spec_decode.t5gemma.config import T5GemmaConfig

OURS = 'ours'
HUGGING_FACE = 'huggingface'
MODEL_TYPES = ('t5', *t5gemma_hf.MODEL_TYPES)  # t5, t5gemma, t5gemma2


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog='spec-decode convert',
    description='Convert a Hugging Face T5 / T5Gemma directory or a T5X '
    'checkpoint into a spec_decode checkpoint directory, or a T5Gemma one '
    'of ours into a Hugging Face directory.',
  )
  p.add_argument(
    '--from',
    dest='source',
    required=True,
    help='Hugging Face T5 / T5Gemma directory, T5X checkpoint directory, '
    'or (--to_format huggingface) our T5Gemma directory',
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
  p.add_argument(
    '--to_format',
    choices=(OURS, HUGGING_FACE),
    default=OURS,
    help='ours (default), or huggingface: a directory transformers reads '
    '(from our T5Gemma / T5Gemma 2 directory)',
  )
  p.add_argument(
    '--model_type',
    choices=MODEL_TYPES,
    help='what the source must be (refused before any weight is read if '
    'it is another family or T5Gemma version)',
  )
  p.add_argument(
    '--max_shard_size',
    default='5GB',
    help='--to_format huggingface: safetensors shards of at most this size '
    '(default %(default)s, as transformers)',
  )
  return p


def main(argv=None) -> int:
  """Runs the conversion; returns a process exit code."""
  args = _parser().parse_args(argv)
  start = time.perf_counter()
  try:
    source_type = _source_type(args.source)
    if args.model_type and args.model_type != source_type:
      raise ValueError(
        f'{args.source} is a {_NAMES[source_type]} checkpoint, not '
        f'{_NAMES[args.model_type]} (--model_type {args.model_type})'
      )
    if args.to_format == HUGGING_FACE:
      ckpt, files = _to_hugging_face(args, source_type)
      what = f'{len(files)} files'
    else:
      ckpt = _to_ours(args, source_type)
      what = f'{_count(ckpt.params):,} parameters'
  except (OSError, ValueError) as e:
    print(f'spec-decode convert: error: {e}', file=sys.stderr)
    return 1
  print(
    f'converted {ckpt.format} checkpoint {args.source} -> {args.target} '
    f'({args.to_format}): {_describe(ckpt.config)}, {what} in '
    f'{time.perf_counter() - start:.1f}s'
  )
  if ckpt.vocabulary is None:
    print(
      'warning: no vocabulary stored (pass --vocab spiece.model, or '
      '--vocab byte for ByT5)',
      file=sys.stderr,
    )
  return 0


_NAMES = {'t5': 'T5', 't5gemma': 'T5Gemma', 't5gemma2': 'T5Gemma 2'}


def _source_type(path: str) -> str:
  """`t5`, `t5gemma` or `t5gemma2`, from the stored config alone."""
  fmt, directory = checkpoints.detect_format(path)
  if fmt == checkpoints.HUGGING_FACE and t5gemma_hf.is_t5gemma(directory):
    return huggingface.read_hf_config(directory)['model_type']
  if fmt == checkpoints.ORBAX:
    config = loader.stored_config(directory)
    if isinstance(config, T5GemmaConfig):
      return 't5gemma2' if config.version == 2 else 't5gemma'
  return 't5'


def _describe(config) -> str:
  if isinstance(config, T5GemmaConfig):
    name = _NAMES['t5gemma2' if config.version == 2 else 't5gemma']
    layers = f'{config.encoder.num_layers}+{config.decoder.num_layers}'
    return f'{name} ({layers} layers)'
  return str(config)


def _to_ours(args, source_type: str) -> checkpoints.Checkpoint:
  gemma = source_type != 't5'
  config = None
  if args.config:
    with open(args.config) as f:
      config = T5Config.from_json(f.read())
  vocabulary = None
  if args.vocab == 'byte':
    vocabulary = ByteVocabulary(extra_ids=args.extra_ids)
  elif args.vocab and gemma:
    vocabulary = t5gemma_hf.GemmaVocabulary.from_file(args.vocab, extra_ids=0)
  elif args.vocab:
    vocabulary = vocab_lib.Vocabulary.from_file(
      args.vocab, extra_ids=args.extra_ids
    )
  if args.gin_file:
    if config is not None:
      raise ValueError('pass --config or --gin_file, not both')
    search = [p for p in args.gin_search_paths.split(',') if p]
    config, gin_vocab = gin_model.read(args.gin_file, search_paths=search)
    vocabulary = vocabulary if vocabulary is not None else gin_vocab
  ckpt = checkpoints.read(
    args.source,
    config=config,
    dtype=args.dtype,
    vocabulary=vocabulary,
    progress=True,
  )
  checkpoints.write(args.target, ckpt.config, ckpt.params, ckpt.vocabulary)
  if ckpt.format == checkpoints.HUGGING_FACE and gemma:
    # The source's own config.json, for the way back (t5gemma_export).
    shutil.copyfile(
      os.path.join(args.source, huggingface.CONFIG_FILE),
      os.path.join(args.target, t5gemma_export.HF_CONFIG_FILE),
    )
  return ckpt


def _to_hugging_face(args, source_type: str):
  """(checkpoint read, files written) of `--to_format huggingface`."""
  fmt, directory = checkpoints.detect_format(args.source)
  if fmt != checkpoints.ORBAX:
    raise ValueError(
      f'{args.source} is a {fmt} checkpoint; --to_format huggingface '
      'writes our directories back (convert it to ours first, or use it as '
      'it is)'
    )
  if source_type == 't5':
    raise ValueError(
      f'{args.source} is a T5 checkpoint; --to_format huggingface writes '
      'T5Gemma and T5Gemma 2 ones (a T5 model: '
      'spec_decode.checkpoints.huggingface.save_safetensors)'
    )
  if args.config or args.gin_file or args.vocab:
    raise ValueError(
      '--to_format huggingface writes the stored config and vocabulary; '
      'drop --config, --gin_file and --vocab'
    )
  max_shard = t5gemma_export.parse_size(args.max_shard_size)
  if os.path.isdir(args.target) and os.listdir(args.target):
    raise FileExistsError(f'{args.target} exists and is not empty')
  ckpt = checkpoints.read(directory, dtype=args.dtype, progress=True)
  files = t5gemma_export.write(
    args.target,
    ckpt.config,
    ckpt.params,
    ckpt.vocabulary,
    base_config=t5gemma_export.read_base_config(directory),
    max_shard_bytes=max_shard,
  )
  return ckpt, files


def _count(params) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))

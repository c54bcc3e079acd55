"""`spec-decode verify`: is speculative decoding exact for this pair?

    spec-decode verify --target /ckpt/xxl --draft /ckpt/small
    spec-decode verify --target /ckpt/t5x_xxl/checkpoint_1000000 \\
        --target_gin_file t5x/examples/t5/t5_1_1/xxl.gin \\
        --draft /ckpt/t5x_small/checkpoint_1000000 \\
        --draft_gin_file t5x/examples/t5/t5_1_1/small.gin \\
        --gin_search_paths /src/t5x --vocab /ckpt/spiece.model
    spec-decode verify --target_gin_file models/t5_1_1/tiny.gin \\
        --draft_gin_file models/t5_1_1/tiny.gin --draft_seed 1   # random
    spec-decode verify --target /ckpt/xxl --draft_ngram outputs.txt
    spec-decode verify --target /ckpt/xxl --draft /ckpt/small --tree 3,2,1

Runs `sd.verify` (spec_decode/check/pair.py): greedy identity at
each gamma (or, with `--tree`, with that token tree: a branching such as
`3,2,1`, paths such as `[[0],[1],[0,0]]`, or `auto`, the tree path you
will run), and per sampling setting (temperature; with top-k; with top-p)
a zero-probability check, a PIT chi-square and an enumerated G-test of N
sampled sequences against the target's exact distribution. Prints the
verdict table with each check's sample size, statistic, p-value and
false-alarm rate (Bonferroni over the statistical checks).

A model comes from a checkpoint directory (ours, Hugging Face or T5X;
`--*_gin_file` gives a T5X checkpoint's hyperparameters) or, with only
`--*_gin_file`, is random weights of that network. `--draft_ngram` fits an
n-gram drafter on token files instead: text with one sequence of ids per
line (whitespace-separated), or a 2-D `.npy` int array (0 = padding).
`--inputs` reads encoder inputs in the same formats (default: random).

Exit status: 0 every check passed, 1 a check failed, 2 bad arguments
(checked before anything loads).
"""

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

import spec_decode as sd
from spec_decode.check import pair as pair_check
from spec_decode.core import inputs


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog='spec-decode verify',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  models = p.add_argument_group('models')
  for role, seed in (('target', 0), ('draft', 1)):
    models.add_argument(f'--{role}', help=f'{role} checkpoint directory')
    models.add_argument(
      f'--{role}_gin_file',
      help=f'model gin file: the hyperparameters of a T5X --{role}, or '
      f"alone random weights of that network (ours or T5X's own file)",
    )
    models.add_argument(
      f'--{role}_seed',
      type=int,
      default=seed,
      help='seed of random weights (default %(default)s)',
    )
  models.add_argument(
    '--draft_ngram',
    action='append',
    default=[],
    help='token file to fit an n-gram drafter on (repeatable)',
  )
  models.add_argument('--ngram_order', type=int, default=2)
  models.add_argument('--vocab', help='sentencepiece model (T5X checkpoints)')
  models.add_argument(
    '--gin_search_paths',
    default='',
    help='comma-separated directories gin includes are looked up in first',
  )
  checks = p.add_argument_group('checks')
  checks.add_argument('--inputs', help='encoder token file (default random)')
  checks.add_argument('--num_inputs', type=int, default=16)
  checks.add_argument('--max_decode_len', type=int, default=16)
  checks.add_argument('--gammas', default='1,3,5')
  checks.add_argument(
    '--tree',
    help="check tree= instead of gammas: '3,2,1', '[[0],[1],[0,0]]', 'auto'",
  )
  checks.add_argument('--num_samples', type=int, default=6000)
  checks.add_argument('--sample_len', type=int, default=3)
  checks.add_argument('--temperature', type=float, default=1.0)
  checks.add_argument(
    '--top_k', type=int, default=8, help='0: no top-k setting'
  )
  checks.add_argument(
    '--top_p', type=float, default=0.9, help='1: no top-p setting'
  )
  checks.add_argument('--bins', type=int, default=10)
  checks.add_argument('--false_alarm', type=float, default=1e-3)
  checks.add_argument('--batch_size', type=int, default=1000)
  checks.add_argument('--seed', type=int, default=0)
  checks.add_argument('--json', help='also write the report here as JSON')
  return p


class _BadArguments(ValueError):
  pass


def read_tokens(path: str) -> np.ndarray:
  """`[N, L] int32` from a `.npy` array or lines of ids (0-padded)."""
  if path.endswith('.npy'):
    arr = np.load(path)
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
      raise _BadArguments(f'{path}: need a 2-D int array, got {arr.shape}')
    return arr.astype(np.int32)
  with open(path, encoding='utf-8') as f:
    rows = [line.split() for line in f if line.strip()]
  if not rows:
    raise _BadArguments(f'{path}: no token sequences')
  try:
    ids = [[int(x) for x in row] for row in rows]
  except ValueError as e:
    raise _BadArguments(f'{path}: not whitespace-separated ids ({e})') from e
  out = np.zeros((len(ids), max(map(len, ids))), np.int32)
  for i, row in enumerate(ids):
    out[i, : len(row)] = row
  return out


def parse_tree(text: str):
  """`--tree`: 'auto', a branching '3,2,1' or paths '[[0],[1],[0,0]]'."""
  text = text.strip()
  if text.lower() == 'auto':
    return 'auto'
  try:
    if text.startswith('['):
      return [list(map(int, path)) for path in json.loads(text)]
    return tuple(int(b) for b in text.split(',') if b.strip())
  except (ValueError, TypeError) as e:
    raise _BadArguments(
      f"--tree: 'auto', branching like 3,2,1 or paths like [[0],[1]] ({e})"
    ) from e


def _checked(args) -> dict:
  """Everything `_run` needs, validated; raises `_BadArguments`."""
  if not (args.target or args.target_gin_file):
    raise _BadArguments('give --target and/or --target_gin_file')
  has_model_draft = bool(args.draft or args.draft_gin_file)
  if has_model_draft == bool(args.draft_ngram):
    raise _BadArguments(
      'give a draft: --draft and/or --draft_gin_file, or --draft_ngram'
    )
  for path in (args.target, args.draft):
    if path and not os.path.exists(path):
      raise _BadArguments(f'no such checkpoint directory: {path}')
  for path in (args.vocab, args.inputs, *args.draft_ngram):
    if path and not os.path.isfile(path):
      raise _BadArguments(f'no such file: {path}')
  search = [s for s in args.gin_search_paths.split(',') if s]
  for gin_file in (args.target_gin_file, args.draft_gin_file):
    if gin_file:
      try:  # Reads hyperparameters only: nothing is allocated.
        sd.T5Config.from_gin(gin_file, search_paths=search)
      except (OSError, ValueError) as e:
        raise _BadArguments(f'--*_gin_file {gin_file}: {e}') from e
  if args.ngram_order < 1:
    raise _BadArguments(f'--ngram_order must be >= 1, got {args.ngram_order}')
  try:
    gammas = inputs.parse_gammas(args.gammas, '--gammas')
  except ValueError as e:
    raise _BadArguments(f"{e} (comma-separated ints or 'auto')") from e
  tree = parse_tree(args.tree) if args.tree else None
  try:
    samplers = [sd.Sampler(args.temperature)]
    if args.top_k:
      samplers.append(sd.Sampler(args.temperature, top_k=args.top_k))
    if args.top_p != 1.0:
      samplers.append(sd.Sampler(args.temperature, top_p=args.top_p))
    settings = dict(
      gammas=gammas,
      num_inputs=args.num_inputs,
      max_decode_len=args.max_decode_len,
      samplers=tuple(samplers),
      num_samples=args.num_samples,
      sample_len=args.sample_len,
      batch_size=args.batch_size,
      bins=args.bins,
      false_alarm=args.false_alarm,
      seed=args.seed,
      tree=tree,
    )
    pair_check.validate(**settings)
  except ValueError as e:
    raise _BadArguments(str(e)) from e
  return dict(
    settings=settings,
    search=search,
    inputs=read_tokens(args.inputs) if args.inputs else None,
    ngram_data=[read_tokens(p) for p in args.draft_ngram],
  )


def load_model(path, gin_file, seed, vocabulary, search):
  """A checkpoint (T5X with `gin_file`), or random weights of `gin_file`."""
  if path:
    return sd.Model.load(
      path, gin_file=gin_file, vocabulary=vocabulary, search_paths=search
    )
  return sd.Model.from_gin(
    gin_file, seed=seed, vocabulary=vocabulary, search_paths=search
  )


def load_pair(args, checked: dict):
  """The target and the draft the flags describe."""
  search = checked['search']
  vocab = sd.Vocabulary.from_file(args.vocab) if args.vocab else None
  target = load_model(
    args.target, args.target_gin_file, args.target_seed, vocab, search
  )
  if args.draft_ngram:
    sequences = [row for data in checked['ngram_data'] for row in data]
    draft = sd.drafters.NGram.fit(
      sequences,
      n=args.ngram_order,
      vocab_size=target.vocab_size,
      vocabulary=target.vocabulary,
    )
  else:
    draft = load_model(
      args.draft, args.draft_gin_file, args.draft_seed, vocab, search
    )
  return target, draft


def _describe(args) -> str:
  def one(role):
    path, gin_file = getattr(args, role), getattr(args, f'{role}_gin_file')
    if path:
      return path + (f' ({gin_file})' if gin_file else '')
    return f'random {gin_file} (seed {getattr(args, f"{role}_seed")})'

  draft = (
    f'{args.ngram_order}-gram fit on {", ".join(args.draft_ngram)}'
    if args.draft_ngram
    else one('draft')
  )
  return f'target: {one("target")}\ndraft: {draft}'


def main(argv: list[str] | None = None) -> int:
  """Checks the pair; 0 all checks pass, 1 one fails, 2 bad arguments."""
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    args = _parser().parse_args(argv)
  except SystemExit as e:  # argparse: --help (0) or a usage error (2).
    return int(e.code or 0)
  try:
    checked = _checked(args)
  except _BadArguments as e:
    print(f'spec-decode verify: {e}', file=sys.stderr)
    return 2
  target, draft = load_pair(args, checked)
  try:
    report = sd.verify(
      target, draft, encoder_tokens=checked['inputs'], **checked['settings']
    )
  except ValueError as e:  # E.g. vocabularies that differ.
    print(f'spec-decode verify: {e}', file=sys.stderr)
    return 2
  print(_describe(args))
  print(report.table())
  if args.json:
    with open(args.json, 'w', encoding='utf-8') as f:
      json.dump(
        {'passed': report.passed, **dataclasses.asdict(report)}, f, indent=2
      )
  return 0 if report.passed else 1

"""`spec-decode train`: gin-configured training, in the manner of T5X.

    spec-decode train --gin_file=configs/train_demo_target.gin \\
        --model_dir=runs/demo/target [--gin.TRAIN_STEPS=2000]

A config binds `lm.train` (after `from spec_decode.train import lm`) to
train a T5 model (`spec_decode.train.lm`), or `heads.train_heads` (after
`from spec_decode.train import heads`, e.g. `configs/train_demo_heads.gin`)
to train Medusa heads on a frozen target (`spec_decode.train.heads`), or
`feature.train_feature` (after `from spec_decode.train import feature`,
e.g. `configs/train_demo_feature.gin`) to train an EAGLE-style feature
draft on a frozen target (`spec_decode.train.feature`); the flags are the
same. Rerunning the same command resumes from the last
checkpoint; Ctrl-C checkpoints and exits with status 130.

Flags:
  --gin_file FILE      repeatable (required); looked up as given, then in
                       the repo's `configs/` and `gin/` (`.gin` optional).
  --gin.NAME=VALUE     a gin binding `NAME = VALUE` (macros:
                       `--gin.TRAIN_STEPS=2000`; parameters:
                       `--gin.lm.train.seed=1`). A bare word is a string:
                       `--gin.TEACHER_PATH=runs/demo/target/model`.
  --gin_bindings B     repeatable; a binding as gin writes it (T5X's flag).
  --gin_search_paths D comma-separated directories `include` also searches.
  --model_dir DIR      the output directory (sets the MODEL_DIR macro).

The parsed config is written to `<model_dir>/config.gin`.

Two commands that are not one gin-configured run:

  spec-decode train pair --out_dir DIR [--tiny]   the demo pair on a GPU in
                                                  one go (`pair_job.py`)
  spec-decode train pair-unpack --from_dir DIR    its models reassembled
                                                  (`parts.py`)
"""

import argparse
import importlib
import os
import sys

from spec_decode import gin_cli
from spec_decode.train import feature
from spec_decode.train import heads
from spec_decode.train import lm

CONFIG_FILE = 'config.gin'
_PROG = 'spec-decode train'
# `spec-decode train NAME ...` -> the module whose `main(argv)` runs it.
_COMMANDS = {
  'pair': 'spec_decode.train.pair_job',
  'pair-unpack': 'spec_decode.train.parts',
}


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog=_PROG,
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  gin_cli.add_flags(parser)
  parser.add_argument(
    '--model_dir', default=None, help='output directory (sets MODEL_DIR)'
  )
  return parser


def main(argv: list[str] | None = None) -> int:
  """Parses flags and gin files, trains; returns an exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] in _COMMANDS:
    return int(importlib.import_module(_COMMANDS[argv[0]]).main(argv[1:]))
  parser = _parser()
  try:
    flag_bindings, rest = gin_cli.split_flags(argv)
  except gin_cli.GinFlagError as e:
    parser.error(str(e))
  args = parser.parse_args(rest)
  if not args.gin_file:
    parser.error('--gin_file is required (e.g. configs/train_demo_target.gin)')
  bindings = list(args.gin_bindings) + flag_bindings
  if args.model_dir:
    bindings.append(f'MODEL_DIR = {args.model_dir!r}')
  try:
    gin_cli.parse(
      args.gin_file, bindings, gin_cli.search_paths(args.gin_search_paths)
    )
  except gin_cli.GinFlagError as e:
    print(f'{_PROG}: {e}', file=sys.stderr)
    return 2
  if gin_cli.binds(feature.train_feature):
    run = gin_cli.configured(feature.train_feature)
  elif gin_cli.binds(heads.train_heads):
    run = gin_cli.configured(heads.train_heads)
  elif gin_cli.binds(lm.train):
    run = gin_cli.configured(lm.train)
  else:
    print(
      f'{_PROG}: the gin files bind none of lm.train, heads.train_heads '
      'and feature.train_feature (see configs/train_demo_target.gin)',
      file=sys.stderr,
    )
    return 2
  model_dir = gin_cli.macro('MODEL_DIR')
  if isinstance(model_dir, str):
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, CONFIG_FILE), 'w') as f:
      f.write(gin_cli.config_str())
  try:
    result = run()
  except FileNotFoundError as e:  # A vocabulary, target or teacher path.
    print(f'{_PROG}: {e}', file=sys.stderr)
    return 1
  return 130 if result.stopped == 'interrupted' else 0

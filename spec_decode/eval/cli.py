"""`spec-decode eval`: a gin-configured eval run, in the manner of T5X's eval.

    spec-decode eval --gin_file=configs/table2_ende_small_t0.gin \\
        --gin.TARGET_CHECKPOINT=/ckpt/xxl --gin.DRAFT_CHECKPOINT=/ckpt/small \\
        --gin.VOCABULARY=/ckpt/sentencepiece.model --gin.GAMMA=[3,5,7] \\
        --output_dir=/tmp/ende_small_t0

With no `--gin_file` it runs the embedded default,
`configs/demo_debian_ende.gin` (the trained demo pair on the offline Debian
EnDe task).

Flags:
  --gin_file FILE      repeatable; looked up as given, then under
                       --gin_search_paths, the repo's `configs/`, `gin/`
                       and root (a missing `.gin` is added).
  --gin_search_paths D comma-separated directories that `include` (and
                       --gin_file) also search.
  --gin.NAME=VALUE     a gin binding `NAME = VALUE` (macros: `--gin.GAMMA=7`;
                       parameters: `--gin.spec_eval.EvalSettings.seed=3`). A
                       bare word is taken as a string: `--gin.TASK=debian_ende`.
  --gin_bindings B     repeatable; a binding as gin writes it (T5X's flag).
  --output_dir DIR     where results go (default: the gin macro
                       EVAL_OUTPUT_DIR, else eval_results/<config name>).
  --overwrite          replace a run with other settings in DIR.
  --no_progress        no progress bar.

A config that also includes `runs/compare.gin` (and binds DRAFTS) runs
`spec_decode.eval.compare.compare`: one eval per drafter x temperature x
lenience x dynamic-gamma threshold, and a comparison table.

Run files (`gin/runs/eval.gin`) configure `spec_decode.eval.run.evaluate`,
its `EvalSettings` and `load_model` through gin's dynamic registration; this
module parses the flags (`spec_decode.gin_cli`) and calls the gin-configured
`evaluate` or `compare`, so the library itself carries no gin decorators.
The settings are built (and checked) before the models load. A rerun with
the same flags resumes an interrupted run.
"""

import argparse
import os
import sys

from spec_decode import gin_cli
from spec_decode import paths
from spec_decode.eval import compare
from spec_decode.eval import records
from spec_decode.eval import run as run_lib

DEFAULT_CONFIG = 'demo_debian_ende.gin'
DEFAULT_OUTPUT_ROOT = 'eval_results'
# The default run's checkpoints (see configs/demo_debian_ende.gin).
DEMO_CHECKPOINTS = ('checkpoints/demo/target', 'checkpoints/demo/draft')


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog='spec-decode eval',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  gin_cli.add_flags(p)
  p.add_argument('--output_dir', default=None)
  p.add_argument('--overwrite', action='store_true')
  p.add_argument('--no_progress', action='store_true')
  return p


def _missing_demo_checkpoints() -> list[str]:
  return [p for p in DEMO_CHECKPOINTS if not os.path.exists(paths.resolve(p))]


def _error(message: object) -> None:
  print(f'spec-decode eval: {message}', file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
  """Parses flags and gin files, runs `evaluate`; returns an exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    flag_bindings, rest = gin_cli.split_flags(argv)
  except gin_cli.GinFlagError as e:
    _error(e)
    return 2
  args = _parser().parse_args(rest)
  if not args.gin_file and not flag_bindings and _missing_demo_checkpoints():
    _error(
      'the default run (configs/demo_debian_ende.gin) needs the trained demo '
      f'pair, and {", ".join(_missing_demo_checkpoints())} does not exist '
      'yet.\nTrain it with `spec-decode train` (see the README), or run '
      'another config, e.g.\n'
      '  spec-decode eval --gin_file=configs/smoke_synthetic.gin'
    )
    return 1
  bindings = [*args.gin_bindings, *flag_bindings]
  if args.output_dir:
    bindings.append(f'EVAL_OUTPUT_DIR = {args.output_dir!r}')
  try:
    files = gin_cli.parse(
      args.gin_file or [DEFAULT_CONFIG],
      bindings,
      gin_cli.search_paths(args.gin_search_paths),
    )
  except gin_cli.GinFlagError as e:
    _error(e)
    return 2

  output_dir = _output_dir(files)
  fn = compare.compare if gin_cli.binds(compare.compare) else run_lib.evaluate
  kwargs = {'output_dir': output_dir}
  if args.overwrite:
    kwargs['overwrite'] = True
  if args.no_progress:
    kwargs['progress'] = False
  try:
    gin_cli.configured(fn)(**kwargs)
  except KeyboardInterrupt:
    print(
      f'\nspec-decode eval: interrupted; finished batches are saved in '
      f'{os.path.join(output_dir, records.EXAMPLES_FILE)}. Rerun the same '
      'command to resume.',
      file=sys.stderr,
    )
    return 130
  except (FileNotFoundError, ValueError) as e:
    _error(e)
    return 1
  with open(os.path.join(output_dir, 'config.gin'), 'w', encoding='utf-8') as f:
    f.write(gin_cli.operative_config())
  print(
    f'\nResults in {output_dir}/ ({records.RESULTS_FILE}, '
    f'{records.SUMMARY_FILE}, {records.EXAMPLES_FILE}, plots).'
  )
  return 0


def _output_dir(files: list[str]) -> str:
  value = gin_cli.macro('EVAL_OUTPUT_DIR')
  if value:
    return str(value)
  stem = os.path.splitext(os.path.basename(files[-1]))[0]
  return os.path.join(DEFAULT_OUTPUT_ROOT, stem)

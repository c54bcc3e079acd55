"""`spec-decode eval`: a gin-configured eval run, in the manner of T5X's eval.

    spec-decode eval --gin_file=configs/table2_ende_small_t0.gin \\
        --gin.CHECKPOINT_PATH=/ckpt/xxl --gin.DRAFT_CHECKPOINT=/ckpt/small \\
        --gin.VOCABULARY=/ckpt/sentencepiece.model --gin.GAMMA=[3,5,7] \\
        --output_dir=/tmp/ende_small_t0

A T5X eval or infer command runs with the draft added (T5X's macros, its
run files and model gin files: `eval/t5x_run_cli.py`):

    spec-decode eval --gin_file=t5x/examples/t5/t5_1_1/xxl.gin \\
        --gin_file=t5x/configs/runs/eval.gin --gin_search_paths=/src/t5x \\
        --gin.MIXTURE_OR_TASK_NAME=my_task \\
        --gin.MIXTURE_OR_TASK_MODULE=my_project.tasks \\
        --gin.CHECKPOINT_PATH=/ckpt/xxl/checkpoint_1000000 \\
        --gin.EVAL_OUTPUT_DIR=/tmp/eval \\
        --gin.DRAFT_CHECKPOINT=/ckpt/small/checkpoint_1000000 \\
        --gin.DRAFT_GIN_FILE=t5x/examples/t5/t5_1_1/small.gin --gin.GAMMA=7

With no `--gin_file` it runs the embedded default,
`configs/demo_debian_ende.gin` (the trained demo pair on the offline Debian
EnDe task).

Flags:
  --gin_file FILE      repeatable; looked up as given, then under
                       --gin_search_paths, the repo's `configs/`, `gin/`
                       and root (a missing `.gin` is added). T5X's
                       t5x/configs/runs/{eval,infer}.gin mean our
                       runs/eval.gin; a model gin file is the target's.
  --gin_search_paths D comma-separated directories that `include` (and
                       --gin_file) also search.
  --gin.NAME=VALUE     a gin binding `NAME = VALUE` (macros: `--gin.GAMMA=7`;
                       parameters: `--gin.spec_eval.EvalSettings.seed=3`). A
                       bare word is taken as a string: `--gin.TASK=debian_ende`.
  --gin_bindings B     repeatable; a binding as gin writes it (T5X's flag).
                       T5X's utils.DatasetConfig.{split,batch_size,...}
                       and RestoreCheckpointConfig.path set their macros.
  --output_dir DIR     where results go (default: the gin macro
                       EVAL_OUTPUT_DIR or INFER_OUTPUT_DIR, else
                       eval_results/<config name>).
  --overwrite          replace a run with other settings in DIR.
  --no_progress        no progress bar.
  --tfds_data_dir DIR  T5X's flag: the TFDS data directory (DATA_DIR).
  --alsologtostderr    T5X's flag; accepted, no effect.

Partitioned and multi-process runs: NUM_PARTITIONS (or T5X's
`partitioning.PjitPartitioner.num_partitions`, as a flag or in a gin file)
sets the `model` axis of the mesh, `data` takes the other devices; with
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID in the
environment every process runs this same command on one global mesh, reads
its share of the examples, and process 0 writes the files (see
docs/usage/scaling.md, "Running on a TPU mesh or several hosts").

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

import jax

from spec_decode import gin_cli
from spec_decode import paths
from spec_decode.eval import compare
from spec_decode.eval import records
from spec_decode.eval import run as run_lib
from spec_decode.eval import t5x_run_cli
from spec_decode.parallel import multihost

DEFAULT_CONFIG = 'demo_debian_ende.gin'
DEFAULT_OUTPUT_ROOT = 'eval_results'
# The default run's checkpoints (see configs/demo_debian_ende.gin).
DEMO_CHECKPOINTS = ('checkpoints/demo/target', 'checkpoints/demo/draft_seqkd')
# Macros of the former calibrated auto-γ: a config that still sets one is
# refused (they would be silently unused).
REMOVED_MACROS = ('CALIBRATION_BATCHES', 'CALIBRATION_GAMMA')


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
  # T5X's launcher flags, so that its command lines run unchanged.
  p.add_argument(
    '--tfds_data_dir', default=None, help='TFDS data directory (DATA_DIR)'
  )
  p.add_argument(
    '--alsologtostderr', action='store_true', help='accepted; no effect'
  )
  return p


def missing_demo_checkpoints() -> list[str]:
  return [p for p in DEMO_CHECKPOINTS if not os.path.exists(paths.resolve(p))]


def _error(message: object) -> None:
  print(f'spec-decode eval: {message}', file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
  """Parses flags and gin files, runs `evaluate`; returns an exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    args, flag_bindings = parse_args(argv)
  except gin_cli.GinFlagError as e:
    _error(e)
    return 2
  try:
    # Before anything touches JAX: joins the other processes when the
    # environment names a coordinator (docs/usage/scaling.md). `spec-decode
    # eval` has joined them already (spec_decode/main.py, which exits 2 on
    # a bad environment); this call serves a script that calls `main`.
    multihost.initialize()
  except ValueError as e:
    _error(e)
    return 2
  if not args.gin_file and not flag_bindings and missing_demo_checkpoints():
    _error(
      'the default run (configs/demo_debian_ende.gin) needs the trained demo '
      f'pair, and {", ".join(missing_demo_checkpoints())} does not exist '
      'yet.\nTrain it with `spec-decode train` (docs/usage/training.md), or '
      'run another config, e.g.\n'
      '  spec-decode eval --gin_file=configs/smoke_synthetic.gin'
    )
    return 1
  try:
    files = configure(args, flag_bindings)
  except (ImportError, ValueError) as e:  # GinFlagError, or gin's own.
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
  if jax.process_index() != 0:  # Process 0 writes the run's files.
    return 0
  with open(os.path.join(output_dir, 'config.gin'), 'w', encoding='utf-8') as f:
    f.write(gin_cli.operative_config())
  print(
    f'\nResults in {output_dir}/ ({records.RESULTS_FILE}, '
    f'{records.SUMMARY_FILE}, {records.EXAMPLES_FILE}, plots).'
  )
  return 0


def configure(args: argparse.Namespace, flag_bindings: list[str]) -> list[str]:
  """Parses the gin files and bindings of `args` (T5X's files and macros
  translated, aliases linked: `t5x_run_cli`); returns the files parsed.

  Raises:
    gin_cli.GinFlagError: a bad flag, a missing file, an unset required
      macro or a T5X binding with no counterpart.
  """
  search = gin_cli.search_paths(args.gin_search_paths)
  gin_files, model_file = t5x_run_cli.split_gin_files(
    args.gin_file or [DEFAULT_CONFIG], search
  )
  bindings = t5x_run_cli.translate([*args.gin_bindings, *flag_bindings])
  if model_file:
    bindings.insert(0, f'TARGET_MODEL_GIN = {model_file!r}')
  if search:
    bindings.insert(0, f'GIN_SEARCH_PATHS = {search!r}')
  if args.output_dir:
    bindings.append(f'EVAL_OUTPUT_DIR = {args.output_dir!r}')
  if args.tfds_data_dir:
    bindings.append(f'DATA_DIR = {args.tfds_data_dir!r}')
  bindings = t5x_run_cli.link_aliases(bindings)
  gin_files = gin_files or [t5x_run_cli.RUN_FILE]
  # T5X's run bindings inside the files, as macros between the files and
  # the command line.
  in_files, skip = t5x_run_cli.file_bindings(gin_files, search)
  files = gin_cli.parse(gin_files, in_files + bindings, search, skip=skip)
  links = t5x_run_cli.links_after_parse(bindings)
  if links:
    files = gin_cli.parse(
      gin_files, in_files + bindings + links, search, skip=skip
    )
  unset = object()
  for name in REMOVED_MACROS:
    if gin_cli.macro(name, unset) is not unset:
      raise gin_cli.GinFlagError(
        f"{name} is no longer used: GAMMA = 'auto' runs sd.generate's "
        'in-loop policy, which decodes nothing to choose γ; remove it '
        '(MAX_AUTO_GAMMA still bounds γ)'
      )
  return files


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """(flags, `--gin.NAME=VALUE` bindings) of a command line."""
  flag_bindings, rest = gin_cli.split_flags(argv)
  return _parser().parse_args(rest), flag_bindings


def _output_dir(files: list[str]) -> str:
  value = t5x_run_cli.resolved_macro('EVAL_OUTPUT_DIR')
  if value:
    return str(value)
  stem = os.path.splitext(os.path.basename(files[-1]))[0]
  return os.path.join(DEFAULT_OUTPUT_ROOT, stem)

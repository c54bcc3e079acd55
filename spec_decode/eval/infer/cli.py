"""`spec-decode infer`: T5X's infer.py with a draft, speculative only.

    spec-decode infer --gin_file=t5x/examples/t5/t5_1_1/xxl.gin \\
        --gin_file=t5x/configs/runs/infer.gin --gin_search_paths=/src/t5x \\
        --gin.MIXTURE_OR_TASK_NAME=my_task \\
        --gin.MIXTURE_OR_TASK_MODULE=my_project.tasks \\
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 512, 'targets': 128}" \\
        --gin.CHECKPOINT_PATH=/ckpt/xxl/checkpoint_1000000 \\
        --gin.INFER_OUTPUT_DIR=/tmp/infer \\
        --gin.DRAFT_CHECKPOINT=/ckpt/small/checkpoint_1000000 \\
        --gin.DRAFT_GIN_FILE=t5x/examples/t5/t5_1_1/small.gin --gin.GAMMA=7

writes `/tmp/infer/my_task-predict.jsonl-00000-of-00001` as T5X's infer.py
does (`inputs`, `prediction`; `--gin.infer.mode=predict_with_aux` adds
`aux.scores`), and `infer_summary.json` beside it. A file of inputs instead
of a task: `--gin.INPUT_FILE=inputs.txt` (one input per line) or a JSONL
file with `--gin.INPUT_FIELD=text` (and `--gin.ID_FIELD=id`);
`--gin.BAD_LINES=fail` makes a bad line an error (gin/runs/infer.gin).

With no `--gin_file` it runs the demo pair on the shipped Debian split
(`configs/demo_debian_ende.gin`, as `spec-decode eval` does) into
--output_dir (default infer_results/demo_debian_ende). Any eval config
runs too (`--gin_file=configs/smoke_synthetic.gin`): its task, models and
decode settings, decoded speculatively only.

Flags are `spec-decode eval`'s (gin files, bindings, T5X's macros and
aliases, the mesh and several processes; `spec-decode eval --help`), and:
  --output_dir DIR   where the files go (else INFER_OUTPUT_DIR).
  --overwrite        replace a run with other settings in DIR.
  --no_progress      no progress bar.
T5X's `infer.mode` and `infer.checkpoint_period` bindings set INFER_MODE
and CHECKPOINT_PERIOD. A rerun of the same command resumes after the last
chunk written (kill -9 included) and does nothing once the run completed.
"""

import os
import sys

import jax

from spec_decode import gin_cli
from spec_decode.eval import cli as eval_cli
from spec_decode.eval import t5x_run_cli
from spec_decode.eval.infer import chunks
from spec_decode.eval.infer import run as run_lib
from spec_decode.parallel import multihost

RUN_FILE = 'runs/infer.gin'
DEFAULT_OUTPUT_ROOT = 'infer_results'
# T5X's infer() parameters -> our macros.
_INFER_PARAMETERS = {
  'mode': 'INFER_MODE',
  'checkpoint_period': 'CHECKPOINT_PERIOD',
}


def _error(message: object) -> None:
  print(f'spec-decode infer: {message}', file=sys.stderr)


def translate(bindings: list[str]) -> list[str]:
  """T5X's `infer.mode` / `infer_script.infer.checkpoint_period` bindings
  as our macros; the rest as they are."""
  out = []
  for binding in bindings:
    name = t5x_run_cli.binding_name(binding) or ''
    parts = name.split('/')[-1].split('.')
    if (
      len(parts) >= 2
      and parts[-2] == 'infer'
      and parts[-1] in _INFER_PARAMETERS
      and parts[0] in ('infer', 'infer_script')
    ):
      value = binding.split('=', 1)[1]
      out.append(f'{_INFER_PARAMETERS[parts[-1]]} ={value}')
    else:
      out.append(binding)
  return out


def main(argv: list[str] | None = None) -> int:
  """Parses flags and gin files, runs `infer`; returns an exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if any(a in ('-h', '--help') for a in argv):
    print(__doc__)
    return 0
  try:
    args, flag_bindings = eval_cli.parse_args(argv)
    multihost.initialize()
  except (gin_cli.GinFlagError, ValueError) as e:
    _error(e)
    return 2
  default = not args.gin_file
  if default and not flag_bindings and eval_cli.missing_demo_checkpoints():
    _error(
      'the default run (configs/demo_debian_ende.gin) needs the trained '
      'demo pair; train it with `spec-decode train`, or run another '
      'config, e.g.\n  spec-decode infer --gin_file=configs/smoke_synthetic.gin'
    )
    return 1
  args.gin_file = [RUN_FILE, *(args.gin_file or [eval_cli.DEFAULT_CONFIG])]
  args.gin_bindings = translate(args.gin_bindings)
  try:
    files = eval_cli.configure(args, translate(flag_bindings))
  except (ImportError, ValueError) as e:
    _error(e)
    return 2
  output_dir = output_dir_of(files)
  kwargs = {'output_dir': output_dir}
  if args.overwrite:
    kwargs['overwrite'] = True
  if args.no_progress:
    kwargs['progress'] = False
  try:
    summary = gin_cli.configured(run_lib.infer)(**kwargs)
  except KeyboardInterrupt:
    _error(
      f'interrupted; the chunks written are kept in {output_dir}. Rerun '
      'the same command to resume.'
    )
    return 130
  except (FileNotFoundError, ValueError) as e:
    _error(e)
    return 1
  if jax.process_index() == 0:
    rate = summary.get('examples_per_second')
    print(
      f'spec-decode infer: {summary["examples"]} predictions in '
      f'{output_dir}/ ({", ".join(summary["files"])}; '
      f'{chunks.SUMMARY_FILE}); '
      + (f'{rate:.2f} examples/s' if rate else 'nothing decoded now')
    )
  return 0


def output_dir_of(files: list[str]) -> str:
  """INFER_OUTPUT_DIR (--output_dir sets it), else
  infer_results/<the last config's name>."""
  value = t5x_run_cli.resolved_macro('INFER_OUTPUT_DIR')
  if value:
    return str(value)
  stem = os.path.splitext(os.path.basename(files[-1]))[0]
  return os.path.join(DEFAULT_OUTPUT_ROOT, stem)

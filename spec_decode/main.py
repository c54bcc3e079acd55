"""The `spec-decode` command line: one subcommand per job.

spec-decode demo     short end-to-end decode on random tiny models
spec-decode eval     gin-configured eval run (plain vs speculative)
spec-decode infer    T5X's infer.py with a draft: speculative predictions
spec-decode train    gin-configured training (the demo pair)
spec-decode bench    speed, measured side by side (--quick: < 3 minutes)
spec-decode theory   the paper's section 3 tables and figures
spec-decode convert  Hugging Face / T5X checkpoint -> our orbax format; a
                     T5Gemma one back to Hugging Face
spec-decode data     build the offline Debian data; train the demo vocabulary
spec-decode verify   is a target/draft pair exact? greedy identity and a
                     whole-sequence distribution test
spec-decode build-kernel  compile the small-M CPU kernel (make install does)

`spec-decode <command> --help` describes each. This is the only entry point:
no module of the package runs as `python -m` on its own.
"""

import importlib
import sys

# Subcommand -> module with `main(argv) -> int`. Imported lazily so that
# `spec-decode theory` does not pay for JAX start-up, and so on.
_COMMANDS = {
  'demo': 'spec_decode.demo',
  'eval': 'spec_decode.eval.cli',
  'infer': 'spec_decode.eval.infer.cli',
  'train': 'spec_decode.train.cli',
  'bench': 'spec_decode.bench.cli',
  'theory': 'spec_decode.theory.cli',
  'convert': 'spec_decode.checkpoints.convert',
  'data': 'spec_decode.data.cli',
  'verify': 'spec_decode.eval.verify_cli',
  'build-kernel': 'spec_decode.kernels.build',
}
_DEFAULT = 'demo'
# Jobs that may run on a TPU pod: every host joins before JAX is used.
_MULTIHOST = ('eval', 'infer', 'bench', 'train')


def run(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] in ('-h', '--help'):
    print(__doc__)
    return 0
  command = argv.pop(0) if argv and not argv[0].startswith('-') else _DEFAULT
  if command not in _COMMANDS:
    print(
      f'spec-decode: unknown command {command!r}; one of '
      f'{", ".join(sorted(_COMMANDS))}',
      file=sys.stderr,
    )
    return 2
  if command in _MULTIHOST:
    from spec_decode.parallel import multihost  # pylint: disable=g-import-not-at-top

    try:  # Before the job loads anything (docs/usage/scaling.md).
      multihost.initialize()
    except ValueError as e:  # A bad JAX_NUM_PROCESSES, JAX_PROCESS_ID, ...
      print(f'spec-decode {command}: {e}', file=sys.stderr)
      return 2
  module = importlib.import_module(_COMMANDS[command])
  return int(module.main(argv) or 0)


if __name__ == '__main__':
  raise SystemExit(run())

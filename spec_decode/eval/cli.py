"""`spec-decode eval`: a gin-configured eval run, in the manner of T5X's eval.

    spec-decode eval --gin_file=configs/table2_ende_small_t0.gin \\
        --gin.TARGET_CHECKPOINT=/ckpt/xxl --gin.DRAFT_CHECKPOINT=/ckpt/small \\
        --gin.VOCABULARY=/ckpt/sentencepiece.model --gin.GAMMA=[3,5,7] \\
        --output_dir=/tmp/ende_small_t0

With no `--gin_file` it runs the embedded default,
`configs/demo_debian_ende.gin` (the trained demo pair on the offline Debian
EnDe task).

Flags:
  --gin_file FILE      repeatable; looked up as given, then in the repo's
                       `configs/` and `gin/` (a missing `.gin` is added).
  --gin.NAME=VALUE     a gin binding `NAME = VALUE` (macros: `--gin.GAMMA=7`;
                       parameters: `--gin.spec_eval.evaluate.seed=3`). A bare
                       word is taken as a string: `--gin.TASK=debian_ende`.
  --gin_bindings B     repeatable; a binding as gin writes it (T5X's flag).
  --output_dir DIR     where results go (default: the gin macro
                       EVAL_OUTPUT_DIR, else eval_results/<config name>).
  --overwrite          replace a run with other settings in DIR.
  --no_progress        no progress bar.

A config that also includes `runs/compare.gin` (and binds DRAFTS) runs
`spec_decode.eval.compare.compare`: one eval per drafter x temperature x
lenience x dynamic-gamma threshold, and a comparison table.

Run files (`gin/runs/eval.gin`) configure `spec_decode.eval.evaluate` and
`spec_decode.eval.load_model` through gin's dynamic registration; this module
parses the flags and calls the gin-configured `evaluate`
(`gin.get_configurable`), so the library itself carries no gin decorators.
A rerun with the same flags resumes an interrupted run.
"""

import argparse
import ast
import os
import re
import sys

import gin
from spec_decode.checkpoints import gin_model
from spec_decode.eval import compare
from spec_decode.eval import run as eval_lib

CONFIGS_DIR = os.path.join(eval_lib.REPO_DIR, 'configs')
DEFAULT_CONFIG = 'demo_debian_ende.gin'
DEFAULT_OUTPUT_ROOT = 'eval_results'
# The default run's checkpoints (see configs/demo_debian_ende.gin).
DEMO_CHECKPOINTS = ('checkpoints/demo/target', 'checkpoints/demo/draft')

_REQUIRED = re.compile(r'(\w+)/macro\.value set to `%gin\.REQUIRED`')
_IDENTIFIER = re.compile(r'[A-Za-z_./~][\w\-./~]*$')
_GIN_WORDS = {'True', 'False', 'None'}


def resolve_gin_file(name: str) -> str:
  """A gin file as given, else under `configs/`, `gin/` or the repo root."""
  names = [name] if name.endswith('.gin') else [name, name + '.gin']
  for n in names:
    for root in ('', CONFIGS_DIR, gin_model.GIN_DIR, eval_lib.REPO_DIR):
      path = os.path.join(root, n) if root else n
      if os.path.isfile(path):
        # Absolute: gin would otherwise log a miss per search prefix.
        return os.path.abspath(path)
  raise FileNotFoundError(
    f'gin file not found: {name} (also looked in {CONFIGS_DIR} and '
    f'{gin_model.GIN_DIR})'
  )


def add_search_paths() -> None:
  """Lets `include` find files under `gin/`, `configs/` and the repo root.

  They go before gin's default prefix '' (the working directory): gin's
  package-resource reader crashes on an include like 'runs/eval.gin' when
  the working directory holds a `runs/` directory without `__init__.py`.
  """
  prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
  for i, path in enumerate(
    (gin_model.GIN_DIR, CONFIGS_DIR, eval_lib.REPO_DIR)
  ):
    if path in prefixes:
      prefixes.remove(path)
    prefixes.insert(i, path)


def binding_from_flag(flag: str) -> str:
  """`--gin.NAME=VALUE` -> `NAME = VALUE` (a bare word becomes a string)."""
  body = flag[len('--gin.') :]
  if '=' not in body:
    raise ValueError(f'{flag}: expected --gin.NAME=VALUE')
  name, value = body.split('=', 1)
  value = value.strip()
  if _IDENTIFIER.match(value) and value not in _GIN_WORDS:
    try:
      ast.literal_eval(value)
    except (ValueError, SyntaxError):
      value = repr(value)
  return f'{name.strip()} = {value}'


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog='spec-decode eval',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument('--gin_file', action='append', default=[])
  p.add_argument('--gin_bindings', action='append', default=[])
  p.add_argument('--output_dir', default=None)
  p.add_argument('--overwrite', action='store_true')
  p.add_argument('--no_progress', action='store_true')
  return p


def _missing_demo_checkpoints() -> list[str]:
  return [
    p for p in DEMO_CHECKPOINTS if not os.path.exists(eval_lib.resolve_path(p))
  ]


def main(argv: list[str] | None = None) -> int:
  """Parses flags and gin files, runs `evaluate`; returns an exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  gin_flags = [a for a in argv if a.startswith('--gin.')]
  args = _parser().parse_args([a for a in argv if not a.startswith('--gin.')])
  try:
    bindings = list(args.gin_bindings) + [
      binding_from_flag(f) for f in gin_flags
    ]
    names = args.gin_file or [DEFAULT_CONFIG]
    files = [resolve_gin_file(n) for n in names]
  except (ValueError, FileNotFoundError) as e:
    print(f'spec-decode eval: {e}', file=sys.stderr)
    return 2
  if not args.gin_file and not gin_flags and _missing_demo_checkpoints():
    print(
      'spec-decode eval: the default run (configs/demo_debian_ende.gin) '
      'needs the trained demo pair, and '
      f'{", ".join(_missing_demo_checkpoints())} does not exist yet.\n'
      'Train it with `spec-decode train` (see the README), or run another '
      'config, e.g.\n  spec-decode eval --gin_file=configs/smoke_synthetic.gin',
      file=sys.stderr,
    )
    return 1
  if args.output_dir:
    bindings.append(f'EVAL_OUTPUT_DIR = {args.output_dir!r}')

  gin.clear_config()
  add_search_paths()
  try:
    gin.parse_config_files_and_bindings(files, bindings)
  except ValueError as e:
    m = _REQUIRED.search(str(e))
    if m:
      print(
        f'spec-decode eval: {m.group(1)} is required; set it with '
        f'--gin.{m.group(1)}=... (or in a --gin_file)',
        file=sys.stderr,
      )
      return 2
    raise
  output_dir = _output_dir(files)
  run = gin.get_configurable(eval_lib.evaluate)
  kwargs = {'output_dir': output_dir}
  if _binds_compare():
    run = gin.get_configurable(compare.compare)
  if args.overwrite:
    kwargs['overwrite'] = True
  if args.no_progress:
    kwargs['progress'] = False
  try:
    run(**kwargs)
  except KeyboardInterrupt:
    print(
      f'\nspec-decode eval: interrupted; finished batches are saved in '
      f'{os.path.join(output_dir, eval_lib.EXAMPLES_FILE)}. Rerun the same '
      'command to resume.',
      file=sys.stderr,
    )
    return 130
  except (FileNotFoundError, ValueError) as e:
    print(f'spec-decode eval: {e}', file=sys.stderr)
    return 1
  with open(os.path.join(output_dir, 'config.gin'), 'w', encoding='utf-8') as f:
    f.write(gin.operative_config_str())
  print(
    f'\nResults in {output_dir}/ ({eval_lib.RESULTS_FILE}, '
    f'{eval_lib.SUMMARY_FILE}, {eval_lib.EXAMPLES_FILE}, plots).'
  )
  return 0


def _binds_compare() -> bool:
  """True when the config is a comparison (binds `compare`'s drafts)."""
  try:
    return bool(gin.get_bindings(compare.compare))
  except ValueError:
    return False


def _output_dir(files: list[str]) -> str:
  try:
    value = gin.query_parameter('%EVAL_OUTPUT_DIR')
  except ValueError:
    value = None
  if value:
    return str(value)
  stem = os.path.splitext(os.path.basename(files[-1]))[0]
  return os.path.join(DEFAULT_OUTPUT_ROOT, stem)


if __name__ == '__main__':
  raise SystemExit(main())

"""The one place that turns command-line gin flags into gin configuration.

Every gin-configured subcommand (`spec-decode eval`, `spec-decode train`)
accepts the flags T5X's launchers accept, parsed the same way:

  --gin_file=F          a gin file (repeatable): a path, or relative to the
                        repo's `configs/`, `gin/` or root; `.gin` optional.
  --gin_search_paths=D  comma-separated directories `include` also searches
                        (T5X's flag; the working directory is always last).
  --gin.NAME=VALUE      a binding `NAME = VALUE` (macros: `--gin.GAMMA=7`,
                        parameters: `--gin.spec_eval.EvalSettings.seed=3`); a
                        bare word is a string (`--gin.TASK=debian_ende`).
                        `--gin.NAME VALUE` is the same.
  --gin_bindings=B      a raw binding `NAME = VALUE` (repeatable).

The library has no gin decorators: gin files register its functions
dynamically (`from __gin__ import dynamic_registration`) and the CLI calls
`gin.get_configurable(fn)`.
"""

import argparse
import ast
import os
import re
from collections.abc import Sequence
from typing import Any

import gin
from spec_decode import paths

_REQUIRED = re.compile(r'(\w+)/macro\.value set to `%gin\.REQUIRED`')
_BARE_WORD = re.compile(r'[A-Za-z_./~][\w\-./~]*$')
_GIN_WORDS = {'True', 'False', 'None'}


class GinFlagError(ValueError):
  """A bad gin flag, a missing gin file or an unset required macro."""


def add_flags(parser: argparse.ArgumentParser) -> None:
  """Adds `--gin_file`, `--gin_bindings` and `--gin_search_paths`."""
  parser.add_argument(
    '--gin_file', action='append', default=[], help='gin file (repeatable)'
  )
  parser.add_argument(
    '--gin_bindings',
    action='append',
    default=[],
    help='a binding NAME = VALUE (repeatable); or --gin.NAME=VALUE',
  )
  parser.add_argument(
    '--gin_search_paths',
    default='',
    help='comma-separated directories that `include` also searches',
  )


def binding_from_flag(name: str, value: str) -> str:
  """`NAME`, `VALUE` -> `NAME = VALUE`; a bare word becomes a string."""
  value = value.strip()
  if _BARE_WORD.match(value) and value not in _GIN_WORDS:
    try:
      ast.literal_eval(value)
    except (ValueError, SyntaxError):
      value = repr(value)
  return f'{name.strip()} = {value}'


def split_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Separates `--gin.NAME=VALUE` / `--gin.NAME VALUE` flags from the rest.

  Returns:
    (bindings, other arguments).
  """
  bindings, rest = [], []
  args = iter(argv)
  for arg in args:
    if not arg.startswith('--gin.'):
      rest.append(arg)
      continue
    body = arg[len('--gin.') :]
    if '=' in body:
      name, value = body.split('=', 1)
    else:
      value = next(args, None)
      if value is None or value.startswith('--'):
        raise GinFlagError(f'{arg}: expected --gin.NAME=VALUE')
      name = body
    if not name.strip():
      raise GinFlagError(f'{arg}: expected --gin.NAME=VALUE')
    bindings.append(binding_from_flag(name, value))
  return bindings, rest


def resolve_file(name: str, search_paths: Sequence[str] = ()) -> str:
  """A gin file as given, else under the search paths, `configs/`, `gin/`
  or the repository root (absolute, so gin logs no misses)."""
  names = [name] if name.endswith('.gin') else [name, name + '.gin']
  roots = ('', *search_paths, paths.CONFIGS_DIR, paths.GIN_DIR, paths.REPO_DIR)
  for n in names:
    for root in roots:
      path = os.path.join(root, n) if root else n
      if os.path.isfile(path):
        return os.path.abspath(path)
  raise GinFlagError(
    f'gin file not found: {name} (also looked in '
    f'{", ".join(r for r in roots[1:])})'
  )


def search_paths(flag_value: str) -> list[str]:
  """`--gin_search_paths` (comma-separated) -> absolute directories."""
  return [os.path.abspath(p) for p in flag_value.split(',') if p.strip()]


def _set_search_paths(extra: Sequence[str]) -> None:
  # Ours before gin's default prefix '' (the working directory): gin's
  # package-resource reader crashes on an include like 'runs/eval.gin' when
  # the working directory holds a `runs/` directory without `__init__.py`.
  # gin has no public call to put a prefix first; this is the one place
  # that touches its list.
  prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
  wanted = [*extra, paths.GIN_DIR, paths.CONFIGS_DIR, paths.REPO_DIR]
  for path in wanted:
    if path in prefixes:
      prefixes.remove(path)
  prefixes[:0] = wanted


def parse(
  gin_files: Sequence[str],
  bindings: Sequence[str],
  gin_search_paths: Sequence[str] = (),
  finalize: bool = True,
  skip: Sequence[str] = (),
) -> list[str]:
  """Clears gin, then parses files and bindings (later ones win).

  `skip`: configurables (`module.Name`) whose bindings gin skips; with any,
  gin also skips imports it cannot make (T5X's `from t5x import ...`).

  Returns:
    The resolved gin file paths.

  Raises:
    GinFlagError: a file is missing or a `%gin.REQUIRED` macro is unset
      (the message names the flag that sets it).
  """
  files = [resolve_file(f, gin_search_paths) for f in gin_files]
  gin.clear_config()
  _set_search_paths(gin_search_paths)
  try:
    gin.parse_config_files_and_bindings(
      files,
      list(bindings),
      finalize_config=finalize,
      skip_unknown=list(skip) or False,
    )
  except ValueError as e:
    m = _REQUIRED.search(str(e))
    if m:
      raise GinFlagError(
        f'{m.group(1)} is required; set it with --gin.{m.group(1)}=... '
        '(or in a --gin_file)'
      ) from e
    raise
  return files


def macro(name: str, default: Any = None) -> Any:
  """The value of macro `name` in the parsed config, or `default`."""
  try:
    return gin.query_parameter(f'%{name}')
  except ValueError:
    return default


def binds(fn: Any) -> bool:
  """Whether the parsed config binds any parameter of `fn`."""
  try:
    # Unresolved: resolving would build every bound object (load models).
    return bool(gin.get_bindings(fn, resolve_references=False))
  except ValueError:
    return False


def configured(fn: Any) -> Any:
  """`fn` with the parsed config's bindings applied."""
  return gin.get_configurable(fn)


def operative_config() -> str:
  return gin.operative_config_str()


def config_str() -> str:
  return gin.config_str()

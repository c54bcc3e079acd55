"""T5Configs from gin model files: a file format, read without gin's state.

The files in `gin/models/` mirror T5X's `t5x/examples/t5/t5_1_{0,1}/*.gin`: a
`base.gin` per family binds every field of `T5Config`, and each size
(`small.gin`, ..., `xxl.gin`, `11B.gin`, `tiny.gin`) includes it and
overrides the size fields.

    cfg = config_from_gin('models/t5_1_1/xxl.gin')
    cfg = config_from_gin('models/t5_1_1/tiny.gin', vocab_size=128)

This module reads such a file the way a checkpoint reader reads a checkpoint:
with gin's syntax parser only (`gin.config_parser`), following `include`s and
evaluating macros itself. It never touches gin's global configuration (a
run's own `--gin_file`s stay as they are) and never imports the modules a
file names, so a file whose imports are not installed still reads. Bindings
of any `<module>.T5Config` selector count (ours say `config.T5Config`, T5X's
`network.T5Config`); other bindings are not the network's and are skipped.
"""

import os
from collections.abc import Sequence
from typing import Any

from gin import config_parser
from spec_decode import paths
from spec_decode.t5.config import T5Config

GIN_DIR = paths.GIN_DIR

MODEL_FILES = {
  't5_1_1_small': 'models/t5_1_1/small.gin',
  't5_1_1_base': 'models/t5_1_1/base.gin',
  't5_1_1_large': 'models/t5_1_1/large.gin',
  't5_1_1_xl': 'models/t5_1_1/xl.gin',
  't5_1_1_xxl': 'models/t5_1_1/xxl.gin',
  't5_1_1_tiny': 'models/t5_1_1/tiny.gin',
  't5_small': 'models/t5_1_0/small.gin',
  't5_base': 'models/t5_1_0/base.gin',
  't5_large': 'models/t5_1_0/large.gin',
  't5_3B': 'models/t5_1_0/3B.gin',
  't5_11B': 'models/t5_1_0/11B.gin',
  't5_tiny': 'models/t5_1_0/tiny.gin',
}

_CONFIG_SELECTOR = 'T5Config'
_MAX_INCLUDE_DEPTH = 32


class _Macro:
  """A `%NAME` reference, resolved after every file is read."""

  def __init__(self, name: str):
    self.name = name


class _Reference:
  """A `@name` / `@name()` reference: not a plain value."""

  def __init__(self, name: str, evaluate: bool):
    self.name, self.evaluate = name, evaluate


class _Delegate(config_parser.ParserDelegate):
  def configurable_reference(self, scoped_configurable_name, evaluate):
    return _Reference(scoped_configurable_name, evaluate)

  def macro(self, macro_name):
    return _Macro(macro_name)


def resolve(gin_file: str, search_paths: Sequence[str] = ()) -> str:
  """A path as given, else under `search_paths` or `gin/`, else a
  `MODEL_FILES` name."""
  gin_file = os.fspath(gin_file)
  candidates = [gin_file]
  candidates += [os.path.join(p, gin_file) for p in (*search_paths, GIN_DIR)]
  if gin_file in MODEL_FILES:
    candidates.append(os.path.join(GIN_DIR, MODEL_FILES[gin_file]))
  for c in candidates:
    if os.path.isfile(c):
      return c
  raise FileNotFoundError(
    f'gin model file not found: {gin_file} (also looked in '
    f'{", ".join([*search_paths, GIN_DIR])}; names: {sorted(MODEL_FILES)})'
  )


class _Reader:
  """Collects macro values and T5Config bindings, in file order."""

  def __init__(self, search_paths: Sequence[str]):
    self.search_paths = list(search_paths)
    self.macros: dict[str, Any] = {}
    self.fields: dict[str, Any] = {}

  def read_file(self, path: str, depth: int = 0) -> None:
    if depth > _MAX_INCLUDE_DEPTH:
      raise ValueError(f'{path}: includes nest deeper than {depth}')
    with open(path, encoding='utf-8') as f:
      text = f.read()
    # Includes resolve against the search paths, as gin's do, and then next
    # to the including file (T5X's files include siblings by full path).
    here = [*self.search_paths, os.path.dirname(path)]
    self.read_text(text, path, here, depth)

  def read_text(
    self, text: str, origin: str, include_paths: Sequence[str], depth: int
  ) -> None:
    try:
      statements = list(config_parser.ConfigParser(text, _Delegate()))
    except SyntaxError as e:
      raise ValueError(f'{origin}: {e}') from e
    for st in statements:
      if isinstance(st, config_parser.IncludeStatement):
        self.read_file(resolve(st.filename, include_paths), depth + 1)
      elif isinstance(st, config_parser.BindingStatement):
        self._bind(st)

  def _bind(self, st: config_parser.BindingStatement) -> None:
    if not st.arg_name:  # `NAME = value` defines a macro.
      self.macros[st.selector] = st.value
    elif st.selector.split('.')[-1] == _CONFIG_SELECTOR:
      self.fields[st.arg_name] = st.value

  def value(self, value: Any, seen: tuple[str, ...] = ()) -> Any:
    if isinstance(value, _Macro):
      if value.name == 'gin.REQUIRED':
        raise ValueError(f'a T5Config field is %gin.REQUIRED ({seen})')
      if value.name in seen:
        raise ValueError(f'macro cycle: {" -> ".join(seen + (value.name,))}')
      if value.name not in self.macros:
        raise ValueError(f'macro %{value.name} is used but never set')
      return self.value(self.macros[value.name], seen + (value.name,))
    if isinstance(value, _Reference):
      raise ValueError(
        f'@{value.name}: a T5Config field must be a plain value or a macro'
      )
    if isinstance(value, (list, tuple)):
      return type(value)(self.value(v, seen) for v in value)
    return value


def config_from_gin(
  gin_file: str,
  bindings: Sequence[str] = (),
  search_paths: Sequence[str] = (),
  **overrides,
) -> T5Config:
  """The `T5Config` a gin model file binds.

  Args:
    gin_file: a path, a path relative to `gin/` (`models/t5_1_1/base.gin`)
      or a `MODEL_FILES` name (`t5_1_1_xxl`).
    bindings: extra bindings read after the file, e.g.
      `("ACTIVATION_DTYPE = 'bfloat16'",)`.
    search_paths: directories `include`s are also looked up in.
    **overrides: `T5Config` fields replaced after reading.

  Returns:
    The config.

  Raises:
    FileNotFoundError: the file or one it includes does not exist.
    ValueError: a syntax error, an unknown T5Config field or an unset macro.
  """
  reader = _Reader(search_paths)
  path = resolve(gin_file, search_paths)
  reader.read_file(path)
  for binding in bindings:
    reader.read_text(binding, 'bindings', reader.search_paths, 0)
  known = {f.name for f in T5Config.__dataclass_fields__.values()}
  unknown = sorted(set(reader.fields) - known)
  if unknown:
    raise ValueError(f'{path}: T5Config has no field(s) {unknown}')
  fields = {k: reader.value(v, (k,)) for k, v in reader.fields.items()}
  if 'vocab_size' not in fields and 'vocab_size' not in overrides:
    raise ValueError(f'{path}: binds no T5Config.vocab_size')
  fields.update(overrides)
  return T5Config(**fields)

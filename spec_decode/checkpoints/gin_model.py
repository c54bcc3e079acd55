"""Model gin files -> a config: `T5Config` or `T5GemmaConfig`.

The one entry that turns a model gin file (an eval run's `TARGET_MODEL_GIN`
/ `DRAFT_GIN_FILE` or `--gin_file`, `Model.load(gin_file=...)`,
`spec-decode convert --gin_file`) into hyperparameters:

  * a T5 file (ours in `gin/models/t5_1_*`, or T5X's own) binds
    `T5Config` fields: `T5Config.read_gin` reads it (`t5/gin_file.py`);
  * a T5Gemma file (`gin/models/t5gemma*/`) binds `config.T5GemmaConfig`
    with `@encoder/config.pattern_stack()` / `@config.Rope()` references:
    read here, evaluated as gin would (below), without touching gin's
    global configuration (an eval run reads both models' files while its own
    run configuration is live).

Gin's semantics kept: `include`s (resolved as `t5/gin_file.py` resolves
them), macros, later bindings win; a call in scope `a/b` takes the
bindings of its selector unscoped, then `a/`, then `a/b/` (each overriding
the last); a reference `@s/name()` is evaluated in scope `s` whatever scope
it appears in, an unscoped `@name()` in the scope of the call it appears in.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

from gin import config_parser
from spec_decode.t5 import gin_file
from spec_decode.t5.config import T5Config
from spec_decode.t5gemma import config as t5gemma_config

# The configurables a T5Gemma model file calls (by their last name).
_CALLABLES = {
  'T5GemmaConfig': t5gemma_config.T5GemmaConfig,
  'StackConfig': t5gemma_config.StackConfig,
  'pattern_stack': t5gemma_config.pattern_stack,
  'Rope': t5gemma_config.Rope,
}
_TOP = 'T5GemmaConfig'
_MAX_DEPTH = 32


def is_t5gemma(model_file: gin_file.ModelFile) -> bool:
  """Whether a model file read by `gin_file.read` binds `T5GemmaConfig`
  (T5 files bind `T5Config`; `gin_file` skips the other bindings)."""
  return any(_name(b.rsplit('.', 1)[0]) == _TOP for b in model_file.skipped)


def read(
  path: str,
  bindings: Sequence[str] = (),
  search_paths: Sequence[str] = (),
  **overrides,
) -> tuple[Any, Any]:
  """(config, vocabulary) of a model gin file, T5 or T5Gemma.

  Args:
    path: a path, one relative to `gin/` (`models/t5gemma/2b_2b.gin`), or
      a T5 short name (`t5_1_1_xxl`).
    bindings: gin statements read after the file
      (`"config.pattern_stack.num_layers = 2"`).
    search_paths: where includes are looked up first.
    **overrides: config fields replaced after reading (`vocab_size=64`).

  Returns:
    `(T5Config or T5GemmaConfig, the local vocabulary the file names or
    None)`; T5Gemma files name none.

  Raises:
    FileNotFoundError: the file or one it includes does not exist.
    ValueError: what the file binds cannot make a config (the message
      names the binding).
  """
  model_file = gin_file.read(path, bindings, search_paths)
  if not is_t5gemma(model_file):
    model_file = T5Config.read_gin(path, bindings, search_paths)
    config = T5Config.from_model_file(model_file, **overrides)
    return config, model_file.local_vocabulary()
  if model_file.config:
    raise ValueError(
      f'{model_file.path} binds both T5Config '
      f'({", ".join(sorted(model_file.config))}) and T5GemmaConfig'
    )
  reader = _Reader(search_paths)
  reader.read_file(model_file.path)
  for binding in bindings:
    reader.read_text(binding, '<bindings>')
  config = reader.call(_TOP, [], f'{model_file.path}: {_TOP}')
  return (config.replace(**overrides) if overrides else config), None


def _name(selector: str) -> str:
  """`encoder/config.pattern_stack` -> `pattern_stack`."""
  return selector.split('/')[-1].split('.')[-1]


def _scope(selector: str) -> str:
  return '/'.join(selector.split('/')[:-1])


@dataclasses.dataclass
class _Macro:
  name: str


@dataclasses.dataclass
class _Reference:
  selector: str
  evaluate: bool


class _Delegate(config_parser.ParserDelegate):
  def configurable_reference(self, scoped_configurable_name, evaluate):
    return _Reference(scoped_configurable_name, evaluate)

  def macro(self, macro_name):
    return _Macro(macro_name)


class _Reader:
  """The bindings of a T5Gemma model file, and their evaluation."""

  def __init__(self, search_paths: Sequence[str]):
    self.search_paths = list(search_paths)
    self.macros: dict[str, Any] = {}
    # (scope, configurable name) -> {argument: (value, where)}.
    self.bindings: dict[tuple[str, str], dict[str, tuple[Any, str]]] = {}

  def read_file(self, path: str, depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
      raise ValueError(f'{path}: includes nest deeper than {depth}')
    with open(path, encoding='utf-8') as f:
      self.read_text(f.read(), path, depth)

  def read_text(self, text: str, origin: str, depth: int = 0) -> None:
    try:
      statements = list(config_parser.ConfigParser(text, _Delegate()))
    except SyntaxError as e:
      raise ValueError(f'{origin}: {e}') from e
    for st in statements:
      if isinstance(st, config_parser.IncludeStatement):
        included = gin_file.resolve(st.filename, self.search_paths, origin)
        self.read_file(included, depth + 1)
      elif isinstance(st, config_parser.BindingStatement):
        where = f'{origin}:{st.location.line_num}'
        if not st.arg_name:  # `NAME = value` defines a macro.
          self.macros[st.selector] = (st.value, where)
          continue
        # The parser splits `a/b/config.Rope` into scope and selector.
        key = (st.scope or '', _name(st.selector))
        self.bindings.setdefault(key, {})[st.arg_name] = (st.value, where)

  def call(self, name: str, scope: list[str], where: str, depth: int = 0):
    if name not in _CALLABLES:
      raise ValueError(
        f'{where}: @{name}() is not one of the T5Gemma configurables '
        f'({", ".join(sorted(_CALLABLES))})'
      )
    if depth > _MAX_DEPTH:
      raise ValueError(f'{where}: references nest deeper than {depth}')
    kwargs = {}
    for i in range(len(scope) + 1):
      for arg, (value, at) in self.bindings.get(
        ('/'.join(scope[:i]), name), {}
      ).items():
        kwargs[arg] = (value, at)
    values = {
      arg: self.value(value, scope, f'{at}: {name}.{arg}', depth)
      for arg, (value, at) in kwargs.items()
    }
    try:
      return _CALLABLES[name](**values)
    except (TypeError, ValueError) as e:
      raise ValueError(f'{where}: {name}: {e}') from e

  def value(self, value: Any, scope: list[str], where: str, depth: int):
    if isinstance(value, _Macro):
      if depth > _MAX_DEPTH:
        raise ValueError(f'{where}: macros nest deeper than {depth}')
      if value.name == 'gin.REQUIRED':
        raise ValueError(f'{where} is %gin.REQUIRED; bind it')
      if value.name not in self.macros:
        raise ValueError(f'{where}: macro %{value.name} is never set')
      raw, at = self.macros[value.name]
      return self.value(raw, [], f'{at}: %{value.name}', depth + 1)
    if isinstance(value, _Reference):
      if not value.evaluate:
        raise ValueError(f'{where}: @{value.selector} needs () here')
      own = _scope(value.selector)
      inner = own.split('/') if own else scope
      return self.call(_name(value.selector), inner, where, depth + 1)
    if isinstance(value, (list, tuple)):
      return type(value)(self.value(v, scope, where, depth) for v in value)
    if isinstance(value, dict):
      return {k: self.value(v, scope, where, depth) for k, v in value.items()}
    return value

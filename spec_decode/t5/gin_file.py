"""Model gin files (ours in `gin/models/`, or T5X's own) read as a file format.

A model gin file says which network to build: T5X's
`t5x/examples/t5/t5_1_1/base.gin` binds `network.T5Config.*`, the
vocabulary (`seqio.SentencePieceVocabulary.sentencepiece_model_file`), the
`models.EncoderDecoderModel` and the optimizer; each size file includes it and
overrides the size fields. Ours mirror them (`config.T5Config.*`).

This module reads such files without gin's global state and without
importing the modules they name (t5x need not be installed): gin's syntax
parser (`gin.config_parser`) yields the statements, and the reader follows
`include`s and evaluates macros itself, as gin would (later bindings win).

What is read:
  * `<anything>.T5Config.<field>`: the network's hyperparameters (an unknown
    field is an error naming the binding);
  * `<anything>.SentencePieceVocabulary.sentencepiece_model_file` and
    `.extra_ids`: the vocabulary;
  * `<anything>.EncoderDecoderModel.<arg>`: the arguments T5X's model files
    bind (module, vocabularies, optimizer, losses) need nothing from us;
    any other one (a `decode_fn`, ...) changes decoding in a way this reader
    cannot honour, and is an error naming it.
Everything else (optimizer settings, `network.Transformer.config`,
partitioning, ...) is training or wiring and is skipped. `dropout_rate` left
`%gin.REQUIRED` (T5X leaves it to run files) is 0: inference has no
dropout.

Includes resolve like gin's (against the search paths, then the working
directory), then against every directory above the including file (so
T5X's `include 't5x/examples/t5/t5_1_1/base.gin'` finds the file's own
checkout), then under our `gin/`.
"""

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from gin import config_parser
from spec_decode import paths
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.byte_vocab import ByteVocabulary

_REQUIRED = 'gin.REQUIRED'
_MAX_INCLUDE_DEPTH = 32
# `models.EncoderDecoderModel` arguments of T5X's model files that leave
# decoding as we do it (structure, vocabularies, training losses).
_MODEL_ARGS_WITHOUT_EFFECT = frozenset(
  {
    'module',
    'input_vocabulary',
    'output_vocabulary',
    'optimizer_def',
    'z_loss',
    'label_smoothing',
    'loss_normalizing_factor',
  }
)

# Short names of the model files in `gin/models/`.
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


@dataclasses.dataclass(frozen=True)
class ModelFile:
  """What a model gin file binds.

  Attributes:
    path: the file read.
    config: `T5Config` field -> value (macros resolved).
    vocabulary: the sentencepiece model file it names, or None.
    extra_ids: the vocabulary's extra ids, or None.
    skipped: bindings that do not concern inference (`selector.arg`).
    skipped_values: `selector.arg` -> its value as gin text (macros and
      references left as `%NAME` / `@name`; the last binding wins), for
      callers that translate run bindings (`eval/t5x_run_cli.py`).
  """

  path: str
  config: dict[str, Any]
  vocabulary: str | None
  extra_ids: int | None
  skipped: tuple[str, ...]
  skipped_values: dict[str, str] = dataclasses.field(default_factory=dict)
  byte_vocabulary: bool = False  # `VOCABULARY = @seqio.ByteVocabulary()`

  def local_vocabulary(self) -> vocab_lib.Vocabulary | None:
    """The vocabulary the file names, if it is a file on this machine.

    T5X's files name `gs://` paths: those need a local copy (pass it as the
    vocabulary), so they give None rather than a network read. Extra ids
    default to 0, as in seqio (T5's "100extra" models hold them already).
    """
    if self.byte_vocabulary:
      return ByteVocabulary(extra_ids=self.extra_ids or 0)
    if not self.vocabulary or not os.path.isfile(self.vocabulary):
      return None
    return vocab_lib.Vocabulary.from_file(
      self.vocabulary, extra_ids=self.extra_ids or 0
    )


class _Macro:
  def __init__(self, name: str):
    self.name = name


class _Reference:
  def __init__(self, name: str, evaluate: bool = False):
    self.name = name
    self.evaluate = evaluate


class _Delegate(config_parser.ParserDelegate):
  def configurable_reference(self, scoped_configurable_name, evaluate):
    return _Reference(scoped_configurable_name, evaluate)

  def macro(self, macro_name):
    return _Macro(macro_name)


def _candidates(name: str, search_paths: Sequence[str], origin: str | None):
  yield name
  for p in search_paths:
    yield os.path.join(p, name)
  if origin:
    here = os.path.dirname(os.path.abspath(origin))
    while True:
      yield os.path.join(here, name)
      parent = os.path.dirname(here)
      if parent == here:
        break
      here = parent
  yield os.path.join(paths.GIN_DIR, name)
  if name in MODEL_FILES:
    yield os.path.join(paths.GIN_DIR, MODEL_FILES[name])


def resolve(
  name: str, search_paths: Sequence[str] = (), origin: str | None = None
) -> str:
  """The file `name` names: as given, under a search path, above `origin`
  (the including file), under our `gin/`, or a `MODEL_FILES` short name."""
  name = os.fspath(name)
  for c in _candidates(name, search_paths, origin):
    if os.path.isfile(c):
      return c
  where = ', '.join([*search_paths, 'the working directory', paths.GIN_DIR])
  hint = ''
  if name.startswith('t5x/'):
    hint = (
      '; T5X files: pass --gin_search_paths=<your t5x checkout> (or '
      'search_paths=...), or point at the file inside the checkout'
    )
  raise FileNotFoundError(
    f'gin model file not found: {name} (looked in {where}'
    + (f' and above {origin}' if origin else '')
    + f'; short names: {", ".join(sorted(MODEL_FILES))}){hint}'
  )


# T5X `scalable_t5` T5Config fields about training only (layers scanned,
# rematerialized): skipped by name. A scanned checkpoint's layer axis is read
# from its stored shapes (`checkpoints/t5x_layout.py`), not from these.
_TRAINING_ONLY_FIELDS = frozenset(
  {'scan_layers', 'param_scan_axis', 'remat_policy'}
)


class _Reader:
  """Collects macros and the bindings that matter, in file order."""

  def __init__(self, search_paths: Sequence[str]):
    self.search_paths = list(search_paths)
    self.imports: dict[str, str] = {}  # name in the file -> module
    self.scalable = False
    self.macros: dict[str, Any] = {}
    self.config: dict[str, tuple[Any, str]] = {}
    self.vocab: dict[str, tuple[Any, str]] = {}
    self.skipped: list[str] = []
    self.skipped_values: dict[str, str] = {}

  def read_file(self, path: str, depth: int = 0) -> None:
    if depth > _MAX_INCLUDE_DEPTH:
      raise ValueError(f'{path}: includes nest deeper than {depth}')
    with open(path, encoding='utf-8') as f:
      self.read_text(f.read(), path, depth)

  def read_text(self, text: str, origin: str, depth: int) -> None:
    try:
      statements = list(config_parser.ConfigParser(text, _Delegate()))
    except SyntaxError as e:
      raise ValueError(f'{origin}: {e}') from e
    for st in statements:
      if isinstance(st, config_parser.IncludeStatement):
        included = resolve(st.filename, self.search_paths, origin)
        self.read_file(included, depth + 1)
      elif isinstance(st, config_parser.ImportStatement):
        name = st.alias or st.module.split('.')[-1]
        self.imports[name] = st.module
      elif isinstance(st, config_parser.BindingStatement):
        self._bind(st, f'{origin}:{st.location.line_num}')

  def _bind(self, st: config_parser.BindingStatement, where: str) -> None:
    if not st.arg_name:  # `NAME = value` defines a macro.
      self.macros[st.selector] = st.value
      return
    kind = st.selector.split('.')[-1]
    binding = f'{st.selector}.{st.arg_name}'
    if kind == 'T5Config':
      owner = st.selector.split('/')[-1].split('.')[0]
      module = self.imports.get(owner, st.selector)
      # scalable_t5's layers each hold their own relative position table.
      self.scalable |= 'scalable_t5' in module
      if st.arg_name in _TRAINING_ONLY_FIELDS:
        self.skipped.append(binding)
        self.skipped_values[binding] = gin_text(st.value)
        return
      self.config[st.arg_name] = (st.value, f'{where}: {binding}')
    elif kind in ('SentencePieceVocabulary', 'ByteVocabulary'):
      self.vocab[st.arg_name] = (st.value, f'{where}: {binding}')
    elif kind == 'EncoderDecoderModel':
      if st.arg_name not in _MODEL_ARGS_WITHOUT_EFFECT:
        raise ValueError(
          f'{where}: {binding} cannot be honoured (spec_decode decodes '
          'with its own loops; remove the binding or set the decoding '
          'through spec-decode eval)'
        )
      self.skipped.append(binding)
    else:
      self.skipped.append(binding)
      self.skipped_values[binding] = gin_text(st.value)

  def value(self, value: Any, where: str, seen: tuple[str, ...] = ()) -> Any:
    if isinstance(value, _Macro):
      if value.name == _REQUIRED:
        return _REQUIRED
      if value.name in seen:
        raise ValueError(f'{where}: macro cycle {" -> ".join(seen)}')
      if value.name not in self.macros:
        raise ValueError(f'{where}: macro %{value.name} is never set')
      return self.value(self.macros[value.name], where, seen + (value.name,))
    if isinstance(value, _Reference):
      raise ValueError(f'{where}: @{value.name} is not a plain value')
    if isinstance(value, (list, tuple)):
      return type(value)(self.value(v, where, seen) for v in value)
    return value


def gin_text(value: Any) -> str:
  """A parsed binding value written back as gin syntax."""
  if isinstance(value, _Macro):
    return f'%{value.name}'
  if isinstance(value, _Reference):
    return f'@{value.name}' + ('()' if value.evaluate else '')
  if isinstance(value, dict):
    items = ', '.join(f'{gin_text(k)}: {gin_text(v)}' for k, v in value.items())
    return '{' + items + '}'
  if isinstance(value, (list, tuple)):
    items = [gin_text(v) for v in value]
    if isinstance(value, list):
      return '[' + ', '.join(items) + ']'
    return '(' + ', '.join(items) + (',)' if len(items) == 1 else ')')
  return repr(value)


def read(
  path: str,
  bindings: Sequence[str] = (),
  search_paths: Sequence[str] = (),
  fields: Sequence[str] | None = None,
) -> ModelFile:
  """Reads a model gin file (and what it includes).

  Args:
    path: a path, a path relative to `gin/` (`models/t5_1_1/base.gin`), or
      a `MODEL_FILES` short name (`t5_1_1_xxl`).
    bindings: extra bindings read after the file, e.g.
      `("ACTIVATION_DTYPE = 'bfloat16'",)`.
    search_paths: directories includes are looked up in first.
    fields: the `T5Config` field names; a binding of another is an error.

  Raises:
    FileNotFoundError: the file or one it includes does not exist.
    ValueError: a syntax error, an unknown field, an unset macro or a
      binding that cannot be honoured (each names the file and line).
  """
  reader = _Reader(search_paths)
  path = resolve(path, search_paths)
  reader.read_file(path)
  for binding in bindings:
    reader.read_text(binding, '<bindings>', 0)
  config = {}
  for name, (raw, where) in reader.config.items():
    if fields is not None and name not in fields:
      raise ValueError(f'{where}: T5Config has no field {name!r}')
    value = reader.value(raw, where)
    if value == _REQUIRED:
      if name != 'dropout_rate':
        raise ValueError(f'{where} is %gin.REQUIRED; bind it')
      value = 0.0
    config[name] = value
  if reader.scalable:
    config.setdefault('per_layer_relpos_bias', True)
  vocab = {
    k: reader.value(raw, where) for k, (raw, where) in reader.vocab.items()
  }
  extra_ids = vocab.get('extra_ids')
  named = reader.macros.get('VOCABULARY')
  byte = isinstance(named, _Reference) and named.name.endswith('ByteVocabulary')
  return ModelFile(
    path=path,
    config=config,
    vocabulary=vocab.get('sentencepiece_model_file'),
    extra_ids=None if extra_ids is None else int(extra_ids),
    skipped=tuple(reader.skipped),
    skipped_values=dict(reader.skipped_values),
    byte_vocabulary=byte,
  )

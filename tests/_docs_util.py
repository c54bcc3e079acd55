"""What the docs name, and whether it exists: backticked names in the
package's docstrings and comments, README.md and docs/**/*.md, resolved by
importing `spec_decode` (tests/test_docs.py asserts on it).

A backticked name is checked when it reads as ours:

- `sd.X...` or `spec_decode.X...`: imported, looked up attribute by attribute;
- `mod.X...` where `mod` is the tail of one of our module paths (`costs`,
  `beam.costs`, `policy.loop_costs`), an import alias of the file that
  writes it (`beam_rules`), a name a module of ours defines at its top level
  (`DecodeSettings.gamma`) or a public name of `sd`: some reading must
  resolve. An
  attribute of a class resolves when the class has it, declares it as a field
  or assigns `self.X`; `mod.X` also resolves when `X` is a field of a class
  `mod` defines (`config.emb_dim` names a `T5Config`'s field); a callable's
  parameter resolves as a gin binding (`lm.train.deadline`);
- `room/module.X...` (`policy/loop_costs.measure`): the file exists and has X;
- `path/file.py` or `file.py`: some committed file ends with that path;
  `configs/*.gin` and `gin/**.gin`: the file exists.

Any other dotted name must start with a name in `FOREIGN` (other libraries,
local variables, gin and parameter paths), so a name that belonged to a module
that has since moved is caught rather than waved through.
"""

import ast
import functools
import glob
import importlib
import inspect
import io
import os
import re
import subprocess
import tokenize
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, 'spec_decode')
# The docs whose names must hold today. docs/benchmarks_log.md is a dated
# log: it names modules as they were on the day of each entry.
PAGES = [os.path.join(ROOT, 'README.md')] + sorted(
  p
  for p in glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True)
  if not p.endswith('benchmarks_log.md')
)

_TICK = re.compile(r'`([^`\s]+)`')
_NAME = re.compile(r'^[A-Za-z_][\w-]*(?:[./][A-Za-z_][\w-]*)+$')
_FILE = re.compile(
  r'\.(py|gin|json|jsonl|md|html|txt|log|so|cc|sh|tsv|bin|model)$'
)

# First components that are not ours: other libraries (T5X, seqio, gin, jax
# ...), T5X's module names, some of which are ours too (`partitioning`,
# `models`, `binary_search`), results.json's keys (`gamma_policy`), and the
# local variables and parameter paths the docs talk about.
FOREIGN = frozenset(
  """
  jax jnp lax np nn tf json inspect dataclasses gettext gin seqio orbax flax
  multihost_utils transformers time t5 t5x utils models partitioning
  binary_search gamma_policy
  Configurable DatasetConfig PjitPartitioner tokenizer vm
  out p s prov aux sampler span selector section state module model forcer
  task context draft settings report tree layout rounds cache lm_head shared
  decoder encoder layers_i token_embedder infer infer_script verify metrics
  spec_eval spec_eval_compare spec_eval_drafters sizes shape
""".split()
)


def _texts(path: str) -> list[tuple[int, str]]:
  """(line, text) of a Python file's docstrings and comments."""
  with open(path, encoding='utf-8') as f:
    src = f.read()
  out = []
  for node in ast.walk(ast.parse(src)):
    if isinstance(
      node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    ):
      doc = ast.get_docstring(node, clean=False)
      if doc:
        out.append((node.body[0].lineno, doc))
  for tok in tokenize.generate_tokens(io.StringIO(src).readline):
    if tok.type == tokenize.COMMENT:
      out.append((tok.start[0], tok.string))
  return out


def named() -> dict[str, list[str]]:
  """Each backticked dotted or slashed name -> where it is written."""
  found: dict[str, list[str]] = {}

  def add(name, where):
    name = name.removesuffix('()')
    if _NAME.match(name):
      found.setdefault(name, []).append(where)

  for path in glob.glob(os.path.join(PACKAGE, '**', '*.py'), recursive=True):
    rel = os.path.relpath(path, ROOT)
    for line, text in _texts(path):
      for name in _TICK.findall(text):
        add(name, f'{rel}:{line}')
  for page in PAGES:
    rel = os.path.relpath(page, ROOT)
    with open(page, encoding='utf-8') as f:
      for line, text in enumerate(f, 1):
        for name in _TICK.findall(text):
          add(name, f'{rel}:{line}')
  return found


@functools.cache
def _modules() -> dict[str, str]:
  """Our dotted module names -> file."""
  out = {}
  for path in glob.glob(os.path.join(PACKAGE, '**', '*.py'), recursive=True):
    mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
    out[mod.removesuffix('.__init__')] = path
  return out


@functools.cache
def _aliases(path: str | None) -> dict[str, str]:
  """`from spec_decode.x import y as z` in the file at `path`: z -> module."""
  out: dict[str, str] = {}
  if path is None or not path.endswith('.py'):
    return out
  with open(os.path.join(ROOT, path), encoding='utf-8') as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith(
      'spec_decode'
    ):
      for a in node.names:
        if a.asname and f'{node.module}.{a.name}' in _modules():
          out[a.asname] = f'{node.module}.{a.name}'
  return out


@functools.cache
def _top_level() -> dict[str, list[str]]:
  """Each name a module of ours defines at its top level -> those modules."""
  out: dict[str, list[str]] = {}
  for mod, path in _modules().items():
    with open(path, encoding='utf-8') as f:
      body = ast.parse(f.read()).body
    for node in body:
      if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
        out.setdefault(node.name, []).append(mod)
      elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = (
          node.targets if isinstance(node, ast.Assign) else [node.target]
        )
        for t in targets:
          if isinstance(t, ast.Name):
            out.setdefault(t.id, []).append(mod)
  return out


@functools.cache
def _files() -> tuple[str, ...]:
  listed = subprocess.run(
    ['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True, check=True
  ).stdout.split()
  return tuple(listed)


# A module that imports these at its top is read, not imported: seqio and
# TensorFlow (data/seqio_tasks.py registers tasks in seqio as it is imported)
# must not load into the test process as a side effect of reading the docs.
_HEAVY = re.compile(r'^(?:import|from) (?:seqio|tensorflow|torch)\b', re.M)


def _import(mod: str):
  """The module, or for a heavy one its top-level names (values None)."""
  path = _modules().get(mod)
  if path is not None:
    with open(path, encoding='utf-8') as f:
      source = f.read()
    if _HEAVY.search(source):
      names = [n for n, mods in _top_level().items() if mod in mods]
      return types.SimpleNamespace(__name__=mod, **dict.fromkeys(names))
  try:
    return importlib.import_module(mod)
  except ImportError:
    return None


def _class_has(cls, node, attr: str) -> bool:
  if cls is not None:
    if hasattr(cls, attr) or attr in getattr(cls, '__dataclass_fields__', {}):
      return True
    if any(attr in getattr(k, '__annotations__', {}) for k in cls.__mro__):
      return True
  for n in ast.walk(node) if node is not None else ():
    if (
      isinstance(n, ast.Attribute)
      and isinstance(n.value, ast.Name)
      and n.value.id == 'self'
      and n.attr == attr
      and isinstance(n.ctx, ast.Store)
    ):
      return True
  return False


def _node_of(cls):
  """The class statement of one of our classes (None for others)."""
  path = _modules().get(getattr(cls, '__module__', ''))
  if path is None:
    return None
  with open(path, encoding='utf-8') as f:
    for node in ast.parse(f.read()).body:
      if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
        return node
  return None


def _attrs(obj, rest: list[str]) -> bool:
  for i, attr in enumerate(rest):
    sub = f'{getattr(obj, "__name__", "")}.{attr}'
    if inspect.ismodule(obj) and sub in _modules():
      obj = _import(sub)
      continue
    if hasattr(obj, attr):
      obj = getattr(obj, attr)
      continue
    last = i == len(rest) - 1
    if isinstance(obj, type):
      return last and _class_has(obj, _node_of(obj), attr)
    if callable(obj) and last:
      try:
        return attr in inspect.signature(obj).parameters
      except (TypeError, ValueError):
        return False
    return False
  return True


def _in_module(mod: str, rest: list[str]) -> bool:
  module = _import(mod)
  if module is None:
    return False
  if not rest:
    return True
  if hasattr(module, rest[0]) or f'{mod}.{rest[0]}' in _modules():
    return _attrs(module, rest)
  if len(rest) == 1:
    return any(
      isinstance(v, type)
      and v.__module__ == mod
      and _class_has(v, _node_of(v), rest[0])
      for v in vars(module).values()
    )
  return False


def _dotted(parts: list[str], path: str | None) -> bool | None:
  """True when `parts` resolves as ours; None when it starts with a foreign
  name and does not; False otherwise."""
  if parts[0] in ('sd', 'spec_decode'):
    return _in_module('spec_decode', parts[1:])
  for mod in _modules():
    tail = mod.split('.')[1:]
    for k in range(min(len(parts), len(tail)), 0, -1):
      if tail[-k:] == parts[:k]:
        if _in_module(mod, parts[k:]):
          return True
        break
  alias = _aliases(path).get(parts[0])
  if alias and _in_module(alias, parts[1:]):
    return True
  for mod in _top_level().get(parts[0], []):
    if _in_module(mod, parts):
      return True
  package = _import('spec_decode')
  if hasattr(package, parts[0]):
    if _attrs(package, parts):
      return True
  return None if parts[0] in FOREIGN else False


def resolves(name: str, path: str | None = None) -> bool:
  """Whether a backticked name written in `path` (relative to the root)
  holds; True for names that are not ours."""
  if _FILE.search(name):
    first = name.split('/')[0]
    if name.endswith('.py') and (
      '/' not in name
      or os.path.isdir(os.path.join(PACKAGE, first))
      or os.path.isdir(os.path.join(ROOT, first))
    ):
      return any(f == name or f.endswith('/' + name) for f in _files())
    if name.endswith('.gin') and name.startswith(('configs/', 'gin/')):
      return os.path.exists(os.path.join(ROOT, name))
    return True
  if '/' in name:
    head, _, tail = name.rpartition('/')
    mod, _, attrs = tail.partition('.')
    if attrs and os.path.isdir(os.path.join(PACKAGE, head)):
      dotted = 'spec_decode.' + head.replace('/', '.') + '.' + mod
      return dotted in _modules() and _in_module(dotted, attrs.split('.'))
    return True
  return _dotted(name.split('.'), path) is not False

"""The package's layering, measured over `ast` (no imports are executed).

Layers, bottom to top (docs/architecture.md): paths and theory; the engine
in its rooms, core (the primitives) <- policy (costs and the gamma policy)
<- tree, beam <- chain (`generate`, which hands `tree=` to tree) <- check
(the pair check); kernels; t5; checkpoints; models and parallel; drafters;
the public API (`spec_decode/__init__.py`); data; train and eval; bench;
command lines (`main.py`, `gin_cli.py`, `demo.py`, every `cli.py` and
`*_cli.py`). A module imports only from its own layer or below, never from
a sibling room of its layer (each top-level module is a room of its own),
the import graph has no cycles, and gin stays at the command lines. The
engine has no T5, no gin, no files but the cost cache. Sizes: no module
over 600 lines, no folder over 15 modules, no function over 150 lines but
those named in LONG_FUNCTIONS; each package's docstring indexes exactly
its modules and subfolders.

Each rule is a function of a package root that returns its violations
(RULES). The real package must give none; and for each rule a made-up
package under tmp_path that breaks that rule alone must make that rule,
and no other, report it (the negative controls), so no rule passes by
seeing nothing.

`python tests/test_layout.py` prints the numbers (modules, arrows, floors).
"""

import ast
import collections
import functools
import os
import re
import sys
from collections.abc import Callable

import pytest

PACKAGE = 'spec_decode'
ROOT = os.path.join(os.path.dirname(os.path.dirname(__file__)), PACKAGE)
MAX_LINES = 600
MAX_TOP_LEVEL = 10

# Longest matching prefix wins.
RANKS = {
  'spec_decode.paths': 0,
  'spec_decode.theory': 0,
  'spec_decode.core': 1,
  'spec_decode.policy': 2,
  'spec_decode.tree': 3,
  'spec_decode.beam': 3,
  'spec_decode.chain': 4,
  'spec_decode.check': 5,
  'spec_decode.kernels': 6,
  'spec_decode.layers': 6,
  'spec_decode.t5': 7,
  'spec_decode.t5gemma': 7,
  'spec_decode.checkpoints': 8,
  'spec_decode.models': 9,
  'spec_decode.parallel': 9,
  'spec_decode.drafters': 10,
  'spec_decode': 11,  # The public API re-exports (the package __init__).
  'spec_decode.data': 12,
  'spec_decode.train': 13,
  'spec_decode.eval': 13,
  'spec_decode.bench': 14,
}
CLI_RANK = 15
# The engine's rooms (no T5, no files but the cost cache, no gin).
ENGINE = ('core', 'policy', 'tree', 'beam', 'chain', 'check')
MAX_MODULES_PER_FOLDER = 15
MAX_FUNCTION_LINES = 150
# Functions allowed over MAX_FUNCTION_LINES, with why. None: a loop whose
# body closes over the decode's models and settings holds them as the
# fields of a frozen `Iteration` object (chain/steps.py) instead.
LONG_FUNCTIONS: set[tuple[str, str]] = set()
# Command-line modules besides every `cli.py`.
CLI_MODULES = {'spec_decode.main', 'spec_decode.gin_cli', 'spec_decode.demo'}
# The one command-line module every command line may import (it parses
# --gin_file and --gin.NAME=VALUE); other command lines are rooms apart.
SHARED_CLI = 'spec_decode.gin_cli'
# The library modules that read gin *syntax* (a file format) with gin's
# parser module; they never touch gin's global configuration.
GIN_SYNTAX_READERS = {
  'spec_decode.t5.gin_file',  # T5 model gin files
  'spec_decode.checkpoints.gin_model',  # T5Gemma model gin files
}
# The engine's one file: the cost cache (measured seconds as JSON).
ENGINE_FILE_OWNERS = {'spec_decode.policy.cost_cache'}
# Calls that touch the file system, by the dotted name they resolve to.
FILE_CALLS = frozenset(
  {
    'open',
    'io.open',
    'os.open',
    'os.listdir',
    'os.scandir',
    'os.walk',
    'os.stat',
    'os.makedirs',
    'os.mkdir',
    'os.remove',
    'os.unlink',
    'os.rename',
    'os.replace',
    'os.path.exists',
    'os.path.isfile',
    'os.path.isdir',
    'os.path.getsize',
    'os.path.getmtime',
    'json.load',
    'json.dump',
    'pickle.load',
    'pickle.dump',
    'numpy.load',
    'numpy.save',
    'numpy.savez',
    'numpy.savez_compressed',
    'numpy.loadtxt',
    'numpy.savetxt',
    'numpy.genfromtxt',
    'numpy.fromfile',
    'numpy.memmap',
    'gzip.open',
  }
)
# Methods that read or write a file whatever they are called on (`Path`).
FILE_METHODS = frozenset(
  {'read_text', 'read_bytes', 'write_text', 'write_bytes', 'tofile'}
)
# Modules whose import alone says the module handles files.
FILE_MODULES = frozenset(
  {'pathlib', 'pickle', 'shelve', 'glob', 'shutil', 'tempfile', 'gzip'}
)
# A line of a package index: the entry (`name.py` or `name/`) starts it.
INDEX_ENTRY = re.compile(r'\s*([A-Za-z_]\w*(?:\.py|/))(?:\s|$)')
# A line that imports from the package (what the ast scanner must see).
PACKAGE_IMPORT_LINE = re.compile(
  rf'^\s*(?:from\s+(?:{PACKAGE}\b|\.)|import\s+{PACKAGE}\b)', re.MULTILINE
)


def is_cli(module: str) -> bool:
  return module in CLI_MODULES or module.endswith(('.cli', '_cli'))


def rank(module: str) -> int:
  if is_cli(module):
    return CLI_RANK
  best = max((p for p in RANKS if module == p or module.startswith(p + '.')),
             key=len)  # fmt: skip
  return RANKS[best]


def in_engine(module: str) -> bool:
  return any(
    module == f'{PACKAGE}.{r}' or module.startswith(f'{PACKAGE}.{r}.')
    for r in ENGINE
  )


def _is_type_checking(node: ast.If) -> bool:
  return 'TYPE_CHECKING' in ast.unparse(node.test)


class _Imports(ast.NodeVisitor):
  """Every import statement (module level and inside functions)."""

  def __init__(self, module: str, is_package: bool, modules: set[str]):
    self.package = module if is_package else module.rpartition('.')[0]
    self.modules = modules
    self.targets: list[tuple[str, str | None]] = []  # (module, name)
    self.external: set[str] = set()
    self.aliases: dict[str, str] = {}  # local name -> our module

  def visit_If(self, node: ast.If):
    if not _is_type_checking(node):
      self.generic_visit(node)

  def visit_Import(self, node: ast.Import):
    for a in node.names:
      if a.name.split('.')[0] == PACKAGE:
        self.targets.append((a.name, None))
        if a.asname:
          self.aliases[a.asname] = a.name
      else:
        self.external.add(a.name)

  def visit_ImportFrom(self, node: ast.ImportFrom):
    base = node.module or ''
    if node.level:
      parts = self.package.split('.')
      parts = parts[: len(parts) - node.level + 1]
      base = '.'.join(parts + ([node.module] if node.module else []))
    if base.split('.')[0] != PACKAGE:
      self.external.add(base)
      return
    for a in node.names:
      sub = f'{base}.{a.name}'
      if sub in self.modules:
        self.targets.append((sub, None))
        self.aliases[a.asname or a.name] = sub
      else:
        self.targets.append((base, a.name))


class Package:
  """A package tree as `ast` reads it: its modules, sources and imports."""

  def __init__(self, root: str):
    self.root = os.path.abspath(root)
    if os.path.basename(self.root) != PACKAGE:
      raise ValueError(f'the layers are named for {PACKAGE}/, got {root}')
    self.paths = self._modules()  # Dotted module name -> file path.
    self.sources = {}
    self.parsed = {}  # Module -> (its ast, its imports).
    for m, path in self.paths.items():
      with open(path, encoding='utf-8') as f:
        self.sources[m] = f.read()
      tree = ast.parse(self.sources[m], path)
      imports = _Imports(m, path.endswith('__init__.py'), set(self.paths))
      imports.visit(tree)
      self.parsed[m] = (tree, imports)

  def _modules(self) -> dict[str, str]:
    found = {}
    for dirpath, _, files in os.walk(self.root):
      for f in files:
        if not f.endswith('.py'):
          continue
        path = os.path.join(dirpath, f)
        rel = os.path.relpath(path, os.path.dirname(self.root))[:-3]
        name = rel.replace(os.sep, '.')
        if name.endswith('.__init__'):
          name = name[: -len('.__init__')]
        found[name] = path
    return found

  def graph(self) -> dict[str, set[str]]:
    edges = collections.defaultdict(set)
    for m, (_, imports) in self.parsed.items():
      for target, _ in imports.targets:
        if target in self.paths and target != m:
          edges[m].add(target)
    return edges

  def room(self, module: str) -> str:
    """The top-level folder a module lives in (`spec_decode.chain`); a
    top-level module (`spec_decode.paths`, the package's own `__init__`) is
    a room of its own."""
    parts = module.split('.')
    if len(parts) > 2 or (
      len(parts) == 2 and self.paths[module].endswith('__init__.py')
    ):
      return '.'.join(parts[:2])
    return module


@functools.cache
def read(root: str) -> Package:
  return Package(root)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  sys.setrecursionlimit(10000)
  nodes = set(edges) | {w for ws in edges.values() for w in ws}
  for v in sorted(nodes):
    if v not in index:
      visit(v)
  return out


def floors(edges: dict[str, set[str]], modules) -> int:
  """Modules on the longest import chain (the height of the tower)."""
  memo = {}

  def height(v, seen=()):
    if v in memo:
      return memo[v]
    if v in seen:
      return 0
    h = 1 + max((height(w, seen + (v,)) for w in edges.get(v, ())), default=0)
    memo[v] = h
    return h

  return max(height(v) for v in modules)


# The rules: each takes a package root and returns its violations.


def unseen_imports(root: str, edges=None) -> list[str]:
  """Modules with a line importing from the package but no arrow in the
  import graph (`edges`, default the scanner's): a scanner that finds no
  edges would pass every rule below."""
  pkg = read(root)
  edges = pkg.graph() if edges is None else edges
  return [
    f'{m}: imports from {PACKAGE} but the graph has no arrow from it'
    for m, source in sorted(pkg.sources.items())
    if PACKAGE_IMPORT_LINE.search(source) and not edges.get(m)
  ]


def import_cycles(root: str) -> list[str]:
  return [' <-> '.join(c) for c in cycles(read(root).graph())]


def upward_imports(root: str) -> list[str]:
  return [
    f'{m} (layer {rank(m)}) imports {t} (layer {rank(t)})'
    for m, targets in sorted(read(root).graph().items())
    for t in sorted(targets)
    if rank(t) > rank(m)
  ]


def sideways_imports(root: str) -> list[str]:
  """Rooms of one layer (tree and beam, models and parallel, train and
  eval, paths and theory, the top-level command lines) are independent:
  neither imports the other. Every command line may import gin_cli."""
  pkg = read(root)
  return [
    f'{m} imports {t}'
    for m, targets in sorted(pkg.graph().items())
    for t in sorted(targets)
    if rank(t) == rank(m)
    and pkg.room(t) != pkg.room(m)
    and not (t == SHARED_CLI and is_cli(m))
  ]


def private_imports(root: str) -> list[str]:
  """No module reaches another's private names (`_name`)."""
  out = []
  for m, (tree, imports) in sorted(read(root).parsed.items()):
    for target, name in imports.targets:
      if name and name.startswith('_'):
        out.append(f'{m} imports {target}.{name}')
    for node in ast.walk(tree):
      if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in imports.aliases
        and node.attr.startswith('_')
        and not node.attr.startswith('__')
      ):
        out.append(f'{m} uses {imports.aliases[node.value.id]}.{node.attr}')
  return out


def engine_imports(root: str) -> list[str]:
  """The loops reach drafters through the protocol: the engine imports
  only the engine and the bottom layer, and no gin, orbax or tqdm."""
  out = []
  for m, (_, imports) in sorted(read(root).parsed.items()):
    if not in_engine(m):
      continue
    for t in sorted({t for t, _ in imports.targets}):
      if not (in_engine(t) or rank(t) == 0):
        out.append(f'{m} imports {t}')
    for e in sorted(imports.external & {'gin', 'orbax.checkpoint', 'tqdm'}):
      out.append(f'{m} imports {e}')
  return out


def _local_names(tree: ast.Module) -> dict[str, str]:
  """Local name -> the dotted name it was imported as (`np` -> `numpy`)."""
  names = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.asname:
          names[a.asname] = a.name
        else:
          names[a.name.split('.')[0]] = a.name.split('.')[0]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for a in node.names:
        names[a.asname or a.name] = f'{node.module}.{a.name}'
  return names


def _dotted(node: ast.expr, names: dict[str, str]) -> str | None:
  """`os.path.exists` for a call's function, through the import names."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    return None
  parts.append(names.get(node.id, node.id))
  return '.'.join(reversed(parts))


def engine_file_access(root: str) -> list[str]:
  """The engine reads and writes no files but the cost cache's."""
  out = []
  for m, (tree, imports) in sorted(read(root).parsed.items()):
    if not in_engine(m) or m in ENGINE_FILE_OWNERS:
      continue
    for e in sorted(imports.external):
      if e.split('.')[0] in FILE_MODULES:
        out.append(f'{m}: imports {e}')
    names = _local_names(tree)
    for node in ast.walk(tree):
      if not isinstance(node, ast.Call):
        continue
      name = _dotted(node.func, names)
      method = isinstance(node.func, ast.Attribute) and node.func.attr
      if name in FILE_CALLS or method in FILE_METHODS:
        out.append(f'{m}:{node.lineno} calls {ast.unparse(node.func)}')
  return out


def gin_outside_command_lines(root: str) -> list[str]:
  """gin (and gin_cli) only at the command lines; t5/gin_file reads gin
  syntax with gin's parser alone."""
  out = []
  for m, (tree, imports) in sorted(read(root).parsed.items()):
    uses_gin = {e for e in imports.external if e.split('.')[0] == 'gin'}
    if m in GIN_SYNTAX_READERS:
      names = {
        a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == 'gin'
        for a in node.names
      }
      parser_only = uses_gin <= {'gin', 'gin.config_parser'}
      if not parser_only or names != {'config_parser'}:
        out.append(f'{m} uses gin beyond its parser')
    elif uses_gin and m != SHARED_CLI:
      out.append(f'{m} imports gin')
    if any(t == SHARED_CLI for t, _ in imports.targets) and not is_cli(m):
      out.append(f'{m} imports gin_cli')
  return out


def extra_entry_points(root: str) -> list[str]:
  """`spec-decode` (main.py) is the only `__main__`."""
  out = []
  for m, (tree, _) in sorted(read(root).parsed.items()):
    has_main = any(
      isinstance(n, ast.If) and '__main__' in ast.unparse(n.test)
      for n in tree.body
    )
    if has_main != (m == f'{PACKAGE}.main'):
      out.append(f'{m}: {"a" if has_main else "no"} __main__ block')
  return out


def long_modules(root: str) -> list[str]:
  return [
    f'{m}: {n} lines'
    for m, source in sorted(read(root).sources.items())
    if (n := len(source.splitlines())) > MAX_LINES
  ]


def crowded_top_level(root: str) -> list[str]:
  top = sorted(
    e
    for e in os.listdir(root)
    if e.endswith('.py') and os.path.isfile(os.path.join(root, e))
  )
  return (
    [f'{len(top)} top-level modules: {top}'] if len(top) > MAX_TOP_LEVEL else []
  )


def modules_per_folder(root: str) -> dict[str, int]:
  """Modules (`__init__.py` not counted) in each folder of the package."""
  counts = collections.Counter(
    os.path.dirname(p)
    for p in read(root).paths.values()
    if not p.endswith('__init__.py')
  )
  return {
    os.path.relpath(d, os.path.dirname(read(root).root)): n
    for d, n in counts.items()
  }


def crowded_folders(root: str) -> list[str]:
  return [
    f'{d}: {n} modules'
    for d, n in sorted(modules_per_folder(root).items())
    if n > MAX_MODULES_PER_FOLDER
  ]


def function_lengths(
  root: str, limit: int = MAX_FUNCTION_LINES
) -> list[tuple[str, str, int]]:
  """(module, function, lines) of every function over `limit` lines."""
  out = []
  for m, (tree, _) in read(root).parsed.items():
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > limit:
          out.append((m, node.name, lines))
  return sorted(out, key=lambda x: (-x[2], x[0], x[1]))


def long_functions(root: str, exempt=LONG_FUNCTIONS) -> list[str]:
  return [
    f'{m}.{f}: {n} lines'
    for m, f, n in function_lengths(root)
    if (m, f) not in exempt
  ]


def index_mismatches(root: str) -> list[str]:
  """A folder's `__init__.py` docstring indexes exactly its modules and
  subfolders: a line per entry that starts with it (`name.py`, `name/`),
  none missing, none extra, none twice."""
  out = []
  pkg = read(root)
  for m, path in sorted(pkg.paths.items()):
    if not path.endswith('__init__.py'):
      continue
    doc = ast.get_docstring(pkg.parsed[m][0]) or ''
    listed = collections.Counter(
      match.group(1)
      for line in doc.splitlines()
      if (match := INDEX_ENTRY.match(line))
    )
    folder = os.path.dirname(path)
    entries = set()
    for entry in os.listdir(folder):
      full = os.path.join(folder, entry)
      if entry.endswith('.py') and entry != '__init__.py':
        entries.add(entry)
      elif os.path.isfile(os.path.join(full, '__init__.py')):
        entries.add(entry + '/')
    out += [f'{m}: {e} not indexed' for e in sorted(entries - set(listed))]
    out += [f'{m}: {e} indexed, absent' for e in sorted(set(listed) - entries)]
    out += [f'{m}: {e} indexed {n} times' for e, n in listed.items() if n > 1]
  return out


RULES: dict[str, Callable[[str], list[str]]] = {
  'unseen imports': unseen_imports,
  'import cycles': import_cycles,
  'upward imports': upward_imports,
  'sideways imports': sideways_imports,
  'private imports': private_imports,
  'engine imports': engine_imports,
  'engine file access': engine_file_access,
  'gin outside command lines': gin_outside_command_lines,
  'extra entry points': extra_entry_points,
  'long modules': long_modules,
  'crowded top level': crowded_top_level,
  'crowded folders': crowded_folders,
  'long functions': long_functions,
  'index mismatches': index_mismatches,
}


@pytest.mark.parametrize('rule', sorted(RULES))
def test_the_package_keeps_the_rule(rule):
  assert RULES[rule](ROOT) == []


def test_the_scanner_sees_the_package_imports():
  """More arrows than modules (a cross-check on the scanner, beside the
  rule `unseen imports`)."""
  edges = read(ROOT).graph()
  assert sum(len(v) for v in edges.values()) > len(read(ROOT).paths)


def test_the_allowances_name_what_exists():
  """LONG_FUNCTIONS names only functions that exist and are still long;
  the cost cache module exists and is in the engine."""
  found = {(m, f) for m, f, _ in function_lengths(ROOT)}
  assert LONG_FUNCTIONS <= found, LONG_FUNCTIONS - found
  for m in ENGINE_FILE_OWNERS:
    assert m in read(ROOT).paths and in_engine(m), m


# Negative controls: a made-up package that breaks one rule.


def _index(entries) -> str:
  lines = '\n'.join(f'{e}  an entry' for e in sorted(entries))
  return f'"""A made-up package.\n\n{lines}\n"""\n'


def make_tree(base, files: dict[str, str], indexes: bool = True) -> str:
  """Writes `files` (paths under spec_decode/ -> source) under `base`; each
  folder gets an `__init__.py` whose docstring indexes it, unless given."""
  root = os.path.join(str(base), PACKAGE)
  files = {'main.py': "if __name__ == '__main__':\n  pass\n", **files}
  for rel, source in files.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
      f.write(source)
  folders = sorted({d for d, _, _ in os.walk(root)})
  for d in folders:
    init = os.path.join(d, '__init__.py')
    if os.path.exists(init) or not indexes:
      continue
    entries = [
      e if e.endswith('.py') else e + '/'
      for e in os.listdir(d)
      if e.endswith('.py') or os.path.isdir(os.path.join(d, e))
    ]
    with open(init, 'w', encoding='utf-8') as f:
      f.write(_index(entries))
  return root


def _function(name: str, lines: int) -> str:
  body = ''.join(f'  x{i} = {i}\n' for i in range(lines - 2))
  return f'def {name}():\n{body}  return 0\n'


def _many(folder: str, n: int) -> dict[str, str]:
  return {f'{folder}/m{i:02d}.py': 'X = 1\n' for i in range(n)}


# Rule -> a package that breaks it alone.
BROKEN: dict[str, dict[str, str]] = {
  'import cycles': {
    'core/a.py': 'from spec_decode.core import b\n',
    'core/b.py': 'from spec_decode.core import a\n',
  },
  'upward imports': {
    'core/a.py': 'X = 1\n',
    'chain/b.py': 'X = 1\n',
    'core/c.py': 'from spec_decode.chain import b\n',
  },
  'sideways imports': {
    'tree/a.py': 'X = 1\n',
    'beam/b.py': 'from spec_decode.tree import a\n',
  },
  'private imports': {
    'core/a.py': '_X = 1\n',
    'core/b.py': 'from spec_decode.core.a import _X\n',
  },
  'engine imports': {
    'models/a.py': 'X = 1\n',
    'bench/b.py': 'from spec_decode.models import a\n',
    'core/c.py': 'import tqdm\n',
  },
  'engine file access': {
    'core/a.py': 'def f(p):\n  with open(p) as f:\n    return f.read()\n',
    'policy/cost_cache.py': 'def g(p):\n  return open(p)\n',
  },
  'gin outside command lines': {
    'eval/run.py': 'import gin\n',
    'eval/cli.py': 'from spec_decode import gin_cli\n',
    'gin_cli.py': 'import gin\n',
  },
  'extra entry points': {
    'demo.py': "if __name__ == '__main__':\n  pass\n",
  },
  'long modules': {'core/a.py': 'X = 1\n' * (MAX_LINES + 1)},
  'crowded top level': {
    f'top{i}.py': 'X = 1\n' for i in range(MAX_TOP_LEVEL - 1)
  },  # With main.py and __init__.py: one too many.
  'crowded folders': _many('eval', MAX_MODULES_PER_FOLDER + 1),
  'index mismatches': {
    'core/__init__.py': '"""Core.\n\nmodel_drafter.py  over a model\n"""\n',
    'core/drafter.py': 'X = 1\n',
    'core/model_drafter.py': 'X = 1\n',
  },
  'long functions': {
    'core/a.py': _function('f', MAX_FUNCTION_LINES + 1),
  },
}


def test_every_rule_has_a_negative_control():
  """`unseen imports` has its own (the scanner's, below)."""
  assert set(RULES) - set(BROKEN) == {'unseen imports'}


@pytest.mark.parametrize('rule', sorted(BROKEN))
def test_negative_control_breaks_one_rule(rule, tmp_path):
  root = make_tree(tmp_path, BROKEN[rule])
  assert RULES[rule](root) != []
  # The other rules see the rest of the made-up package as clean.
  assert {r for r, check in RULES.items() if check(root)} == {rule}


def test_negative_control_the_limits_are_the_limits(tmp_path):
  """At the limits exactly, nothing is reported."""
  root = make_tree(
    tmp_path,
    {
      'core/a.py': 'X = 1\n' * MAX_LINES,
      'core/b.py': _function('f', MAX_FUNCTION_LINES),
      **_many('eval', MAX_MODULES_PER_FOLDER),
      **{f'top{i}.py': 'X = 1\n' for i in range(MAX_TOP_LEVEL - 2)},
    },
  )
  assert {r for r, check in RULES.items() if check(root)} == set()


def test_negative_control_an_exempt_long_function(tmp_path):
  root = make_tree(
    tmp_path, {'beam/speculative.py': _function('spec_beam_decode', 151)}
  )
  exempt = {('spec_decode.beam.speculative', 'spec_beam_decode')}
  assert long_functions(root, exempt=exempt) == []
  assert long_functions(root, exempt=set()) != []


def test_negative_control_top_level_modules_are_rooms(tmp_path):
  """paths.py and theory/ share layer 0, demo.py and main.py the command
  lines: neither may import the other; any command line may use gin_cli."""
  root = make_tree(
    tmp_path,
    {
      'paths.py': 'from spec_decode.theory import a\n',
      'theory/a.py': 'X = 1\n',
      'demo.py': 'from spec_decode import main\n',
      'gin_cli.py': 'X = 1\n',
      'eval/cli.py': 'from spec_decode import gin_cli\n',
    },
  )
  assert sideways_imports(root) == [
    'spec_decode.demo imports spec_decode.main',
    'spec_decode.paths imports spec_decode.theory.a',
  ]


def test_negative_control_engine_file_access_every_way(tmp_path):
  """Each way of reaching a file is seen, through import aliases; the cost
  cache and outside the engine are allowed."""
  ways = {
    'open': 'open(p)',
    'numpy': 'np.load(p)',
    'numpy from': 'load(p)',
    'json': 'json.load(p)',
    'pathlib': 'p.read_text()',
    'os.path': 'osp.exists(p)',
    'os': 'os.listdir(p)',
  }
  header = (
    'import json\nimport os\nimport numpy as np\n'
    'from numpy import load\nfrom os import path as osp\n'
  )
  files = {
    f'core/m{i}.py': f'{header}\n\ndef f(p):\n  return {call}\n'
    for i, call in enumerate(ways.values())
  }
  files['core/m9.py'] = 'import pathlib\n'
  files['policy/cost_cache.py'] = f'{header}\n\ndef f(p):\n  return open(p)\n'
  files['eval/run.py'] = f'{header}\n\ndef f(p):\n  return open(p)\n'
  files['core/clean.py'] = f'{header}\n\ndef f(p):\n  return json.loads(p)\n'
  found = engine_file_access(make_tree(tmp_path, files))
  flagged = {v.split(':')[0] for v in found}
  assert flagged == {f'spec_decode.core.m{i}' for i in [*range(len(ways)), 9]}


def test_negative_control_index_entries_are_exact(tmp_path):
  """The issue's case: core's index lists model_drafter.py but not
  drafter.py; a stale entry and a twice-listed one also count."""
  index = (
    '"""Core.\n\nmodel_drafter.py  a drafter over a model\n'
    'gone.py  deleted long ago\nids.py  ids\nids.py  ids again\n'
    'sub/  a folder\n\nprose that mentions drafter.py is no entry\n"""\n'
  )
  root = make_tree(
    tmp_path,
    {
      'core/__init__.py': index,
      'core/drafter.py': 'X = 1\n',
      'core/model_drafter.py': 'X = 1\n',
      'core/ids.py': 'X = 1\n',
      'core/sub/a.py': 'X = 1\n',
    },
  )
  assert index_mismatches(root) == [
    'spec_decode.core: drafter.py not indexed',
    'spec_decode.core: gone.py indexed, absent',
    'spec_decode.core: ids.py indexed 2 times',
  ]
  assert {r for r, check in RULES.items() if check(root)} == {
    'index mismatches'
  }


def test_negative_control_the_scanner_finds_every_import_form(tmp_path):
  """The ast scanner finds each form's arrow (and skips TYPE_CHECKING);
  a graph with no arrows is reported as blind."""
  root = make_tree(
    tmp_path,
    {
      'core/a.py': 'X = 1\n',
      'core/b.py': 'from spec_decode.core import a\n',
      'core/c.py': 'import spec_decode.core.a\n',
      'core/d.py': 'from . import a\n',
      'core/e.py': 'from .a import X\n',
      'core/f.py': 'def f():\n  from spec_decode.core.a import X\n',
      'chain/g.py': 'from ..core import a\n',
      'chain/h.py': (
        'from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n'
        '  from spec_decode.core import a\nimport spec_decode.core.b\n'
      ),
    },
  )
  a, b = 'spec_decode.core.a', 'spec_decode.core.b'
  assert dict(read(root).graph()) == {
    b: {a},
    'spec_decode.core.c': {a},
    'spec_decode.core.d': {a},
    'spec_decode.core.e': {a},
    'spec_decode.core.f': {a},
    'spec_decode.chain.g': {a},
    'spec_decode.chain.h': {b},
  }
  assert unseen_imports(root) == []
  blind = unseen_imports(root, edges={})
  assert len(blind) == 7, blind


def summary() -> dict[str, int]:
  pkg = read(ROOT)
  edges = pkg.graph()
  return {
    'modules': len(pkg.paths),
    'top_level_files': sum(
      1
      for m, p in pkg.paths.items()
      if m.count('.') == 1 and '__init__' not in p
    ),
    'arrows': sum(len(v) for v in edges.values()),
    'floors': floors(edges, pkg.paths),
    'cycles': len(cycles(edges)),
    'upward': sum(rank(t) > rank(m) for m, ts in edges.items() for t in ts),
    'largest_folder_modules': max(modules_per_folder(ROOT).values()),
    'longest_functions': [f'{m}.{f} {n}' for m, f, n in function_lengths(ROOT)],
    'largest_module_lines': max(
      len(s.splitlines()) for s in pkg.sources.values()
    ),
  }


if __name__ == '__main__':
  print(summary())

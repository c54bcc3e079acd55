"""The package's layering, measured over `ast` (no imports are executed).

Layers, bottom to top (docs/architecture.md): paths and theory; the engine
in its rooms, core (the primitives) <- policy (costs and the gamma policy)
<- tree, beam <- chain (`generate`, which hands `tree=` to tree) <- check
(the pair check); kernels; t5; checkpoints; models and parallel; drafters;
the public API (`spec_decode/__init__.py`); data; train and eval; bench;
command lines (`main.py`, `gin_cli.py`, `demo.py`, every `cli.py` and
`*_cli.py`). A module imports only from its own layer or below, never from
a sibling room of its layer, the import graph has no cycles, and gin stays
at the command lines. The engine has no T5, no gin, no files but the cost
cache. Sizes: no module over 600 lines, no folder over 15 modules, no
function over 150 lines but the compiled loop bodies named in LONG_FUNCTIONS.

`python tests/test_layout.py` prints the numbers (modules, arrows, floors).
"""

import ast
import collections
import os
import sys

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
# Functions allowed over MAX_FUNCTION_LINES, with why: each builds one
# compiled loop whose body closes over the decode's models and settings
# (splitting it would pass a dozen traced values through helper calls).
LONG_FUNCTIONS = {
  ('spec_decode.beam.speculative', 'spec_beam_decode'),
}
# Command-line modules besides every `cli.py`.
CLI_MODULES = {'spec_decode.main', 'spec_decode.gin_cli', 'spec_decode.demo'}
# The library modules that read gin *syntax* (a file format) with gin's
# parser module; they never touch gin's global configuration.
GIN_SYNTAX_READERS = {
  'spec_decode.t5.gin_file',  # T5 model gin files
  'spec_decode.checkpoints.gin_model',  # T5Gemma model gin files
}


def _modules() -> dict[str, str]:
  """Dotted module name -> file path."""
  found = {}
  for dirpath, _, files in os.walk(ROOT):
    for f in files:
      if not f.endswith('.py'):
        continue
      path = os.path.join(dirpath, f)
      rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3]
      name = rel.replace(os.sep, '.')
      if name.endswith('.__init__'):
        name = name[: -len('.__init__')]
      found[name] = path
  return found


MODULES = _modules()


def is_cli(module: str) -> bool:
  return module in CLI_MODULES or module.endswith(('.cli', '_cli'))


def rank(module: str) -> int:
  if is_cli(module):
    return CLI_RANK
  best = max((p for p in RANKS if module == p or module.startswith(p + '.')),
             key=len)  # fmt: skip
  return RANKS[best]


def _is_type_checking(node: ast.If) -> bool:
  return 'TYPE_CHECKING' in ast.unparse(node.test)


class _Imports(ast.NodeVisitor):
  """Every import statement (module level and inside functions)."""

  def __init__(self, module: str, is_package: bool):
    self.package = module if is_package else module.rpartition('.')[0]
    self.targets: list[tuple[str, str | None]] = []  # (module, name)
    self.external: set[str] = set()
    self.aliases: dict[str, str] = {}  # local name -> our module

  def visit_If(self, node: ast.If):
    if not _is_type_checking(node):
      self.generic_visit(node)

  def visit_Import(self, node: ast.Import):
    for a in node.names:
      if a.name.startswith(PACKAGE):
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
    if not base.startswith(PACKAGE):
      self.external.add(base)
      return
    for a in node.names:
      sub = f'{base}.{a.name}'
      if sub in MODULES:
        self.targets.append((sub, None))
        self.aliases[a.asname or a.name] = sub
      else:
        self.targets.append((base, a.name))


def _parse(module: str) -> tuple[ast.Module, _Imports]:
  path = MODULES[module]
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read(), path)
  visitor = _Imports(module, path.endswith('__init__.py'))
  visitor.visit(tree)
  return tree, visitor


PARSED = {m: _parse(m) for m in MODULES}


def graph() -> dict[str, set[str]]:
  edges = collections.defaultdict(set)
  for m, (_, imports) in PARSED.items():
    for target, _ in imports.targets:
      if target in MODULES and target != m:
        edges[m].add(target)
  return edges


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
  for v in MODULES:
    if v not in index:
      visit(v)
  return out


def floors(edges: dict[str, set[str]]) -> int:
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

  return max(height(v) for v in MODULES)


def test_no_import_cycles():
  assert cycles(graph()) == []


def test_no_import_runs_up_a_layer():
  upward = [
    f'{m} (layer {rank(m)}) imports {t} (layer {rank(t)})'
    for m, targets in graph().items()
    for t in targets
    if rank(t) > rank(m)
  ]
  assert upward == []


def room(module: str) -> str:
  """The top-level folder a module lives in (`spec_decode.chain`), or the
  package itself for its top-level modules."""
  parts = module.split('.')
  if len(parts) > 2 or (
    len(parts) == 2 and MODULES.get(module, '').endswith('__init__.py')
  ):
    return '.'.join(parts[:2])
  return PACKAGE


def test_engine_is_the_engine_only():
  """The loops reach drafters through the protocol: the engine imports no
  drafter, no T5, no files, no gin."""
  engine = {f'{PACKAGE}.{r}' for r in ENGINE}

  def in_engine(module):
    return any(module == e or module.startswith(e + '.') for e in engine)

  for m, (_, imports) in PARSED.items():
    if in_engine(m):
      ours = {t for t, _ in imports.targets}
      assert all(in_engine(t) or rank(t) == 0 for t in ours), m
      assert not imports.external & {'gin', 'orbax.checkpoint', 'tqdm'}, m


def _nested(a: str, b: str) -> bool:
  """One room is the other or inside it (`bench` and `bench.beam`)."""
  return a == b or a.startswith(b + '.') or b.startswith(a + '.')


def test_sibling_rooms_do_not_import_each_other():
  """Rooms of one layer (tree and beam, models and parallel, train and
  eval) are independent: neither imports the other."""
  sideways = [
    f'{m} imports {t}'
    for m, targets in graph().items()
    for t in targets
    if not is_cli(m) and rank(t) == rank(m) and not _nested(room(t), room(m))
  ]
  assert sideways == []


def test_gin_only_at_the_command_lines():
  for m, (_, imports) in PARSED.items():
    uses_gin = {e for e in imports.external if e.split('.')[0] == 'gin'}
    if m in GIN_SYNTAX_READERS:
      assert uses_gin <= {'gin', 'gin.config_parser'}, m
      tree, _ = PARSED[m]
      names = {
        a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == 'gin'
        for a in node.names
      }
      assert names == {'config_parser'}, m
    elif uses_gin:
      assert m == 'spec_decode.gin_cli', f'{m} imports gin'
    if any(t == 'spec_decode.gin_cli' for t, _ in imports.targets):
      assert is_cli(m), f'{m} imports gin_cli'


def test_one_entry_point():
  """`spec-decode` (main.py) is the only `__main__`."""
  for m, (tree, _) in PARSED.items():
    has_main = any(
      isinstance(n, ast.If) and '__main__' in ast.unparse(n.test)
      for n in tree.body
    )
    assert has_main == (m == 'spec_decode.main'), m


def test_no_private_names_across_modules():
  for m, (tree, imports) in PARSED.items():
    for target, name in imports.targets:
      if name and name.startswith('_'):
        raise AssertionError(f'{m} imports {target}.{name}')
    for node in ast.walk(tree):
      if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in imports.aliases
        and node.attr.startswith('_')
        and not node.attr.startswith('__')
      ):
        raise AssertionError(
          f'{m} uses {imports.aliases[node.value.id]}.{node.attr}'
        )


def test_small_modules_and_a_short_top_level():
  for m, path in MODULES.items():
    with open(path, encoding='utf-8') as f:
      assert len(f.readlines()) <= MAX_LINES, m
  top = [
    e
    for e in os.listdir(ROOT)
    if e.endswith('.py') and os.path.isfile(os.path.join(ROOT, e))
  ]
  assert len(top) <= MAX_TOP_LEVEL, sorted(top)


def modules_per_folder() -> dict[str, int]:
  """Modules (`__init__.py` not counted) in each folder of the package."""
  counts = collections.Counter(
    os.path.dirname(p)
    for p in MODULES.values()
    if not p.endswith('__init__.py')
  )
  return {
    os.path.relpath(d, os.path.dirname(ROOT)): n for d, n in counts.items()
  }


def long_functions(
  limit: int = MAX_FUNCTION_LINES,
) -> list[tuple[str, str, int]]:
  """(module, function, lines) of every function over `limit` lines."""
  out = []
  for m, (tree, _) in PARSED.items():
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > limit:
          out.append((m, node.name, lines))
  return sorted(out, key=lambda x: -x[2])


def test_small_folders_and_short_functions():
  crowded = {
    d: n for d, n in modules_per_folder().items() if n > MAX_MODULES_PER_FOLDER
  }
  assert crowded == {}
  too_long = [
    f'{m}.{f}: {n} lines'
    for m, f, n in long_functions()
    if (m, f) not in LONG_FUNCTIONS
  ]
  assert too_long == []
  # The allowance names only functions that exist and are still long.
  found = {(m, f) for m, f, _ in long_functions()}
  assert LONG_FUNCTIONS <= found, LONG_FUNCTIONS - found


def test_every_package_indexes_its_modules():
  """A folder's `__init__.py` docstring names each of its modules and
  subfolders (`name.py`, `name/`)."""
  missing = []
  for m, path in MODULES.items():
    if not path.endswith('__init__.py'):
      continue
    tree, _ = PARSED[m]
    doc = ast.get_docstring(tree) or ''
    folder = os.path.dirname(path)
    for entry in sorted(os.listdir(folder)):
      full = os.path.join(folder, entry)
      if entry.endswith('.py') and entry != '__init__.py':
        name = entry
      elif os.path.isfile(os.path.join(full, '__init__.py')):
        name = entry + '/'
      else:
        continue
      if name not in doc:
        missing.append(f'{m}: {name}')
  assert missing == []


def test_negative_control_detects_a_cycle_and_an_upward_import():
  """The checks above can fail: a made-up graph with both faults."""
  edges = {
    'spec_decode.chain.loops': {'spec_decode.drafters.ngram'},
    'spec_decode.drafters.ngram': {'spec_decode.chain.loops'},
  }
  assert cycles(edges) == [sorted(edges)]
  assert rank('spec_decode.drafters.ngram') > rank('spec_decode.chain.loops')


def summary() -> dict[str, int]:
  edges = graph()
  return {
    'modules': len(MODULES),
    'top_level_files': sum(
      1 for m, p in MODULES.items() if m.count('.') == 1 and '__init__' not in p
    ),
    'arrows': sum(len(v) for v in edges.values()),
    'floors': floors(edges),
    'cycles': len(cycles(edges)),
    'upward': sum(rank(t) > rank(m) for m, ts in edges.items() for t in ts),
    'largest_folder_modules': max(modules_per_folder().values()),
    'longest_functions': [f'{m}.{f} {n}' for m, f, n in long_functions()],
    'largest_module_lines': max(
      sum(1 for _ in open(p, encoding='utf-8')) for p in MODULES.values()
    ),
  }


if __name__ == '__main__':
  print(summary())

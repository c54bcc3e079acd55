"""The README and docs/: every relative link resolves (file and anchor), the
README stays short, and its first screen holds the picture, the quickstart
and the status; every module, attribute and file the docs and the package's
docstrings and comments name in backticks exists (`_docs_util.py`); every
`--flag` the docs give `spec-decode <command>` is one of its parser's options
and every `--gin.MACRO` one that a gin file binds or reads; every `make X`
is a Makefile target and every `test_x` a test file or function; and
docs/architecture.md's table of rooms and imports holds over the code."""

import ast
import contextlib
import glob
import io
import os
import re
import unicodedata

import _docs_util
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, 'README.md')
PAGES = [README] + sorted(
  glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True)
)
_LINK = re.compile(r'\]\(([^)\s]+)\)')
_FENCE = re.compile(r'^```.*?^```', re.S | re.M)


def _anchor(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  text = heading.strip().lower()
  text = re.sub(r'`', '', text)
  kept = []
  for ch in text:
    if ch in ' -_' or unicodedata.category(ch)[0] in 'LN':
      kept.append(ch)
  return ''.join(kept).replace(' ', '-')


def _anchors(path: str) -> set[str]:
  with open(path, encoding='utf-8') as f:
    text = _FENCE.sub('', f.read())
  seen: dict[str, int] = {}
  out = set()
  for line in text.splitlines():
    m = re.match(r'#{1,6} (.*)', line)
    if not m:
      continue
    a = _anchor(m.group(1))
    n = seen.get(a, 0)
    seen[a] = n + 1
    out.add(a if n == 0 else f'{a}-{n}')
  return out


@pytest.mark.parametrize('page', PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(page):
  with open(page, encoding='utf-8') as f:
    text = _FENCE.sub('', f.read())
  broken = []
  for target in _LINK.findall(text):
    if re.match(r'[a-z]+:', target):
      continue  # http(s), mailto
    path, _, anchor = target.partition('#')
    full = (
      os.path.normpath(os.path.join(os.path.dirname(page), path))
      if path
      else page
    )
    if not os.path.exists(full):
      broken.append(target)
    elif anchor and full.endswith('.md') and anchor not in _anchors(full):
      broken.append(target)
  assert broken == []


def test_readme_is_short_and_its_first_screen_has_what_a_newcomer_needs():
  with open(README, encoding='utf-8') as f:
    text = f.read()
  assert len(text.encode()) < 15_000
  first = '\n'.join(text.splitlines()[:40])
  assert '](docs/figure1_demo.png)' in first
  assert 'make demo' in first and 'make test' in first
  assert '2-core CPU' in first and 'spec-decode bench accel' in first
  png = os.path.join(ROOT, 'docs', 'figure1_demo.png')
  assert 0 < os.path.getsize(png) < 200_000


def test_every_backticked_name_of_ours_exists():
  broken = []
  for name, where in sorted(_docs_util.named().items()):
    for place in where:
      if not _docs_util.resolves(name, place.split(':')[0]):
        broken.append(f'{place}: `{name}`')
  assert broken == []


@pytest.mark.parametrize(
  'name',
  [
    'core.tree.TreeAttention',  # the module before it moved (tree_shape)
    'spec_decode.core.tree_shape.TreeRoot',
    'DecodeSettings.no_such_field',
    'beam_search.beam_decode',  # an alias of another file, none here
    'policy/loop_costs.no_such_function',
    'chain/no_such_module.py',
    'gamma_schedule.choose',  # no module, class or foreign name
    'configs/no_such_config.gin',
  ],
)
def test_a_stale_name_is_caught(name):
  assert not _docs_util.resolves(name, 'docs/decoding.md')


@pytest.mark.parametrize(
  'name',
  [
    'policy/loop_costs.measure',
    'policy.timing.measure',
    'core.tree_shape.TreeShape.target_attention',
    'DecodeSettings.gamma',
    'sd.generate',
    'lm.train.deadline',  # a gin binding: a parameter of `train`
    'chain/steps.py',
    'jax.lax.while_loop',
  ],
)
def test_a_current_name_resolves(name):
  assert _docs_util.resolves(name, 'docs/decoding.md')


def test_an_alias_resolves_in_the_file_that_imports_it():
  path = 'spec_decode/bench/beam/controlled.py'  # imports search as beam_search
  assert _docs_util.resolves('beam_search.beam_decode', path)


_COMMAND = re.compile(
  r'spec-decode +([a-z][\w-]*)((?: +(?!spec-decode)[^\s`|;&]+)*)'
)
# `spec-decode infer` parses `spec-decode eval`'s flags (its --help is its
# docstring).
_PARSER_OF = {'infer': 'eval'}


def _doc_commands() -> dict[tuple[str, ...], set[tuple[str, str]]]:
  """(command, subcommand?) -> the (flag, page) pairs the docs give it."""
  from spec_decode import main  # pylint: disable=g-import-not-at-top

  out: dict[tuple[str, ...], set[tuple[str, str]]] = {}
  for page in _docs_util.PAGES:
    with open(page, encoding='utf-8') as f:
      text = f.read().replace('\\\n', ' ')
    for line in text.splitlines():
      for m in _COMMAND.finditer(line):
        if m.group(1) not in main._COMMANDS:  # pylint: disable=protected-access
          continue  # prose: "every spec-decode process"
        words = m.group(2).split()
        argv = (m.group(1),)
        if words and re.fullmatch(r'[a-z][\w-]*', words[0]):
          argv += (words[0],)
        flags = {w.split('=')[0] for w in words if w.startswith('--')}
        rel = os.path.relpath(page, ROOT)
        out.setdefault(argv, set()).update((f, rel) for f in flags)
  return out


def _options(argv: tuple[str, ...]) -> set[str]:
  """The option strings `spec-decode ARGV --help` lists from its options
  section on (its argument groups included)."""
  from spec_decode import main  # pylint: disable=g-import-not-at-top

  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    try:
      main.run([*argv, '--help'])
    except SystemExit:
      pass
  options, inside = set(), False
  for line in out.getvalue().splitlines():
    inside = inside or line == 'options:'  # then argument groups
    if inside:
      options.update(re.findall(r'^ {2}(?:-\w, )?(--[\w-]+)', line))
  return options


def test_the_docs_give_commands_only_the_flags_they_parse():
  commands = _doc_commands()
  assert ('eval',) in commands and ('bench', 'accel') in commands
  wrong = []
  for argv, uses in sorted(commands.items()):
    parsed = (_PARSER_OF.get(argv[0], argv[0]),) + argv[1:]
    options = _options(parsed)
    assert options, f'no options parsed for spec-decode {" ".join(parsed)}'
    for flag, page in sorted(uses):
      if flag.startswith('--gin.'):
        continue  # gin_cli's bindings: test_gin_macros_the_docs_set_exist
      if flag not in options:
        wrong.append(f'{page}: spec-decode {" ".join(argv)} {flag}')
  assert wrong == []


def test_gin_macros_the_docs_set_exist():
  gin_text = ''
  for path in glob.glob(os.path.join(ROOT, '*', '**', '*.gin'), recursive=True):
    with open(path, encoding='utf-8') as f:
      gin_text += f.read() + '\n'
  missing = []
  for page in _docs_util.PAGES:
    with open(page, encoding='utf-8') as f:
      text = f.read()
    for macro in sorted(set(re.findall(r'--gin\.([A-Z][A-Z0-9_]*)=', text))):
      if macro == 'NAME':
        continue  # the syntax's placeholder: `--gin.NAME=VALUE`
      pattern = rf'(?m)^{macro}\s*=|%{macro}\b'
      if not re.search(pattern, gin_text):
        missing.append(f'{os.path.relpath(page, ROOT)}: --gin.{macro}')
  assert missing == []


def test_options_are_each_commands_own():
  assert '--budget' in _options(('bench', 'accel'))
  assert '--budget_s' not in _options(('bench', 'accel'))  # train pair's
  assert '--budget_s' in _options(('train', 'pair'))
  assert '--draft_seed' in _options(('verify',))  # an argument group's


ARCHITECTURE = os.path.join(ROOT, 'docs', 'architecture.md')
_ROW = re.compile(r'^\| `([\w.]+/?)` \| ([\w ]+) \|(.*)\|$')


def _room(dotted: str) -> str | None:
  """The room (`core/`, `main.py`, `__init__.py`) of one of our modules."""
  parts = dotted.split('.')
  if parts[0] != 'spec_decode':
    return None
  if len(parts) == 1:
    return '__init__.py'
  if os.path.isdir(os.path.join(_docs_util.PACKAGE, parts[1])):
    return parts[1] + '/'
  if os.path.exists(os.path.join(_docs_util.PACKAGE, parts[1] + '.py')):
    return parts[1] + '.py'
  return None


def _imports() -> dict[str, set[str]]:
  """Each of our modules -> the modules of ours it imports (anywhere)."""
  out = {}
  for path in glob.glob(
    os.path.join(_docs_util.PACKAGE, '**', '*.py'), recursive=True
  ):
    mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
    mod = mod.removesuffix('.__init__')
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        found.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for a in node.names:
          sub = os.path.join(ROOT, *node.module.split('.'), a.name)
          is_module = os.path.exists(sub + '.py') or os.path.isdir(sub)
          found.add(f'{node.module}.{a.name}' if is_module else node.module)
    out[mod] = {m for m in found if m.split('.')[0] == 'spec_decode'}
  return out


def _architecture() -> tuple[dict[str, tuple[str, set[str]]], set[str]]:
  """architecture.md's rows (room -> part, imports) and the `core/` modules
  it lets the model tower import."""
  with open(ARCHITECTURE, encoding='utf-8') as f:
    text = f.read()
  rows = {}
  for line in text.splitlines():
    m = _ROW.match(line)
    if m:
      rows[m.group(1)] = (m.group(2), set(re.findall(r'`([^`]+)`', m.group(3))))
  tail = text[text.index('only the modules of this list:') :].split('\n\n')[0]
  allowed = {
    name.removesuffix('.py') for name in re.findall(r'`([^`]+)`', tail)
  }
  return rows, allowed


def test_architecture_lists_every_room_and_its_imports():
  rows, _ = _architecture()
  rooms = {
    d + '/'
    for d in os.listdir(_docs_util.PACKAGE)
    if os.path.exists(os.path.join(_docs_util.PACKAGE, d, '__init__.py'))
  } | {f for f in os.listdir(_docs_util.PACKAGE) if f.endswith('.py')}
  assert set(rows) == rooms
  measured: dict[str, set[str]] = {room: set() for room in rooms}
  for mod, imported in _imports().items():
    source = _room(mod)
    measured[source] |= {_room(m) for m in imported if _room(m)} - {source}
  claimed = {room: imports for room, (_, imports) in rows.items()}
  assert claimed == measured


def test_the_towers_meet_only_at_the_drafters_and_the_public_api():
  rows, allowed = _architecture()
  assert allowed == {'ids', 'placement', 'tree_shape'}
  part = {room: p for room, (p, _) in rows.items()}
  engine = {r for r, p in part.items() if p == 'engine'}
  tower = {r for r, p in part.items() if p == 'model tower'}
  assert engine == {'core/', 'policy/', 'tree/', 'beam/', 'chain/', 'check/'}
  assert 'drafters/' not in tower | engine
  for mod, imported in _imports().items():
    source = _room(mod)
    for m in imported:
      target = _room(m)
      if source in engine:
        assert target in engine, (mod, m)
      if source in tower and target not in tower:
        assert target == 'paths.py' or (
          target == 'core/' and m.split('.')[2] in allowed
        ), (mod, m)


def test_the_room_check_fails_on_a_missing_import():
  """A negative control: the measured graph has the edges the table needs
  (an empty graph would fail), and a drafter that imports models is seen."""
  imports = _imports()
  assert (
    'spec_decode.models.t5_model' in imports['spec_decode.drafters.feature']
  )
  assert _room('spec_decode.models.t5_model') == 'models/'
  rows, _ = _architecture()
  assert 'models/' in rows['drafters/'][1]
  assert sum(len(v) for v in imports.values()) > 300


def _pages_text() -> dict[str, str]:
  out = {}
  for page in _docs_util.PAGES:
    with open(page, encoding='utf-8') as f:
      out[os.path.relpath(page, ROOT)] = f.read()
  return out


def test_make_targets_the_docs_give_exist():
  with open(os.path.join(ROOT, 'Makefile'), encoding='utf-8') as f:
    targets = set(re.findall(r'(?m)^([a-z][\w-]*):', f.read()))
  named = {
    (page, t)
    for page, text in _pages_text().items()
    for t in re.findall(r'`make ([a-z][\w-]*)', text)
  }
  assert {t for _, t in named} >= {'demo', 'test', 'bench'}
  assert sorted(f'{p}: make {t}' for p, t in named if t not in targets) == []


def test_tests_the_docs_name_exist():
  """A `test_x` in the docs is a test file or a test function."""
  files, functions = set(), set()
  for path in glob.glob(
    os.path.join(ROOT, 'tests', '**', '*.py'), recursive=True
  ):
    files.add(os.path.basename(path)[:-3])
    with open(path, encoding='utf-8') as f:
      functions.update(re.findall(r'(?m)^def (test_\w+)', f.read()))
  missing = sorted(
    f'{page}: {name}'
    for page, text in _pages_text().items()
    for name in set(re.findall(r'\b(test_[a-z0-9_]+?)(?:\.py)?\b', text))
    if name not in files | functions
  )
  assert missing == []

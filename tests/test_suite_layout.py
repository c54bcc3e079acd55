"""The test suite mirrors the package, and each test file stands alone.

Test folders are named after the package's rooms (`tests/chain/` tests
`spec_decode/chain/`); test files have unique names (pytest imports them by
basename, without packages); a test file imports another test module only
from its own folder (pytest puts that folder on the path), and shared
helpers live at the top (`conftest.py`, `_*_util.py`).
"""

import ast
import collections
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(TESTS), 'spec_decode')


def _test_files() -> list[str]:
  out = []
  for dirpath, _, files in os.walk(TESTS):
    out += [os.path.join(dirpath, f) for f in files if f.startswith('test_')]
  return [f for f in out if f.endswith('.py')]


def test_folders_are_package_rooms():
  folders = {
    d
    for d in os.listdir(TESTS)
    if os.path.isdir(os.path.join(TESTS, d)) and not d.startswith(('_', '.'))
  }
  rooms = {
    d
    for d in os.listdir(PACKAGE)
    if os.path.isfile(os.path.join(PACKAGE, d, '__init__.py'))
  }
  assert folders <= rooms, sorted(folders - rooms)


def test_test_file_names_are_unique():
  names = collections.Counter(os.path.basename(f) for f in _test_files())
  assert [n for n, c in names.items() if c > 1] == []


def test_test_modules_import_only_their_neighbours():
  bad = []
  for path in _test_files():
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read(), path)
    here = os.path.dirname(path)
    for node in ast.walk(tree):
      names = []
      if isinstance(node, ast.ImportFrom) and node.module:
        names = [node.module]
      elif isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      for name in names:
        if name.startswith('test_') and not os.path.exists(
          os.path.join(here, name + '.py')
        ):
          bad.append(f'{os.path.relpath(path, TESTS)} imports {name}')
  assert bad == []

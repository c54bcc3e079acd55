"""The demo's evaluation data: the committed slice and how it is rebuilt."""

import hashlib
import json
import os

from test_debian import write_fixture

from spec_decode import main as spec_decode_main
from spec_decode import paths
from spec_decode.data import demo_slice
from spec_decode.data import tasks

DEMO_DIR = os.path.join(paths.REPO_DIR, demo_slice.DEFAULT_DIR)


def test_data_build_writes_the_demo_slice_with_its_manifest(tmp_path, capsys):
  lists, full, out = tmp_path / 'lists', tmp_path / 'full', tmp_path / 'demo'
  write_fixture(str(lists), n=80)
  rc = spec_decode_main.run([
    'data', 'build', '--out_dir', str(full), '--lists_dir', str(lists),
    '--no_gettext', '--demo_slice', str(out), '--demo_examples', '3',
  ])  # fmt: skip
  assert rc == 0
  assert f'wrote {out}: the first 3 of' in capsys.readouterr().out
  with open(full / 'ende' / 'test.tsv', encoding='utf-8') as f:
    whole = f.readlines()
  with open(out / 'ende' / 'test.tsv', encoding='utf-8') as f:
    assert f.readlines() == whole[:4]  # The header and the first 3 rows.
  with open(out / 'manifest.json', encoding='utf-8') as f:
    manifest = json.load(f)
  assert manifest['rows'] == 3
  assert manifest['rows_in_split'] == len(whole) - 1
  assert manifest['rebuild'].endswith(f'--demo_slice {out}')
  assert {s['lang'] for s in manifest['sources']} == {'en', 'de'}


def test_the_committed_slice_is_what_its_manifest_says():
  with open(os.path.join(DEMO_DIR, 'manifest.json'), encoding='utf-8') as f:
    manifest = json.load(f)
  path = os.path.join(DEMO_DIR, 'ende', 'test.tsv')
  with open(path, 'rb') as f:
    assert hashlib.sha256(f.read()).hexdigest() == manifest['sha256']
  pairs = list(tasks.read_tsv(path))
  assert len(pairs) == manifest['rows'] == 50
  assert all(source and target for source, target in pairs)


def test_the_demo_config_reads_the_committed_slice():
  with open(
    os.path.join(paths.CONFIGS_DIR, 'demo_debian_ende.gin'), encoding='utf-8'
  ) as f:
    config = f.read()
  assert "DATA_DIR = 'data/demo'" in config and 'NUM_EXAMPLES = 50' in config
  # Found from any working directory (paths.resolve).
  task = tasks.get_task('debian_ende', 'data/demo')
  examples = list(tasks.examples(task, 'test', limit=50))
  assert len(examples) == 50
  assert examples[0]['inputs'].startswith(tasks.TRANSLATE_EN_DE_PREFIX)

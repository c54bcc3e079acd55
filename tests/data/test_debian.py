"""Tests of the Debian builder on fake Translation-en / Translation-de files.

The fixture texts are invented here; no Debian text is stored in the repo.
"""

import gzip
import hashlib
import os
import shutil
import subprocess
import types

import pytest

from spec_decode import main as spec_decode_main
from spec_decode.data import debian

_EN_TEMPLATE = """\
Package: {pkg}
Description-md5: {md5}
Description-en: {synopsis}
 {name} is a pretend tool number {i} that sorts
 imaginary widgets by colour and size.
 .
 Features:
  * fast sorting of widgets
  * gentle handling of
    very long widget names
 .
 This package contains the {part} files.
"""

_DE_TEMPLATE = """\
Package: {pkg}
Description-md5: {md5}
Description-de: {synopsis_de}
 {name} ist ein erfundenes Werkzeug Nummer {i}, das
 ausgedachte Widgets nach Farbe und Größe sortiert.
 .
 Funktionen:
  * schnelles Sortieren von Widgets
  * sanfter Umgang mit
    sehr langen Widget-Namen
 .
 Dieses Paket enthält die {part_de}.
"""


def _md5(text):
  return hashlib.md5(text.encode('utf-8')).hexdigest()


def write_fixture(lists_dir, n=40, compress_de=True):
  """Writes fake apt lists files; returns the English md5s in file order."""
  os.makedirs(lists_dir, exist_ok=True)
  en_stanzas, de_stanzas, md5s = [], [], []
  for i in range(n):
    fields = dict(
      pkg=f'widget{i}',
      name=f'Widget{i}',
      i=i,
      synopsis=f'sorter of imaginary widgets, flavour {i}',
      synopsis_de=f'Sortierer für ausgedachte Widgets, Sorte {i}',
      part='data' if i % 2 else 'program',
      part_de='Datendateien' if i % 2 else 'Programmdateien',
    )
    fields['md5'] = _md5(fields['synopsis'] + str(i))
    md5s.append(fields['md5'])
    en_stanzas.append(_EN_TEMPLATE.format(**fields))
    if i % 4 != 3:  # Three quarters are translated.
      de_stanzas.append(_DE_TEMPLATE.format(**fields))
  # A description whose translation has one paragraph too few: only its
  # synopsis pairs up.
  en_stanzas.append(
    'Package: odd\nDescription-md5: ' + 'f' * 32 + '\n'
    'Description-en: odd one out\n first paragraph.\n .\n second one.\n'
  )
  de_stanzas.append(
    'Package: odd\nDescription-md5: ' + 'f' * 32 + '\n'
    'Description-de: der Sonderling\n nur ein Absatz.\n'
  )
  prefix = os.path.join(lists_dir, 'mirror_debian_dists_x_main_i18n_')
  with open(prefix + 'Translation-en', 'w', encoding='utf-8') as f:
    f.write('\n'.join(en_stanzas))
  de_text = '\n'.join(de_stanzas).encode('utf-8')
  if compress_de:
    with gzip.open(prefix + 'Translation-de.gz', 'wb') as f:
      f.write(de_text)
  else:
    with open(prefix + 'Translation-de', 'wb') as f:
      f.write(de_text)
  return md5s


def _read_rows(path):
  with open(path, encoding='utf-8') as f:
    lines = f.read().splitlines()
  assert lines[0] == 'id\tsource\ttarget'
  return [tuple(line.split('\t')) for line in lines[1:]]


def test_split_paragraphs_cleans_markers_bullets_and_whitespace():
  long = (
    ' First  line\n  of\tparagraph one.\n .\n Items:\n  * alpha\n'
    '  - beta\n    continued\n  o gamma\n .\n .\n'
  )
  assert debian.split_paragraphs(long) == (
    'First line of paragraph one.',
    'Items: * alpha * beta continued * gamma',
  )


def test_parse_translation_file_reads_synopsis_and_paragraphs():
  text = (
    'Package: p\nDescription-md5: ABC\nDescription-en: short one\n'
    ' Long text\n here.\n .\n Second.\n\nPackage: q\n'
    'Description-md5: def\nDescription-en: no long text\n'
  )
  descs = list(debian.parse_translation_file(text, 'en'))
  assert [d.md5 for d in descs] == ['abc', 'def']
  assert descs[0].synopsis == 'short one'
  assert descs[0].paragraphs == ('Long text here.', 'Second.')
  assert descs[1].paragraphs == ()


def test_build_writes_tasks_splits_and_manifest(tmp_path):
  lists = tmp_path / 'lists'
  md5s = write_fixture(str(lists))
  out = tmp_path / 'out'
  manifest = debian.build(str(out), str(lists))

  counts = manifest['counts']
  for task in ('ende', 'summarize'):
    for split in debian.SPLITS:
      rows = _read_rows(out / task / f'{split}.tsv')
      assert len(rows) == counts[task][split]
      assert rows == sorted(rows)
  # 41 English descriptions with long text; the synopses differ, so each is
  # one summarization example.
  assert sum(counts['summarize'].values()) == 41
  # 30 translated widgets x (synopsis + 3 paragraphs), minus duplicates of
  # the shared 'Features' paragraph and the two 'This package contains'
  # variants; plus the odd one's synopsis.
  ende = [
    r for s in debian.SPLITS for r in _read_rows(out / 'ende' / f'{s}.tsv')
  ]
  sources = [r[1] for r in ende]
  assert len(sources) == len(set(sources))
  assert len(ende) == 30 * 2 + 1 + 2 + 1
  assert ('f' * 32 + ':s', 'odd one out', 'der Sonderling') in ende
  assert not any(r[0].startswith('f' * 32 + ':p') for r in ende)
  bullets = [r for r in ende if r[1].startswith('Features:')]
  assert bullets[0][1:] == (
    'Features: * fast sorting of widgets * gentle handling of very long '
    'widget names',
    'Funktionen: * schnelles Sortieren von Widgets * sanfter Umgang mit '
    'sehr langen Widget-Namen',
  )
  # Untranslated descriptions still feed summarization.
  summ = {
    r[0]: r
    for s in debian.SPLITS
    for r in _read_rows(out / 'summarize' / f'{s}.tsv')
  }
  assert summ[md5s[3]][2] == 'sorter of imaginary widgets, flavour 3'
  assert summ[md5s[3]][1].startswith('Widget3 is a pretend tool number 3')

  assert manifest['descriptions'] == {'en': 41, 'de': 31}
  srcs = {s['lang']: s for s in manifest['sources']}
  with open(srcs['de']['path'], 'rb') as f:
    assert srcs['de']['sha256'] == hashlib.sha256(f.read()).hexdigest()
  assert srcs['de']['path'].endswith('Translation-de.gz')
  assert debian.load_manifest(str(out)) == manifest


def test_splits_are_deterministic_and_follow_the_hash(tmp_path):
  lists = tmp_path / 'lists'
  write_fixture(str(lists), n=80)
  out_a, out_b = tmp_path / 'a', tmp_path / 'b'
  debian.build(str(out_a), str(lists))
  shutil.copytree(lists, tmp_path / 'lists2')
  debian.build(str(out_b), str(tmp_path / 'lists2'))
  for task in debian.TASK_DIRS:
    for split in debian.SPLITS:
      a = (out_a / task / f'{split}.tsv').read_bytes()
      b = (out_b / task / f'{split}.tsv').read_bytes()
      assert a == b
      if task == 'ende':
        for _, source, _ in _read_rows(out_a / task / f'{split}.tsv'):
          assert debian.split_of(source) == split
  # Every split of the bigger fixture gets examples.
  counts = debian.load_manifest(str(out_a))['counts']
  assert all(n > 0 for n in counts['summarize'].values())


def test_split_of_respects_fractions():
  keys = [f'key{i}' for i in range(2000)]
  assert {debian.split_of(k, (1.0, 0.0, 0.0)) for k in keys} == {'train'}
  splits = [debian.split_of(k) for k in keys]
  assert 0.85 < splits.count('train') / len(keys) < 0.95
  assert splits == [debian.split_of(k) for k in keys]
  with pytest.raises(ValueError):
    debian.split_of('k', (0.5, 0.5, 0.5))


def test_package_family_shares_a_summarization_split(tmp_path):
  lists = tmp_path / 'lists'
  write_fixture(str(lists), n=0)
  family = ''.join(
    f'Package: fam{i}\nDescription-md5: {_md5(str(i))}\n'
    f'Description-en: family member {i}\n Shared first paragraph.\n .\n'
    f' Member {i} specifics.\n\n'
    for i in range(30)
  )
  path = lists / 'mirror_debian_dists_x_main_i18n_Translation-en'
  path.write_text(path.read_text() + '\n' + family)
  out = tmp_path / 'out'
  debian.build(str(out), str(lists))
  family_splits = {
    split
    for split in debian.SPLITS
    for _, _, target in _read_rows(out / 'summarize' / f'{split}.tsv')
    if target.startswith('family member')
  }
  assert len(family_splits) == 1


def test_missing_source_says_what_to_run(tmp_path):
  with pytest.raises(debian.SourceMissingError) as err:
    debian.build(str(tmp_path / 'out'), str(tmp_path / 'empty'))
  message = str(err.value)
  assert 'apt-get -o Acquire::Languages=de,en update' in message
  out_dir = str(tmp_path / 'out')
  assert f'spec-decode data build --out_dir {out_dir}' in message
  assert not (tmp_path / 'out').exists()


def test_missing_german_is_reported(tmp_path):
  lists = tmp_path / 'lists'
  write_fixture(str(lists))
  for path in lists.glob('*Translation-de*'):
    path.unlink()
  with pytest.raises(debian.SourceMissingError, match='Translation-de'):
    debian.build(str(tmp_path / 'out'), str(lists))


def test_cli_builds_and_reports_missing_source(tmp_path, capsys):
  lists = tmp_path / 'lists'
  write_fixture(str(lists), compress_de=False)
  out = tmp_path / 'out'
  build = ['data', 'build', '--out_dir', str(out)]
  rc = spec_decode_main.run([*build, '--lists_dir', str(lists)])
  assert rc == 0
  assert 'ende: train' in capsys.readouterr().out
  rc = spec_decode_main.run([*build, '--lists_dir', str(tmp_path / 'nothing')])
  assert rc == 1
  assert 'Acquire::Languages=de,en' in capsys.readouterr().err


def test_data_help_lists_its_commands(capsys):
  with pytest.raises(SystemExit) as exit_:
    spec_decode_main.run(['data', '--help'])
  assert exit_.value.code == 0
  out = capsys.readouterr().out
  assert 'usage: spec-decode data' in out
  assert 'build' in out and 'vocab' in out
  with pytest.raises(SystemExit) as exit_:
    spec_decode_main.run(['data', 'build', '--help'])
  assert exit_.value.code == 0
  assert '--fetch' in capsys.readouterr().out
  with pytest.raises(SystemExit) as exit_:
    spec_decode_main.run(['data'])
  assert exit_.value.code == 2


def test_data_vocab_without_data_says_how_to_build(tmp_path, capsys):
  none = tmp_path / 'none'
  rc = spec_decode_main.run(
    ['data', 'vocab', '--data_dir', str(none), '--output', str(tmp_path / 'x')]
  )
  assert rc == 1
  assert f'spec-decode data build --out_dir {none}' in capsys.readouterr().err


def test_ensure_built_reuses_an_existing_build(tmp_path):
  lists = tmp_path / 'lists'
  write_fixture(str(lists))
  out = str(tmp_path / 'out')
  first = debian.ensure_built(out, str(lists))
  shutil.rmtree(lists)  # The sources are no longer needed.
  assert debian.ensure_built(out, str(lists)) == first


def test_lz4_and_xz_sources_are_read(tmp_path):
  import lzma

  lists = tmp_path / 'lists'
  write_fixture(str(lists), compress_de=False)
  de = next(lists.glob('*Translation-de'))
  en = next(lists.glob('*Translation-en'))
  expected = debian.build(str(tmp_path / 'plain'), str(lists))['counts']
  with lzma.open(str(en) + '.xz', 'wb') as f:
    f.write(en.read_bytes())
  en.unlink()
  if shutil.which('lz4'):
    subprocess.run(['lz4', '-q', str(de), str(de) + '.lz4'], check=True)
    de.unlink()
  got = debian.build(str(tmp_path / 'packed'), str(lists))
  assert got['counts'] == expected
  assert any(s['path'].endswith('.xz') for s in got['sources'])


def test_fetch_refuses_without_root(monkeypatch):
  monkeypatch.setattr(debian.shutil, 'which', lambda _: '/usr/bin/x')
  monkeypatch.setattr(debian.os, 'geteuid', lambda: 1000)
  with pytest.raises(debian.FetchError, match='sudo apt-get'):
    debian.fetch()


def test_fetch_without_apt_get(monkeypatch):
  monkeypatch.setattr(debian.shutil, 'which', lambda _: None)
  with pytest.raises(debian.FetchError, match='--lists_dir'):
    debian.fetch()


def test_fetch_reports_offline(monkeypatch, tmp_path):
  calls = []

  def fake_run(cmd, **kwargs):
    calls.append(cmd)
    return types.SimpleNamespace(
      returncode=0, stdout='Err:1 http://deb.debian.org', stderr='W: failed'
    )

  monkeypatch.setattr(debian.shutil, 'which', lambda _: '/usr/bin/x')
  monkeypatch.setattr(debian.os, 'geteuid', lambda: 0)
  monkeypatch.setattr(debian.subprocess, 'run', fake_run)
  with pytest.raises(debian.FetchError, match='offline') as err:
    debian.fetch(str(tmp_path))
  assert 'W: failed' in str(err.value)
  assert calls == [['apt-get', '-o', 'Acquire::Languages=de,en', 'update']]

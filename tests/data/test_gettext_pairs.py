"""Gettext catalogues as EnDe training pairs (data/gettext_pairs.py)."""

import struct

from test_debian import _read_rows
from test_debian import write_fixture

from spec_decode import main as spec_decode_main
from spec_decode.data import debian
from spec_decode.data import gettext_pairs

_HEADER = (
  'Content-Type: text/plain; charset=UTF-8\n'
  'Plural-Forms: nplurals=2; plural=(n != 1);\n'
)


def write_mo(path, messages, header=_HEADER):
  """Writes a GNU .mo file (format revision 0) of `{msgid: msgstr}`.

  A key may hold `\\0` (msgid and msgid_plural), a value `\\0`-separated
  plural forms, as in files msgfmt writes.
  """
  entries = sorted({'': header or '', **messages}.items())
  ids = [k.encode('utf-8') for k, _ in entries]
  strs = [
    v.encode('latin-1' if header is None else 'utf-8') for _, v in entries
  ]
  if header is None:  # A catalogue whose header is not UTF-8.
    strs[0] = 'Last-Translator: Bächle\n'.encode('latin-1')
  n = len(entries)
  table_at = 28
  data_at = table_at + 16 * n
  blob, offsets = b'', []
  for s in ids + strs:
    offsets.append((len(s), data_at + len(blob)))
    blob += s + b'\0'
  out = struct.pack('<7I', 0x950412DE, 0, n, table_at, table_at + 8 * n, 0, 0)
  for length, at in offsets:
    out += struct.pack('<2I', length, at)
  with open(path, 'wb') as f:
    f.write(out + blob)


def test_clean_message_drops_accelerators_and_newlines():
  assert gettext_pairs.clean_message('_Open the\n  &File now') == (
    'Open the File now'
  )
  # Underscores inside words and `&&` are not accelerators.
  assert gettext_pairs.clean_message('snake_case && more') == (
    'snake_case && more'
  )


def test_keep_pair_rules():
  keep = gettext_pairs.keep_pair
  assert keep(
    'Cannot open the file for reading', 'Datei kann nicht gelesen werden'
  )
  assert not keep('Cannot open the file now', 'Cannot open the file now')
  assert not keep('Too short text', 'Zu kurzer Text hier')  # 3 words.
  assert not keep('%s %d %s %d %s %d', '%s %d %s %d %s %d x')
  assert not keep('Cannot open the file for reading', 'Nein')  # Ratio.
  assert not keep(' '.join(['word'] * 41), ' '.join(['Wort'] * 41))


def test_read_pairs_singulars_dedupe_and_unreadable(tmp_path):
  a, b, bad = tmp_path / 'a.mo', tmp_path / 'b.mo', tmp_path / 'bad.mo'
  write_mo(
    a,
    {
      'Cannot open the file for reading': 'Datei kann nicht gelesen werden',
      'one file was removed from disk\0%d files were removed from disk': (
        'eine Datei wurde entfernt\0%d Dateien wurden entfernt'
      ),
      'short': 'kurz',
    },
  )
  write_mo(
    b,
    {
      'Cannot open the file for reading': 'Anderer Text für dieselbe Zeile',
      'The device is busy, try again later': (
        'Das Gerät ist belegt, später erneut versuchen'
      ),
    },
  )
  write_mo(bad, {'Some message here to read': 'Irgendeine Nachricht'}, None)
  pairs, stats = gettext_pairs.read_pairs([str(b), str(bad), str(a)])
  by_en = {en: (uid, de) for uid, en, de in pairs}
  assert set(by_en) == {
    'Cannot open the file for reading',
    'one file was removed from disk',
    'The device is busy, try again later',
  }
  # The catalogue that sorts first wins a shared English text.
  assert by_en['Cannot open the file for reading'] == (
    'mo:a:0',
    'Datei kann nicht gelesen werden',
  )
  assert by_en['one file was removed from disk'][1] == (
    'eine Datei wurde entfernt'
  )
  assert stats.unreadable == (str(bad),)
  assert stats.messages == 5 and stats.pairs == 3


def test_build_adds_pairs_to_train_only_minus_held_out(tmp_path):
  lists = tmp_path / 'lists'
  write_fixture(str(lists))
  plain = debian.build(str(tmp_path / 'plain'), str(lists))
  held_out = {
    row[1]
    for split in ('validation', 'test')
    for row in _read_rows(tmp_path / 'plain' / 'ende' / f'{split}.tsv')
  }
  leaked = sorted(held_out)[0]
  mo = tmp_path / 'de.mo'
  write_mo(
    mo,
    {
      'The device is busy, try again later': (
        'Das Gerät ist belegt, später erneut versuchen'
      ),
      leaked: 'Ein Satz, der im Test steht und nicht trainiert wird',
    },
  )
  out = tmp_path / 'out'
  manifest = debian.build(str(out), str(lists), catalogues=[str(mo)])
  for split in ('validation', 'test'):
    assert manifest['counts']['ende'][split] == plain['counts']['ende'][split]
    assert _read_rows(out / 'ende' / f'{split}.tsv') == _read_rows(
      tmp_path / 'plain' / 'ende' / f'{split}.tsv'
    )
  train = _read_rows(out / 'ende' / 'train.tsv')
  mo_rows = [r for r in train if r[0].startswith('mo:')]
  assert [r[1] for r in mo_rows] == ['The device is busy, try again later']
  assert manifest['ende_train_sources'] == {
    'descriptions': plain['counts']['ende']['train'],
    'gettext': 1,
  }
  assert manifest['catalogues']['pairs'] == 2


def test_cli_reports_pairs_per_source(tmp_path, capsys):
  lists = tmp_path / 'lists'
  write_fixture(str(lists), compress_de=False)
  locale = tmp_path / 'locale'
  locale.mkdir()
  write_mo(
    locale / 'x.mo',
    {'The device is busy, try again later': 'Das Gerät ist belegt, bitte'},
  )
  argv = ['data', 'build', '--out_dir', str(tmp_path / 'out')]
  argv += ['--lists_dir', str(lists), '--locale_glob', str(locale / '*.mo')]
  assert spec_decode_main.run(argv) == 0
  out = capsys.readouterr().out
  assert '1 from 1 gettext catalogues' in out

"""Offline real data: EnDe translation and summarization from Debian.

Debian ships every package description in English (`Translation-en`: a
one-line synopsis plus a long description) and, for many packages, a German
translation (`Translation-de`). Both files pair through `Description-md5`, the
md5 of the English original. After

  apt-get -o Acquire::Languages=de,en update        (as root)

they lie under /var/lib/apt/lists, plain or compressed (.lz4, .xz, .gz, .bz2,
.zst). This module turns them into two tasks:

* `ende`: English -> German. One example per translated unit: the synopsis is
  one unit and each paragraph of the long description is one unit. Whole
  descriptions would be long (often 150+ words) and mostly repeat paragraphs
  shared between packages (`foo`, `foo-data`, `foo-doc`); paragraphs are the
  unit the translators worked in, short enough for a small model, and can be
  deduplicated. Long paragraphs are used only when the English and the German
  descriptions have the same number of paragraphs and their lengths agree
  (character ratio German/English within [0.5, 3]). Units over 256 English
  words (a handful of giant lists) are dropped.
* `summarize`: English long description (paragraphs joined by a space) ->
  English synopsis. Descriptions over 512 words are dropped.

The `ende` train split also takes the human translations of program
messages that Debian installs as German gettext catalogues (`*.mo`, read by
`gettext_pairs`), minus any pair whose English or German text is in
validation or test; validation and test stay the descriptions' alone, so
numbers on them do not move when packages are installed. The manifest
counts the train pairs per source (`ende_train_sources`).

Cleaning: Debian's ` .` lines separate paragraphs; the lines of a paragraph
are joined with single spaces; bullet markers (`*`, `-`, `+`, `o`, `•`) at
the start of an indented line become `* `; all whitespace (tabs included)
collapses to single spaces, so every text is one TSV-safe line.

Splits are deterministic: a salted sha256 of a split key sends an example to
train / validation / test (90/5/5 by default). Exact duplicates would leak
between splits, so the key is chosen per task:

* `ende`: the cleaned English text. Each English text appears once (with the
  German of the smallest Description-md5 that carries it), so a paragraph
  shared by many packages can never be both trained on and tested.
* `summarize`: the Description-md5 (one example per description), except
  that descriptions with the same first paragraph (package families) share
  the split of the smallest such md5; exact duplicate (source, target) pairs
  are dropped.

Output (`--out_dir`, default `data/debian`, gitignored):

  ende/{train,validation,test}.tsv        id <TAB> source <TAB> target
  summarize/{train,validation,test}.tsv   (first line is that header)
  manifest.json                           counts, source files and sha256

Rows are sorted by id, so a rebuild from the same sources is byte-identical.
Ids are `<Description-md5>:s` (synopsis) or `<Description-md5>:p<k>`
(paragraph k of the long description) for `ende`, `<Description-md5>` for
`summarize`.

Usage:

  spec-decode data build --out_dir data/debian [--fetch]   (data/build_cli.py)
"""

import bz2
import collections
import dataclasses
import glob
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from spec_decode.data import gettext_pairs

DEFAULT_LISTS_DIR = '/var/lib/apt/lists'
DEFAULT_OUT_DIR = os.path.join('data', 'debian')
DATA_DIR_ENV = 'SPEC_DECODE_DEBIAN_DIR'
SPLITS = ('train', 'validation', 'test')
TASK_DIRS = ('ende', 'summarize')
TSV_HEADER = ('id', 'source', 'target')
FORMAT_VERSION = 2
FETCH_COMMAND = 'apt-get -o Acquire::Languages=de,en update'
BUILD_COMMAND = 'spec-decode data build --out_dir {out_dir}'

_EXTENSIONS = ('', '.lz4', '.xz', '.gz', '.bz2', '.zst', '.lzma')
_SPLIT_SALT = 'spec_decode/debian/v1/'
_BULLET_RE = re.compile(r'^\s{1,}(?:[*+\-•]|o)\s+(?=\S)')
_WS_RE = re.compile(r'\s+')
_CONTROL_RE = re.compile(r'[\x00-\x08\x0b-\x1f\x7f]')
_MIN_RATIO, _MAX_RATIO = 0.5, 3.0
_MAX_WORDS = {'ende': 256, 'summarize': 512}


class SourceMissingError(FileNotFoundError):
  """The Debian translation files are not where the builder looks."""


class FetchError(RuntimeError):
  """`apt-get update` could not fetch the translation files."""


@dataclasses.dataclass(frozen=True)
class Description:
  """One package description in one language.

  Attributes:
    md5: Description-md5, the key shared by all languages.
    package: the first package name that carries the description.
    synopsis: the cleaned one-line synopsis.
    paragraphs: the cleaned paragraphs of the long description.
  """

  md5: str
  package: str
  synopsis: str
  paragraphs: tuple[str, ...]


# ------------------------------------------------------------------ reading.


def _decompress_with_tool(path: str) -> bytes:
  """Decompresses `path` with a command-line tool (apt's as a last resort)."""
  ext = os.path.splitext(path)[1]
  tools = {'.lz4': ['lz4', '-dc'], '.zst': ['zstd', '-dc']}
  candidates = []
  if ext in tools and shutil.which(tools[ext][0]):
    candidates.append(tools[ext] + [path])
  apt_helper = '/usr/lib/apt/apt-helper'
  if os.access(apt_helper, os.X_OK):
    candidates.append([apt_helper, 'cat-file', path])
  for cmd in candidates:
    proc = subprocess.run(cmd, capture_output=True, check=False)
    if proc.returncode == 0:
      return proc.stdout
  raise RuntimeError(
    f'Cannot decompress {path}: install the `{tools.get(ext, ["?"])[0]}` '
    'command (apt-get install lz4 zstd) or the matching Python module.'
  )


def read_text(path: str) -> str:
  """Returns the UTF-8 text of a plain or compressed apt list file."""
  ext = os.path.splitext(path)[1]
  if ext == '.gz':
    with gzip.open(path, 'rb') as f:
      data = f.read()
  elif ext in ('.xz', '.lzma'):
    with lzma.open(path, 'rb') as f:
      data = f.read()
  elif ext == '.bz2':
    with bz2.open(path, 'rb') as f:
      data = f.read()
  elif ext == '.lz4':
    try:
      import lz4.frame  # Optional dependency.

      with lz4.frame.open(path, 'rb') as f:
        data = f.read()
    except ImportError:
      data = _decompress_with_tool(path)
  elif ext == '.zst':
    try:
      import zstandard  # Optional dependency.

      with open(path, 'rb') as f:
        data = zstandard.ZstdDecompressor().stream_reader(f).read()
    except ImportError:
      data = _decompress_with_tool(path)
  else:
    with open(path, 'rb') as f:
      data = f.read()
  return data.decode('utf-8', errors='replace')


def parse_stanzas(text: str) -> Iterator[dict[str, str]]:
  """Parses deb822 text into dicts; a multi-line value keeps its newlines.

  Continuation lines (starting with a space or a tab) are appended to the
  previous field verbatim (leading space included), after a newline.

  Args:
    text: the whole file.

  Yields:
    One `{field: value}` dict per stanza.
  """
  stanza: dict[str, str] = {}
  key = None
  for line in io.StringIO(text):
    line = line.rstrip('\n').rstrip('\r')
    if not line.strip():
      if stanza:
        yield stanza
      stanza, key = {}, None
    elif line[0] in ' \t':
      if key is not None:
        stanza[key] += '\n' + line
    elif ':' in line:
      key, value = line.split(':', 1)
      key = key.strip()
      stanza[key] = value.strip()
  if stanza:
    yield stanza


def clean_text(text: str) -> str:
  """Collapses whitespace and drops control characters: one TSV-safe line."""
  text = _CONTROL_RE.sub(' ', text)
  return _WS_RE.sub(' ', text).strip()


def split_paragraphs(long_description: str) -> tuple[str, ...]:
  """Splits and cleans the continuation lines of a Description field.

  Args:
    long_description: the lines after the synopsis, each still starting with
      its leading space (as `parse_stanzas` keeps them).

  Returns:
    The cleaned, non-empty paragraphs, bullets normalized to `* `.
  """
  paragraphs, current = [], []
  for raw in long_description.split('\n'):
    line = raw[1:] if raw[:1] in (' ', '\t') else raw
    if line.strip() == '.':
      paragraphs.append(current)
      current = []
      continue
    # An indented bullet (`  * item`, `  - item`, `  o item`).
    line = _BULLET_RE.sub('* ', ' ' + line) if raw.startswith('  ') else line
    current.append(line)
  paragraphs.append(current)
  cleaned = (clean_text(' '.join(p)) for p in paragraphs)
  return tuple(p for p in cleaned if p)


def parse_translation_file(text: str, lang: str) -> Iterator[Description]:
  """Yields the descriptions of one Translation-<lang> file."""
  field = f'Description-{lang}'
  for stanza in parse_stanzas(text):
    md5 = stanza.get('Description-md5')
    value = stanza.get(field)
    if not md5 or value is None:
      continue
    synopsis, _, rest = value.partition('\n')
    yield Description(
      md5=md5.strip().lower(),
      package=stanza.get('Package', ''),
      synopsis=clean_text(synopsis),
      paragraphs=split_paragraphs(rest),
    )


def find_sources(lists_dir: str, lang: str) -> list[str]:
  """Returns the Translation-<lang> files in `lists_dir`, one per index.

  Apt keeps each index once, plain or compressed; if several encodings of one
  index are present, the first in `_EXTENSIONS` order is used.

  Args:
    lists_dir: the apt lists directory (not searched recursively, so the
      `partial/` downloads are ignored).
    lang: a language code such as `en` or `de`.
  """
  by_stem: dict[str, str] = {}
  for ext in _EXTENSIONS:
    pattern = os.path.join(lists_dir, f'*_i18n_Translation-{lang}{ext}')
    for path in sorted(glob.glob(pattern)):
      stem = path[: len(path) - len(ext)] if ext else path
      if os.path.isfile(path) and stem not in by_stem:
        by_stem[stem] = path
  return sorted(by_stem.values())


def missing_source_message(lists_dir: str, out_dir: str, what: str) -> str:
  """The error text that says exactly what to run."""
  build = BUILD_COMMAND.format(out_dir=out_dir)
  return (
    f'No Debian {what} under {lists_dir}.\n'
    'Fetch the English and German package descriptions, as root, with\n'
    f'  {FETCH_COMMAND}\n'
    f'then build the data with\n  {build}\n'
    f'(or let the builder fetch them: {build} --fetch). A later plain '
    '`apt-get update` deletes the translation files again; the built data '
    'directory stays. Use --lists_dir if the files are elsewhere.'
  )


def load_descriptions(
  paths: Iterable[str], lang: str
) -> dict[str, Description]:
  """Reads descriptions keyed by md5; the first file that has one wins."""
  out: dict[str, Description] = {}
  for path in paths:
    for desc in parse_translation_file(read_text(path), lang):
      out.setdefault(desc.md5, desc)
  return out


# ---------------------------------------------------------------- building.


def split_of(key: str, fractions: Sequence[float] = (0.9, 0.05, 0.05)) -> str:
  """Deterministic split of `key` from a salted sha256.

  Args:
    key: any string.
    fractions: train, validation and test fractions (summing to 1).

  Returns:
    'train', 'validation' or 'test'.
  """
  if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-6:
    raise ValueError(f'fractions must be 3 numbers summing to 1: {fractions}')
  digest = hashlib.sha256((_SPLIT_SALT + key).encode('utf-8')).digest()
  u = int.from_bytes(digest[:8], 'big') / 2.0**64
  if u < fractions[0]:
    return 'train'
  if u < fractions[0] + fractions[1]:
    return 'validation'
  return 'test'


def _ratio_ok(en: str, de: str) -> bool:
  return _MIN_RATIO <= len(de) / max(len(en), 1) <= _MAX_RATIO


def ende_examples(
  english: dict[str, Description], german: dict[str, Description]
) -> list[tuple[str, str, str]]:
  """Aligned (id, English, German) units, one per distinct English text."""
  best: dict[str, tuple[str, str, str]] = {}
  for md5 in sorted(german):
    en, de = english.get(md5), german[md5]
    if en is None:
      continue
    units = [(f'{md5}:s', en.synopsis, de.synopsis)]
    if len(en.paragraphs) == len(de.paragraphs):
      units += [
        (f'{md5}:p{k}', e, d)
        for k, (e, d) in enumerate(
          zip(en.paragraphs, de.paragraphs, strict=True)
        )
      ]
    for uid, e, d in units:
      too_long = len(e.split()) > _MAX_WORDS['ende']
      if e and d and _ratio_ok(e, d) and not too_long:
        best.setdefault(e, (uid, e, d))
  return list(best.values())


def summarize_examples(
  english: dict[str, Description],
) -> list[tuple[str, str, str, str]]:
  """(id, long description, synopsis, split key) per English description."""
  family_key: dict[str, str] = {}
  for md5 in sorted(english):
    desc = english[md5]
    if desc.paragraphs:
      family_key.setdefault(desc.paragraphs[0], md5)
  seen = set()
  out = []
  for md5 in sorted(english):
    desc = english[md5]
    if not desc.paragraphs or not desc.synopsis:
      continue
    source = ' '.join(desc.paragraphs)
    too_long = len(source.split()) > _MAX_WORDS['summarize']
    if too_long or (source, desc.synopsis) in seen:
      continue
    seen.add((source, desc.synopsis))
    out.append((md5, source, desc.synopsis, family_key[desc.paragraphs[0]]))
  return out


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


def _write_tsv(path: str, rows: Iterable[tuple[str, str, str]]) -> int:
  tmp = path + '.tmp'
  n = 0
  with open(tmp, 'w', encoding='utf-8', newline='\n') as f:
    f.write('\t'.join(TSV_HEADER) + '\n')
    for row in sorted(rows):
      f.write('\t'.join(row) + '\n')
      n += 1
  os.replace(tmp, path)
  return n


def build(
  out_dir: str = DEFAULT_OUT_DIR,
  lists_dir: str = DEFAULT_LISTS_DIR,
  fractions: Sequence[float] = (0.9, 0.05, 0.05),
  catalogues: Sequence[str] = (),
) -> dict[str, Any]:
  """Builds both tasks' splits into `out_dir` and returns the manifest.

  Args:
    out_dir: the data directory to write.
    lists_dir: where the Translation-en / Translation-de files are.
    fractions: train, validation and test fractions.
    catalogues: German gettext `.mo` files (`gettext_pairs`); their pairs
      join the `ende` train split only, minus any whose English or German
      text is in validation or test (which stay the descriptions' alone).

  Returns:
    The manifest (also written to `out_dir/manifest.json`).

  Raises:
    SourceMissingError: a Translation-en or Translation-de file is missing,
      with the commands to run in the message.
  """
  en_paths = find_sources(lists_dir, 'en')
  de_paths = find_sources(lists_dir, 'de')
  for paths, what in (
    (en_paths, 'Translation-en'),
    (de_paths, 'Translation-de'),
  ):
    if not paths:
      raise SourceMissingError(
        missing_source_message(lists_dir, out_dir, f'{what} file')
      )
  english = load_descriptions(en_paths, 'en')
  german = load_descriptions(de_paths, 'de')
  if not english or not german:
    raise SourceMissingError(
      missing_source_message(lists_dir, out_dir, 'package descriptions')
    )

  splits: dict[str, dict[str, list[tuple[str, str, str]]]] = {
    t: {s: [] for s in SPLITS} for t in TASK_DIRS
  }
  for uid, en, de in ende_examples(english, german):
    splits['ende'][split_of(en, fractions)].append((uid, en, de))
  from_descriptions = len(splits['ende']['train'])
  mo_pairs, mo_stats = gettext_pairs.read_pairs(catalogues)
  held_out = {
    text
    for split in ('validation', 'test')
    for _, en, de in splits['ende'][split]
    for text in (en, de)
  } | {en for _, en, _ in splits['ende']['train']}
  splits['ende']['train'] += [
    row for row in mo_pairs if row[1] not in held_out and row[2] not in held_out
  ]
  for uid, source, target, key in summarize_examples(english):
    splits['summarize'][split_of(key, fractions)].append((uid, source, target))

  counts: dict[str, dict[str, int]] = collections.defaultdict(dict)
  for task in TASK_DIRS:
    os.makedirs(os.path.join(out_dir, task), exist_ok=True)
    for split in SPLITS:
      path = os.path.join(out_dir, task, f'{split}.tsv')
      counts[task][split] = _write_tsv(path, splits[task][split])

  manifest = {
    'format_version': FORMAT_VERSION,
    'builder': 'spec_decode.data.debian',
    'lists_dir': os.path.abspath(lists_dir),
    'fractions': dict(zip(SPLITS, fractions, strict=True)),
    'columns': list(TSV_HEADER),
    'counts': dict(counts),
    'descriptions': {'en': len(english), 'de': len(german)},
    # Where the ende train pairs came from.
    'ende_train_sources': {
      'descriptions': from_descriptions,
      'gettext': len(splits['ende']['train']) - from_descriptions,
    },
    'catalogues': {
      'files': len(mo_stats.files),
      'unreadable': list(mo_stats.unreadable),
      'messages': mo_stats.messages,
      'pairs': mo_stats.pairs,
    },
    'sources': [
      {
        'path': os.path.abspath(p),
        'lang': lang,
        'bytes': os.path.getsize(p),
        'sha256': _sha256(p),
      }
      for lang, paths in (('en', en_paths), ('de', de_paths))
      for p in paths
    ],
  }
  tmp = os.path.join(out_dir, 'manifest.json.tmp')
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(manifest, f, indent=2, sort_keys=True)
    f.write('\n')
  os.replace(tmp, os.path.join(out_dir, 'manifest.json'))
  return manifest


def default_data_dir() -> str:
  """`$SPEC_DECODE_DEBIAN_DIR`, else `data/debian` under the working dir."""
  return os.environ.get(DATA_DIR_ENV) or DEFAULT_OUT_DIR


def load_manifest(out_dir: str) -> dict[str, Any] | None:
  """The manifest of a built data directory, or None if it is not built."""
  path = os.path.join(out_dir, 'manifest.json')
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def ensure_built(
  out_dir: str | None = None,
  lists_dir: str = DEFAULT_LISTS_DIR,
  fetch_if_missing: bool = False,
) -> dict[str, Any]:
  """Builds the data unless `out_dir` already holds a manifest.

  Args:
    out_dir: the data directory (default: `default_data_dir()`).
    lists_dir: the apt lists directory.
    fetch_if_missing: run `fetch()` first when the sources are missing.

  Returns:
    The manifest.
  """
  out_dir = out_dir or default_data_dir()
  manifest = load_manifest(out_dir)
  if manifest is not None:
    return manifest
  if fetch_if_missing and not find_sources(lists_dir, 'de'):
    fetch(lists_dir)
  return build(out_dir, lists_dir, catalogues=gettext_pairs.find_catalogues())


# ---------------------------------------------------------------- fetching.


def fetch(lists_dir: str = DEFAULT_LISTS_DIR, timeout: float = 600.0) -> None:
  """Runs `apt-get -o Acquire::Languages=de,en update` (needs root, network).

  Args:
    lists_dir: where the files are expected afterwards.
    timeout: seconds before giving up.

  Raises:
    FetchError: not root, no apt-get, or the files did not arrive (offline).
  """
  if shutil.which('apt-get') is None:
    raise FetchError(
      'apt-get not found: this is not a Debian-based system. Copy '
      'Translation-en and Translation-de files from a Debian mirror '
      '(dists/bookworm/main/i18n/) into a directory and pass --lists_dir.'
    )
  if hasattr(os, 'geteuid') and os.geteuid() != 0:
    raise FetchError(f'Fetching needs root. Run:\n  sudo {FETCH_COMMAND}')
  cmd = FETCH_COMMAND.split()
  try:
    proc = subprocess.run(
      cmd, capture_output=True, text=True, timeout=timeout, check=False
    )
  except subprocess.TimeoutExpired as e:
    raise FetchError(
      f'`{FETCH_COMMAND}` timed out after {timeout:.0f}s: is the machine '
      'offline?'
    ) from e
  tail = '\n'.join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
  if proc.returncode != 0 or not find_sources(lists_dir, 'de'):
    raise FetchError(
      f'`{FETCH_COMMAND}` did not produce Translation-de under {lists_dir} '
      f'(exit code {proc.returncode}); the machine may be offline or its '
      f'mirror may not publish translations. apt said:\n{tail}'
    )

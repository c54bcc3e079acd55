"""English-German pairs from installed gettext catalogues (`*.mo`).

Debian installs the human translations of program messages as compiled
gettext catalogues: `/usr/share/locale/de/LC_MESSAGES/<domain>.mo` (and a
few elsewhere, e.g. vim's). Each holds `msgid` (the English original) ->
`msgstr` (the German translation) for one program. On a stock image that is
about 75k messages, of which about 28k have 5 to 40 English words: real,
human-made parallel text, offline, that grows as packages are installed.

Catalogues are read with the standard library's `gettext.GNUTranslations`.
Cleaning, per message:

* plural forms: only the singular (`msgid`, `msgstr[0]`);
* keyboard accelerators go (`&File`, `_Open` -> `File`, `Open`), since they
  are UI markup, not language; `\\n`, tabs and runs of spaces collapse to one
  space (every text is one TSV-safe line);
* dropped: the catalogue header (empty `msgid`), untranslated messages
  (`msgstr == msgid`), messages outside 5-40 English words, messages that
  are mostly format directives or symbols (under half of their
  whitespace-separated words contain a letter), and German/English length
  ratios outside [0.5, 3] (the Debian-description rule).

One pair per distinct English text (the catalogue that sorts first wins), so
the same message shipped by several programs counts once. A catalogue that
`gettext` cannot read (a header that is not UTF-8, for instance) is skipped
and counted.
"""

import dataclasses
import gettext
import glob
import os
import re
from collections.abc import Iterable
from collections.abc import Sequence

# Where Debian puts German catalogues (globs).
DEFAULT_LOCALE_GLOBS = (
  '/usr/share/locale/de/LC_MESSAGES/*.mo',
  '/usr/share/locale-langpack/de/LC_MESSAGES/*.mo',
  '/usr/share/*/lang/de/LC_MESSAGES/*.mo',
  '/usr/share/*/*/lang/de/LC_MESSAGES/*.mo',
)
MIN_WORDS, MAX_WORDS = 5, 40
_MIN_RATIO, _MAX_RATIO = 0.5, 3.0
_WS_RE = re.compile(r'\s+')
# `&` or `_` directly before a letter: a menu accelerator.
_ACCEL_RE = re.compile(r'(?<![\w&_])[&_](?=[^\W\d_])')
_LETTER_RE = re.compile(r'[^\W\d_]')
# printf directives (`%s`, `%-10.3lf`, `%1$s`) and `{name}` fields.
_DIRECTIVE_RE = re.compile(
  r'%(?:\d+\$)?[-+ #0-9.*]*[hlLqjzt]*[a-zA-Z%]|\{\w*\}'
)


@dataclasses.dataclass(frozen=True)
class CatalogueStats:
  """What reading the catalogues gave.

  Attributes:
    files: catalogue paths read, sorted.
    unreadable: paths `gettext` could not parse.
    messages: translated messages seen (header and plurals excluded).
    pairs: pairs kept after cleaning and deduplication.
  """

  files: tuple[str, ...]
  unreadable: tuple[str, ...]
  messages: int
  pairs: int


def find_catalogues(globs: Iterable[str] = DEFAULT_LOCALE_GLOBS) -> list[str]:
  """Sorted, distinct `.mo` paths matching `globs` (real paths)."""
  found = {os.path.realpath(p) for g in globs for p in glob.glob(g)}
  return sorted(p for p in found if os.path.isfile(p))


def clean_message(text: str) -> str:
  """One line of text: accelerators removed, whitespace collapsed."""
  text = _ACCEL_RE.sub('', text)
  return _WS_RE.sub(' ', text).strip()


def _is_prose(text: str) -> bool:
  words = text.split()
  with_letters = sum(
    1 for w in words if _LETTER_RE.search(_DIRECTIVE_RE.sub('', w))
  )
  return with_letters * 2 >= len(words)


def keep_pair(en: str, de: str) -> bool:
  """Whether a cleaned (English, German) message is a usable example."""
  if not en or not de or en == de:
    return False
  n = len(en.split())
  if not MIN_WORDS <= n <= MAX_WORDS:
    return False
  if not (_is_prose(en) and _is_prose(de)):
    return False
  return _MIN_RATIO <= len(de) / len(en) <= _MAX_RATIO


def _singular_messages(catalog: dict) -> Iterable[tuple[str, str]]:
  for key, value in catalog.items():
    if isinstance(key, tuple):  # (msgid, plural index)
      if key[1] != 0:
        continue
      key = key[0]
    if key:
      yield key, value


def read_pairs(
  paths: Sequence[str],
) -> tuple[list[tuple[str, str, str]], CatalogueStats]:
  """(id, English, German) pairs from catalogue files, and what was read.

  Args:
    paths: `.mo` files, read in sorted order.

  Returns:
    The pairs sorted by id (`mo:<domain>:<k>`, k the message's rank in its
    catalogue's sorted English texts), and the `CatalogueStats`.
  """
  best: dict[str, tuple[str, str, str]] = {}
  unreadable, messages = [], 0
  paths = sorted(paths)
  for path in paths:
    try:
      with open(path, 'rb') as f:
        catalog = gettext.GNUTranslations(f)._catalog  # noqa: SLF001
    except (OSError, UnicodeDecodeError, ValueError, IndexError) as e:
      del e  # Counted: one bad header must not stop the build.
      unreadable.append(path)
      continue
    domain = os.path.splitext(os.path.basename(path))[0]
    cleaned = sorted(
      (clean_message(en), clean_message(de))
      for en, de in _singular_messages(catalog)
    )
    messages += len(cleaned)
    for k, (en, de) in enumerate(cleaned):
      if keep_pair(en, de):
        best.setdefault(en, (f'mo:{domain}:{k}', en, de))
  pairs = sorted(best.values())
  stats = CatalogueStats(tuple(paths), tuple(unreadable), messages, len(pairs))
  return pairs, stats

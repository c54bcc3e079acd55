"""`spec-decode data build`: the Debian EnDe and summarize splits.

  spec-decode data build --out_dir data/debian [--fetch] [--no_gettext]
      [--demo_slice data/demo]

Builds `spec_decode.data.debian`'s splits from apt's package descriptions
and, for the EnDe train split, the installed German gettext catalogues
(`spec_decode.data.gettext_pairs`), and prints how many pairs each source
gave. `--demo_slice DIR` then writes the demo's evaluation data (the first
rows of the EnDe test split, with a manifest) into DIR
(`spec_decode.data.demo_slice`; the repository ships it as `data/demo`).
"""

import argparse
import sys
from collections.abc import Sequence

from spec_decode.data import debian
from spec_decode.data import demo_slice
from spec_decode.data import gettext_pairs


def main(argv: Sequence[str] | None = None) -> int:
  """`spec-decode data build`: builds the data; returns the exit code."""
  parser = argparse.ArgumentParser(
    prog='spec-decode data build',
    description=(
      'Build EnDe translation and summarization splits from Debian package '
      'descriptions.'
    ),
  )
  parser.add_argument('--out_dir', default=debian.default_data_dir())
  parser.add_argument('--lists_dir', default=debian.DEFAULT_LISTS_DIR)
  parser.add_argument(
    '--fetch',
    action='store_true',
    help=f'run `{debian.FETCH_COMMAND}` first (root, network)',
  )
  parser.add_argument(
    '--locale_glob',
    action='append',
    help='German gettext catalogues (.mo) whose messages join the ende '
    'train split; repeatable (default: '
    + ', '.join(gettext_pairs.DEFAULT_LOCALE_GLOBS)
    + ')',
  )
  parser.add_argument(
    '--no_gettext',
    action='store_true',
    help='use the package descriptions alone',
  )
  parser.add_argument(
    '--demo_slice',
    default=None,
    help='also write the demo evaluation data (the first rows of the ende '
    'test split and a manifest) into this directory, e.g. data/demo',
  )
  parser.add_argument(
    '--demo_examples', type=int, default=demo_slice.DEFAULT_EXAMPLES
  )
  args = parser.parse_args(argv)
  catalogues = (
    []
    if args.no_gettext
    else gettext_pairs.find_catalogues(
      args.locale_glob or gettext_pairs.DEFAULT_LOCALE_GLOBS
    )
  )
  try:
    if args.fetch:
      debian.fetch(args.lists_dir)
    manifest = debian.build(args.out_dir, args.lists_dir, catalogues=catalogues)
  except (debian.SourceMissingError, debian.FetchError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  print(f'wrote {args.out_dir}')
  for task, per_split in manifest['counts'].items():
    row = ', '.join(f'{s} {n}' for s, n in per_split.items())
    print(f'  {task}: {row}')
  sources = manifest['ende_train_sources']
  mo = manifest['catalogues']
  print(
    f'  ende train pairs: {sources["descriptions"]} from package '
    f'descriptions, {sources["gettext"]} from {mo["files"]} gettext '
    f'catalogues ({mo["pairs"]} usable of {mo["messages"]} messages; '
    f'{len(mo["unreadable"])} unreadable)'
  )
  if args.demo_slice:
    sliced = demo_slice.write(
      args.out_dir, args.demo_slice, examples=args.demo_examples
    )
    print(
      f'wrote {args.demo_slice}: the first {sliced["rows"]} of '
      f'{sliced["rows_in_split"]} ende test rows'
    )
  return 0

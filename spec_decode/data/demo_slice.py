"""The demo's evaluation data: a slice of the Debian EnDe test split.

`make demo` (configs/demo_debian_ende.gin) reads the first 50 examples of
the `ende` test split. Those rows ship with the repository under
`data/demo/` (`ende/test.tsv`, and `manifest.json` saying where they came
from and how to rebuild them), so the demo needs neither root nor apt.
`spec-decode data build` still builds the whole data (every split of both
tasks, for training and longer runs); with `--demo_slice DIR` it writes
this slice from what it built:

  spec-decode data build --out_dir data/debian --fetch --demo_slice data/demo

The split is a function of the Debian package descriptions the build read
(a salted hash of each English text, `debian.split_of`), so a rebuild from
other translation files can give other rows; the manifest keeps the source
files' sha256 and the whole split's.
"""

import hashlib
import json
import os
from typing import Any

from spec_decode.data import debian

DEFAULT_DIR = os.path.join('data', 'demo')
DEFAULT_EXAMPLES = 50
REBUILD_COMMAND = (
  'spec-decode data build --out_dir data/debian --fetch --demo_slice {out_dir}'
)


def _sha256(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def write(
  full_dir: str,
  out_dir: str = DEFAULT_DIR,
  task: str = 'ende',
  split: str = 'test',
  examples: int = DEFAULT_EXAMPLES,
) -> dict[str, Any]:
  """Writes the first `examples` rows of a built split, and a manifest.

  Args:
    full_dir: a data directory `debian.build` wrote (with its manifest).
    out_dir: where the slice goes (`<out_dir>/<task>/<split>.tsv`).
    task: the task directory (`ende` or `summarize`).
    split: the split.
    examples: rows to keep (the first ones: what an eval run of that many
      examples reads).

  Returns:
    The slice's manifest (also written to `<out_dir>/manifest.json`).
  """
  full = debian.load_manifest(full_dir)
  if full is None:
    raise FileNotFoundError(
      f'{full_dir} holds no built data (no manifest.json); run '
      + debian.BUILD_COMMAND.format(out_dir=full_dir)
    )
  source = os.path.join(full_dir, task, f'{split}.tsv')
  with open(source, encoding='utf-8') as f:
    lines = f.readlines()
  header, rows = lines[0], lines[1 : examples + 1]
  os.makedirs(os.path.join(out_dir, task), exist_ok=True)
  path = os.path.join(out_dir, task, f'{split}.tsv')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(header + ''.join(rows))
  manifest = {
    'what': (
      f'The first {len(rows)} rows (sorted by id, as built) of the Debian '
      f'{task} {split} split: what `make demo` '
      '(configs/demo_debian_ende.gin, NUM_EXAMPLES = 50) reads.'
    ),
    'origin': (
      "Debian's package descriptions: English (Translation-en) and their "
      'German translations by the Debian Description Translation Project '
      '(Translation-de), as apt fetches them with `'
      + debian.FETCH_COMMAND
      + '`; one example per synopsis or paragraph (`spec_decode.data.debian`).'
    ),
    'rebuild': REBUILD_COMMAND.format(out_dir=out_dir),
    'task': task,
    'split': split,
    'columns': list(debian.TSV_HEADER),
    'rows': len(rows),
    'rows_in_split': full['counts'][task][split],
    'sha256': _sha256(path),
    'split_sha256': _sha256(source),
    'built_from': {
      key: full[key]
      for key in ('builder', 'format_version', 'fractions', 'descriptions')
    },
    'sources': [
      {k: s[k] for k in ('lang', 'bytes', 'sha256')}
      | {'file': os.path.basename(s['path'])}
      for s in full['sources']
    ],
  }
  with open(os.path.join(out_dir, 'manifest.json'), 'w', encoding='utf-8') as f:
    json.dump(manifest, f, indent=2, sort_keys=True)
    f.write('\n')
  return manifest

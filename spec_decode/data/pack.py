"""`spec-decode data pack`: the Debian splits a training job needs, packed.

  spec-decode data pack --data_dir data/debian --out .gpu/demo_train.tar.xz

A GPU machine gets the repository's working tree and nothing else (64 MiB
in all), and `data/` is not part of it. The pack is what travels instead:
an xz-compressed tar of the splits the demo pair trains on (by default the
`train` and `validation` splits of `ende` and `summarize`; the test splits
stay here, where the models are evaluated), the builder's `manifest.json`
and a `pack.json` saying what is inside (lines and sha256 of each file).
The tar is deterministic: the same splits give the same bytes.

`unpack(pack_path, dest)` extracts it (the job's side) and returns the
data directory to give the tasks (`<dest>/debian`).
"""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
from collections.abc import Sequence
from typing import Any

from spec_decode.data import debian

DEFAULT_OUT = '.gpu/demo_train.tar.xz'
DEFAULT_TASKS = ('ende', 'summarize')
DEFAULT_SPLITS = ('train', 'validation')
# The top folder inside the tar; `unpack` returns `<dest>/ROOT`.
ROOT = 'debian'
PACK_INFO = 'pack.json'
MANIFEST = 'manifest.json'


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def _count_lines(path: str) -> int:
  with open(path, 'rb') as f:
    return sum(
      block.count(b'\n') for block in iter(lambda: f.read(1 << 20), b'')
    )


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
  """A member with no time or owner (the same bytes on every run)."""
  info = tarfile.TarInfo(name)
  info.size = size
  info.mode = 0o644
  info.mtime = 0
  return info


def pack(
  data_dir: str,
  out: str,
  tasks: Sequence[str] = DEFAULT_TASKS,
  splits: Sequence[str] = DEFAULT_SPLITS,
  preset: int = 9,
) -> dict[str, Any]:
  """Writes the pack of `data_dir`'s `tasks` x `splits` TSV files to `out`.

  Args:
    data_dir: a `spec-decode data build` directory (`<task>/<split>.tsv`).
    out: the `.tar.xz` to write (its folder is made).
    tasks: the task folders to take.
    splits: the splits to take of each.
    preset: the xz preset (0-9).

  Returns:
    The pack's `pack.json` contents, plus `bytes` (the pack's size).

  Raises:
    FileNotFoundError: a split file is missing (with the build command).
  """
  files = [os.path.join(t, f'{s}.tsv') for t in tasks for s in splits]
  for rel in files:
    if not os.path.isfile(os.path.join(data_dir, rel)):
      raise FileNotFoundError(
        f'No split file {os.path.join(data_dir, rel)}; build the data with\n'
        f'  {debian.BUILD_COMMAND.format(out_dir=data_dir)}'
      )
  info = {
    'format_version': 1,
    'source_dir': os.path.abspath(data_dir),
    'tasks': list(tasks),
    'splits': list(splits),
    'files': {
      rel: {
        'bytes': os.path.getsize(os.path.join(data_dir, rel)),
        # Lines after the TSV header: the split's examples.
        'examples': _count_lines(os.path.join(data_dir, rel)) - 1,
        'sha256': _sha256(os.path.join(data_dir, rel)),
      }
      for rel in files
    },
  }
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  tmp = out + '.tmp'
  with tarfile.open(
    tmp, 'w:xz', preset=preset, format=tarfile.PAX_FORMAT
  ) as tar:
    extra = {PACK_INFO: json.dumps(info, indent=1, sort_keys=True).encode()}
    manifest = os.path.join(data_dir, MANIFEST)
    if os.path.isfile(manifest):
      with open(manifest, 'rb') as f:
        extra[MANIFEST] = f.read()
    for name, payload in extra.items():
      tar.addfile(
        _tar_info(f'{ROOT}/{name}', len(payload)), io.BytesIO(payload)
      )
    for rel in files:
      path = os.path.join(data_dir, rel)
      with open(path, 'rb') as f:
        tar.addfile(_tar_info(f'{ROOT}/{rel}', os.path.getsize(path)), f)
  os.replace(tmp, out)
  return {**info, 'bytes': os.path.getsize(out)}


def unpack(pack_path: str, dest: str) -> str:
  """Extracts a pack into `dest`; returns its data directory.

  Args:
    pack_path: a `pack` output.
    dest: the folder to extract into (made if missing).

  Returns:
    `<dest>/debian`, a data directory the Debian tasks read (`data_dir`).

  Raises:
    ValueError: a file's sha256 differs from the pack's `pack.json`.
  """
  os.makedirs(dest, exist_ok=True)
  with tarfile.open(pack_path, 'r:xz') as tar:
    tar.extractall(dest, filter='data')
  data_dir = os.path.join(dest, ROOT)
  with open(os.path.join(data_dir, PACK_INFO)) as f:
    info = json.load(f)
  for rel, want in info['files'].items():
    got = _sha256(os.path.join(data_dir, rel))
    if got != want['sha256']:
      raise ValueError(f'{pack_path}: {rel} has sha256 {got}, not {want}')
  return data_dir


def main(argv: Sequence[str] | None = None) -> int:
  """`spec-decode data pack`: writes the pack; returns the exit code."""
  parser = argparse.ArgumentParser(
    prog='spec-decode data pack',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument('--data_dir', default=debian.default_data_dir())
  parser.add_argument('--out', default=DEFAULT_OUT, help='the .tar.xz')
  parser.add_argument(
    '--tasks', default=','.join(DEFAULT_TASKS), help='comma-separated'
  )
  parser.add_argument(
    '--splits', default=','.join(DEFAULT_SPLITS), help='comma-separated'
  )
  parser.add_argument('--preset', type=int, default=9, help='xz preset 0-9')
  args = parser.parse_args(argv)
  try:
    info = pack(
      args.data_dir,
      args.out,
      [t for t in args.tasks.split(',') if t],
      [s for s in args.splits.split(',') if s],
      args.preset,
    )
  except FileNotFoundError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  raw = sum(f['bytes'] for f in info['files'].values())
  print(
    f'wrote {args.out}: {info["bytes"] / 2**20:.1f} MiB '
    f'({raw / 2**20:.1f} MiB of splits)'
  )
  for rel, f in info['files'].items():
    print(f'  {rel}: {f["examples"]} examples')
  return 0

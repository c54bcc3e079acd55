"""Trained models as a few files of bounded size, and back.

A GPU machine returns at most 8 files of at most 16 MiB each (64 MiB in
all, docs/accelerator.md). `write_parts` puts the exported models of a
training job (each stage directory's `model/`, `config.gin` and
`train_log.jsonl`) into one tar, written as parts `models.tar.00`,
`models.tar.01`, ... of at most `part_bytes` each, and returns their sizes
and sha256 (the job's summary keeps them). `reassemble` checks the parts
against that summary, joins them and extracts the models.

  spec-decode train pair-unpack --from_dir DIR [--to_dir runs/demo]

reassembles the parts found in DIR (where the returned files were copied)
into `<to_dir>/target_gpu/model` and `<to_dir>/draft_gpu/model` (each a
`Model.load` directory), next to their `config.gin` and `train_log.jsonl`,
and copies the summary and the log beside them (`pair_summary.json`,
`pair.log`).
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

TAR_NAME = 'models.tar'
PART_MIB = 15
# Files back from the machine: 8, less the summary and the log.
MAX_PARTS = 6
# What of a stage directory goes into the tar.
STAGE_FILES = ('config.gin', 'train_log.jsonl')
STAGE_MODEL = 'model'
SUMMARY_FILE = 'summary.json'
LOG_FILE = 'pair.log'


class _PartWriter:
  """A write-only stream that lands in numbered files of bounded size."""

  def __init__(self, out_dir: str, name: str, part_bytes: int):
    self.out_dir, self.name, self.part_bytes = out_dir, name, part_bytes
    self.parts: list[dict[str, Any]] = []
    self.total = hashlib.sha256()
    self.size = 0
    self._file = None
    self._hash = None
    self._left = 0

  def _next(self) -> None:
    self._close_part()
    part = f'{self.name}.{len(self.parts):02d}'
    self._file = open(os.path.join(self.out_dir, part), 'wb')
    self._hash = hashlib.sha256()
    self._left = self.part_bytes
    self.parts.append({'name': part, 'bytes': 0})

  def _close_part(self) -> None:
    if self._file is not None:
      self._file.close()
      self.parts[-1]['sha256'] = self._hash.hexdigest()
      self._file = None

  def write(self, data: bytes) -> int:
    view = memoryview(data)
    while view:
      if self._file is None or not self._left:
        self._next()
      chunk = view[: self._left]
      self._file.write(chunk)
      self._hash.update(chunk)
      self.total.update(chunk)
      self.parts[-1]['bytes'] += len(chunk)
      self._left -= len(chunk)
      self.size += len(chunk)
      view = view[len(chunk) :]
    return len(data)

  def close(self) -> None:
    self._close_part()


def _members(stage_dir: str) -> list[str]:
  """The files of a stage directory that go into the tar (relative)."""
  out = [f for f in STAGE_FILES if os.path.isfile(os.path.join(stage_dir, f))]
  model = os.path.join(stage_dir, STAGE_MODEL)
  for dirpath, _, files in os.walk(model):
    for f in sorted(files):
      out.append(os.path.relpath(os.path.join(dirpath, f), stage_dir))
  return out


def _tar_bytes(stage_dir: str) -> int:
  """An upper bound of the stage's share of the tar."""
  return sum(
    1024 + -(-os.path.getsize(os.path.join(stage_dir, rel)) // 512) * 512
    for rel in _members(stage_dir)
  )


def write_parts(
  stages: Mapping[str, str],
  out_dir: str,
  part_bytes: int = PART_MIB * 2**20,
  max_parts: int = MAX_PARTS,
) -> dict[str, Any]:
  """Writes the stages' models as tar parts into `out_dir`.

  Args:
    stages: the name in the tar -> the stage directory (its `model/`,
      `config.gin` and `train_log.jsonl` go in), in order of need.
    out_dir: where the parts go.
    part_bytes: the largest part.
    max_parts: the most parts; stages that would need more are left out,
      last first.

  Returns:
    `{'models', 'left_out', 'tar_bytes', 'sha256', 'parts': [{'name',
    'bytes', 'sha256'}]}`.
  """
  names = list(stages)
  left_out = []
  while names and (
    -(-(sum(_tar_bytes(stages[n]) for n in names) + 10240) // part_bytes)
    > max_parts
  ):
    left_out.insert(0, names.pop())
  if not names:
    return {'models': [], 'left_out': left_out, 'parts': []}
  writer = _PartWriter(out_dir, TAR_NAME, part_bytes)
  with tarfile.open(
    fileobj=writer, mode='w|', format=tarfile.PAX_FORMAT
  ) as tar:
    for name in names:
      for rel in _members(stages[name]):
        tar.add(
          os.path.join(stages[name], rel), f'{name}/{rel}', recursive=False
        )
  writer.close()
  return {
    'models': names,
    'left_out': left_out,
    'tar_bytes': writer.size,
    'sha256': writer.total.hexdigest(),
    'parts': writer.parts,
  }


def _find(from_dir: str, name: str) -> str | None:
  """`name` in `from_dir` or up to two folders below it."""
  for dirpath, _, files in os.walk(from_dir):
    depth = os.path.relpath(dirpath, from_dir).count(os.sep) + (
      dirpath != from_dir
    )
    if depth <= 2 and name in files:
      return os.path.join(dirpath, name)
  return None


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def reassemble(
  from_dir: str, to_dir: str, force: bool = False
) -> dict[str, str]:
  """Joins the parts found in `from_dir` and extracts the models.

  Args:
    from_dir: where the job's files were copied (the summary and the
      parts, up to two folders down).
    to_dir: where each model's folder goes (`<to_dir>/<name>/model`).
    force: replace model folders that already exist.

  Returns:
    The name of each model -> its `Model.load` directory.

  Raises:
    FileNotFoundError: no summary, or a part is missing.
    ValueError: a part or the whole differs from the summary's sha256, the
      summary lists no parts, or a model folder exists (without `force`).
  """
  summary_path = _find(from_dir, SUMMARY_FILE)
  if summary_path is None:
    raise FileNotFoundError(f'no {SUMMARY_FILE} in {from_dir}')
  with open(summary_path) as f:
    summary = json.load(f)
  outputs = summary.get('outputs')
  if not outputs or not outputs.get('parts'):
    raise ValueError(
      f'{summary_path} lists no model parts (status {summary.get("status")})'
    )
  names = outputs['models']
  for name in names:
    if os.path.exists(os.path.join(to_dir, name)) and not force:
      raise ValueError(
        f'{os.path.join(to_dir, name)} exists (pass --force to replace it)'
      )
  os.makedirs(to_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=to_dir, prefix='.unpack_') as tmp:
    joined = os.path.join(tmp, TAR_NAME)
    with open(joined, 'wb') as out:
      for part in outputs['parts']:
        path = os.path.join(os.path.dirname(summary_path), part['name'])
        if not os.path.isfile(path):
          path = _find(from_dir, part['name'])
        if path is None:
          raise FileNotFoundError(f'part {part["name"]} not in {from_dir}')
        if _sha256(path) != part['sha256']:
          raise ValueError(f'{path}: sha256 differs from the summary')
        with open(path, 'rb') as f:
          shutil.copyfileobj(f, out)
    if _sha256(joined) != outputs['sha256']:
      raise ValueError('the joined tar differs from the summary sha256')
    staged = os.path.join(tmp, 'x')
    with tarfile.open(joined) as tar:
      tar.extractall(staged, filter='data')
    for name in names:
      dest = os.path.join(to_dir, name)
      if os.path.exists(dest):
        shutil.rmtree(dest)
      os.replace(os.path.join(staged, name), dest)
  shutil.copyfile(summary_path, os.path.join(to_dir, 'pair_summary.json'))
  log = os.path.join(os.path.dirname(summary_path), LOG_FILE)
  if os.path.isfile(log):
    shutil.copyfile(log, os.path.join(to_dir, LOG_FILE))
  return {name: os.path.join(to_dir, name, STAGE_MODEL) for name in names}


def main(argv: Sequence[str] | None = None) -> int:
  """`spec-decode train pair-unpack`; returns the exit code."""
  parser = argparse.ArgumentParser(
    prog='spec-decode train pair-unpack',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
    '--from_dir', required=True, help='the returned files (summary, parts)'
  )
  parser.add_argument('--to_dir', default='runs/demo')
  parser.add_argument('--force', action='store_true', help='replace models')
  args = parser.parse_args(argv)
  try:
    models = reassemble(args.from_dir, args.to_dir, args.force)
  except (OSError, ValueError) as e:
    print(f'spec-decode train pair-unpack: {e}', file=sys.stderr)
    return 1
  with open(os.path.join(args.to_dir, 'pair_summary.json')) as f:
    stages = json.load(f)['stages']
  for name, path in models.items():
    stage = stages.get(name.split('_')[0], {})
    print(
      f'{path}: step {stage.get("step")} ({stage.get("stopped")}), '
      f'validation loss {stage.get("validation_loss")}'
    )
  return 0

"""Where the repository's `gin/` and `configs/` live.

In a source checkout they sit next to the package; an installed package
finds them under `<prefix>/share/spec_decode/` (setup.py's data_files).
Relative checkpoint and data paths in configs (`checkpoints/demo/target`)
are also looked up under `REPO_DIR`, so runs work from any directory.
"""

import os
import sys


def _repo_dir() -> str:
  checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if os.path.isdir(os.path.join(checkout, 'gin')):
    return checkout
  return os.path.join(sys.prefix, 'share', 'spec_decode')


REPO_DIR = _repo_dir()
GIN_DIR = os.path.join(REPO_DIR, 'gin')
CONFIGS_DIR = os.path.join(REPO_DIR, 'configs')


def resolve(path: str) -> str:
  """`path` as given if it exists, else relative to the repository root."""
  path = os.path.expanduser(os.fspath(path))
  if os.path.exists(path) or os.path.isabs(path):
    return path
  in_repo = os.path.join(REPO_DIR, path)
  return in_repo if os.path.exists(in_repo) else path

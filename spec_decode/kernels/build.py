"""Builds the small-K matmul kernel library (`smallm.cc`) with g++.

  spec-decode build-kernel [--force] [--march=native]

The shared library lands next to the source (`_smallm.so`, gitignored), or in
`~/.cache/spec_decode/kernels` when the package directory is read-only. A
stamp file records a hash of the source, the flags, the compiler, the jaxlib
headers and this CPU's feature flags: a library built for another CPU
(`-march=native`) or from older source is rebuilt, never loaded. `ops.py`
calls `ensure_built()` on first use, under a file lock so that concurrent
processes (pytest workers) build once.

Environment:
  SPEC_DECODE_KERNEL_CXX    compiler (default: $CXX, else g++).
  SPEC_DECODE_KERNEL_MARCH  -march value (default: native). `x86-64-v3`
                            builds the AVX2 path, `x86-64` the generic one.
"""

import argparse
import contextlib
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

_HERE = pathlib.Path(__file__).resolve().parent
SOURCE = _HERE / 'smallm.cc'
_LIB_NAME = '_smallm.so'


class BuildError(RuntimeError):
  """The kernel library could not be built (no compiler, compile error)."""


def _compiler() -> str:
  return os.environ.get('SPEC_DECODE_KERNEL_CXX') or os.environ.get(
    'CXX', 'g++'
  )


def _march() -> str:
  return os.environ.get('SPEC_DECODE_KERNEL_MARCH') or 'native'


def _cpu_flags() -> str:
  # A -march=native build is only valid on a CPU with the same features.
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('flags'):
          return ' '.join(sorted(line.split(':', 1)[1].split()))
  except OSError:
    pass
  return ''


def _flags(march: str, include_dir: str) -> list[str]:
  return [
    '-O3',
    f'-march={march}',
    '-std=c++17',
    '-shared',
    '-fPIC',
    '-fvisibility=hidden',
    '-isystem',
    include_dir,
    '-Wall',
  ]


def _build_dir() -> pathlib.Path:
  if os.access(_HERE, os.W_OK):
    return _HERE
  cache = pathlib.Path(
    os.environ.get('XDG_CACHE_HOME', pathlib.Path.home() / '.cache')
  )
  return cache / 'spec_decode' / 'kernels'


def library_path(march: str | None = None) -> pathlib.Path:
  """Where the library for `march` (default: the configured one) lives."""
  march = march or _march()
  name = _LIB_NAME if march == 'native' else f'_smallm-{march}.so'
  return _build_dir() / name


def _stamp(march: str) -> str:
  import jax  # pylint: disable=g-import-not-at-top

  cxx = _compiler()
  try:
    version = subprocess.run(
      [cxx, '--version'], capture_output=True, text=True, check=False
    ).stdout
  except OSError:
    version = 'missing'
  h = hashlib.sha256()
  for part in (
    SOURCE.read_bytes(),
    ' '.join(_flags(march, '')).encode(),
    cxx.encode(),
    version.encode(),
    jax.__version__.encode(),
    (_cpu_flags() if march == 'native' else '').encode(),
  ):
    h.update(part)
    h.update(b'\0')
  return h.hexdigest()


@contextlib.contextmanager
def _locked(path: pathlib.Path):
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, 'a+') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def is_stale(march: str | None = None) -> bool:
  march = march or _march()
  lib = library_path(march)
  stamp = lib.with_suffix('.stamp')
  if not lib.exists() or not stamp.exists():
    return True
  return stamp.read_text().strip() != _stamp(march)


def build(
  march: str | None = None, force: bool = False, verbose: bool = False
) -> pathlib.Path:
  """Compiles the library if missing or stale; returns its path.

  Raises:
    BuildError: no compiler, or the compile failed (message has its output).
  """
  import jax  # pylint: disable=g-import-not-at-top

  march = march or _march()
  lib = library_path(march)
  with _locked(lib.with_suffix('.lock')):
    # Checked again under the lock: another process may have just built it.
    if not force and not is_stale(march):
      return lib
    cxx = _compiler()
    if shutil.which(cxx) is None:
      raise BuildError(
        f'no C++ compiler {cxx!r} on PATH (set '
        'SPEC_DECODE_KERNEL_CXX or install g++)'
      )
    fd, tmp = tempfile.mkstemp(suffix='.so', dir=lib.parent)
    os.close(fd)
    cmd = [
      cxx,
      *_flags(march, jax.ffi.include_dir()),
      str(SOURCE),
      '-o',
      tmp,
      '-lpthread',
    ]
    if verbose:
      print(' '.join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
      os.unlink(tmp)
      raise BuildError(
        f'compiling {SOURCE.name} failed:\n{" ".join(cmd)}\n'
        f'{proc.stderr[-4000:]}'
      )
    # Rename, not overwrite in place: a process that has the old library
    # mapped keeps a valid file.
    os.replace(tmp, lib)
    lib.with_suffix('.stamp').write_text(_stamp(march) + '\n')
  return lib


def main(argv: list[str] | None = None) -> int:
  """`spec-decode build-kernel` (`make install` runs it)."""
  parser = argparse.ArgumentParser(
    prog='spec-decode build-kernel', description=__doc__.splitlines()[0]
  )
  parser.add_argument('--force', action='store_true', help='rebuild always')
  parser.add_argument(
    '--march',
    default=None,
    help='-march value (default: $SPEC_DECODE_KERNEL_MARCH or native)',
  )
  args = parser.parse_args(argv)
  try:
    lib = build(args.march, force=args.force, verbose=True)
  except BuildError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  import ctypes  # pylint: disable=g-import-not-at-top

  handle = ctypes.CDLL(str(lib))
  handle.smallm_isa.restype = ctypes.c_char_p
  print(f'{lib} (isa: {handle.smallm_isa().decode()})')
  return 0

"""T5Configs from the gin model files in `gin/models/`.

The files mirror T5X's `t5x/examples/t5/t5_1_{0,1}/*.gin`: a `base.gin` per
family binds every field of `spec_decode.t5.config.T5Config` (through gin's
dynamic registration: the library itself has no gin decorators), and each
size (`small.gin`, ..., `xxl.gin`, `11B.gin`, `tiny.gin`) includes it and
overrides the size fields.

    cfg = config_from_gin('models/t5_1_1/xxl.gin')
    cfg = config_from_gin('models/t5_1_1/tiny.gin', vocab_size=128)

Parsing happens in isolation: gin's global configuration (what a run's own
`--gin_file`s bound) is saved before and restored after.
"""

import contextlib
import os
import sys

import gin
from spec_decode.t5.config import T5Config


def _gin_dir() -> str:
  """The repo's `gin/` (source checkout), else the installed copy."""
  repo = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'gin'
  )
  if os.path.isdir(repo):
    return repo
  return os.path.join(sys.prefix, 'share', 'spec_decode', 'gin')


GIN_DIR = _gin_dir()

MODEL_FILES = {
  't5_1_1_small': 'models/t5_1_1/small.gin',
  't5_1_1_base': 'models/t5_1_1/base.gin',
  't5_1_1_large': 'models/t5_1_1/large.gin',
  't5_1_1_xl': 'models/t5_1_1/xl.gin',
  't5_1_1_xxl': 'models/t5_1_1/xxl.gin',
  't5_1_1_tiny': 'models/t5_1_1/tiny.gin',
  't5_small': 'models/t5_1_0/small.gin',
  't5_base': 'models/t5_1_0/base.gin',
  't5_large': 'models/t5_1_0/large.gin',
  't5_3B': 'models/t5_1_0/3B.gin',
  't5_11B': 'models/t5_1_0/11B.gin',
  't5_tiny': 'models/t5_1_0/tiny.gin',
}


def add_search_path() -> None:
  """Lets gin `include 'models/...'` resolve against the repo's `gin/`."""
  prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
  if GIN_DIR not in prefixes:
    gin.add_config_file_search_path(GIN_DIR)


def resolve(gin_file: str) -> str:
  """A path as given, else relative to `gin/`, else a `MODEL_FILES` name."""
  gin_file = os.fspath(gin_file)
  candidates = [gin_file, os.path.join(GIN_DIR, gin_file)]
  if gin_file in MODEL_FILES:
    candidates.append(os.path.join(GIN_DIR, MODEL_FILES[gin_file]))
  for c in candidates:
    if os.path.isfile(c):
      return c
  raise FileNotFoundError(
    f'gin model file not found: {gin_file} (also looked in {GIN_DIR}; '
    f'names: {sorted(MODEL_FILES)})'
  )


@contextlib.contextmanager
def _isolated_gin():
  """Runs the body on an empty gin config and restores the previous one."""
  cfg = gin.config
  # pylint: disable=protected-access
  saved = (
    {k: dict(v) for k, v in cfg._CONFIG.items()},
    set(cfg._IMPORTS),
    dict(cfg._OPERATIVE_CONFIG),
    dict(cfg._SINGLETONS),
    gin.config_is_locked(),
    list(cfg._LOCATION_PREFIXES),
  )
  gin.clear_config()
  # Our directory first: gin logs an error for every prefix that misses.
  cfg._LOCATION_PREFIXES.insert(0, GIN_DIR)
  try:
    yield
  finally:
    cfg._LOCATION_PREFIXES[:] = saved[5]
    gin.clear_config()
    cfg._CONFIG.update(saved[0])
    cfg._IMPORTS.update(saved[1])
    cfg._OPERATIVE_CONFIG.update(saved[2])
    cfg._SINGLETONS.update(saved[3])
    cfg._set_config_is_locked(saved[4])
  # pylint: enable=protected-access


def config_from_gin(
  gin_file: str, bindings: tuple[str, ...] = (), **overrides
) -> T5Config:
  """The `T5Config` a gin model file binds.

  Args:
    gin_file: a path, a path relative to `gin/` (`models/t5_1_1/base.gin`)
      or a `MODEL_FILES` name (`t5_1_1_xxl`).
    bindings: extra gin bindings, e.g. `("ACTIVATION_DTYPE = 'bfloat16'",)`.
    **overrides: `T5Config` fields replaced after parsing.

  Returns:
    The config.
  """
  path = resolve(gin_file)
  with _isolated_gin():
    gin.parse_config_files_and_bindings(
      [path], list(bindings), finalize_config=False
    )
    config = gin.get_configurable(T5Config)()
  return config.replace(**overrides) if overrides else config

"""Measured seconds cached by what they depend on: in memory and on disk.

A cost the policies read (seconds per loop iteration at each gamma, or per
kind of beam-search call) depends on the models' shapes, the batch size,
the settings and the device, not on weights or inputs; it is cached under
a key of those (`describe`, `cache_key`): in memory and as a JSON file per
key in `cache_dir()` (`$SPEC_DECODE_CACHE_DIR`, default
`~/.cache/spec_decode/costs`), so a second process does not measure again.
This is the engine's one file (a cache of measurements).
"""

import hashlib
import json
import math
import os
import platform
from typing import Any

import jax
import numpy as np

# Part of the cache key: a changed measurement is not read from old files.
MEASURE_VERSION = 2
_memory: dict[str, list[float]] = {}


def cache_dir() -> str:
  return os.environ.get('SPEC_DECODE_CACHE_DIR') or os.path.join(
    os.path.expanduser('~'), '.cache', 'spec_decode', 'costs'
  )


def _shapes(tree: Any) -> list:
  leaves, treedef = jax.tree.flatten(tree)
  return [
    type(tree).__name__,
    treedef.num_leaves,
    [[list(np.shape(x)), _dtype_name(x)] for x in leaves],
  ]


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(x: Any) -> str:
  # str(dtype) is slow in numpy (most of a batch-1 decode's describe).
  dtype = getattr(x, 'dtype', None)
  if dtype is None:
    return type(x).__name__
  name = _DTYPE_NAMES.get(dtype)
  if name is None:
    name = _DTYPE_NAMES[dtype] = str(dtype)
  return name


def describe(
  target: Any, draft: Any, settings: Any, batch: int
) -> dict[str, Any]:
  """What the measured costs depend on (the cache key's contents)."""
  devices = jax.devices()
  return {
    'target': _shapes(target),
    'draft': _shapes(draft),
    'batch': int(batch),
    'settings': repr(settings),
    'device': [
      devices[0].platform,
      devices[0].device_kind,
      len(devices),
      platform.node(),
      platform.machine(),
    ],
    'environment': sorted(
      (k, v)
      for k, v in os.environ.items()
      if k.startswith('SPEC_DECODE_') and k != 'SPEC_DECODE_CACHE_DIR'
    ),
    'jax': jax.__version__,
    'measure': MEASURE_VERSION,
  }


def cache_key(description: dict[str, Any]) -> str:
  text = json.dumps(description, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached_seconds(
  description: dict[str, Any], measure_fn, use_disk: bool = True
) -> tuple[list[float], dict[str, Any]]:
  """`measure_fn()`'s list of seconds, cached under `description`.

  In memory, and (with `use_disk`) as `cache_dir()/<key>.json` holding the
  description too: an entry whose description differs, or that cannot be
  read, is measured again and rewritten (atomically).

  Returns:
    the seconds (`inf` kept), and `{'key', 'path', 'measured'}`.
  """
  desc = description
  key = cache_key(desc)
  path = os.path.join(cache_dir(), key + '.json') if use_disk else None
  info = {'key': key, 'path': path, 'measured': False}
  if key in _memory:
    return list(_memory[key]), info
  if path is not None and os.path.exists(path):
    try:
      with open(path) as f:
        stored = json.load(f)
      if stored.get('description') == json.loads(json.dumps(desc)):
        _memory[key] = [
          math.inf if s is None else float(s) for s in stored['seconds']
        ]
        return list(_memory[key]), info
    except (OSError, ValueError, KeyError):
      pass  # An unreadable entry is measured again and rewritten.
  seconds = [float(x) for x in measure_fn()]
  _memory[key] = seconds
  info['measured'] = True
  if path is not None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'w') as f:
      finite = [s if math.isfinite(s) else None for s in seconds]
      json.dump({'description': desc, 'seconds': finite}, f, indent=1)
    os.replace(tmp, path)
  return list(seconds), info

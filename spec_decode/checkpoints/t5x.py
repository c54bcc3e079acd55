"""T5X checkpoints: the on-disk layout `t5x/checkpoints.py` writes.

A T5X checkpoint directory (`.../checkpoint_<step>/`) holds:
  * `checkpoint`: a msgpack file (flax serialization) of
    `{'version': 3, 'optimizer': {'target': <param tree>, 'state': {...}}}`.
    Each parameter leaf is either the array itself (small, unpartitioned
    leaves) or the JSON of a TensorStore spec, e.g.
    `{'driver': 'zarr', 'dtype': 'float32', 'kvstore': {'driver': 'file',
    'path': 'target.encoder.layers_0.attention.query.kernel'},
    'metadata': {'shape': [...], 'chunks': [...], 'compressor': {'id':
    'gzip'}}}`, with a path relative to the checkpoint directory (older
    TensorStore versions put `path` beside `kvstore`; checkpoints written to
    GCS name a `gcs` kvstore whose path is also relative).
  * one zarr array directory per partitioned parameter, named after its path
    in the state dict with `/` replaced by `.` (`target.token_embedder.
    embedding`).
The parameter tree under `target` is exactly ours for T5X's `examples/t5`
network; `scalable_t5`'s (3-D attention kernels, scanned layers) is read
into ours by `t5x_layout.py`. T5X stores no hyperparameters with the
weights: they come from a gin model file or a `T5Config`.

`save` writes the same layout from a `Model` (tests use it; it also lets a
model trained here go back to T5X).
"""

import os
from typing import Any

import flax.serialization
import flax.traverse_util
import numpy as np
import tensorstore as ts

from spec_decode.checkpoints.assemble import CheckpointError
from spec_decode.checkpoints.assemble import Shape
from spec_decode.checkpoints.assemble import to_dtype

CHECKPOINT_FILE = 'checkpoint'
VERSION = 3
_CHUNK_BYTES = 64 * 1024 * 1024  # T5X's _DESIRED_CHUNK_SIZE_BYTES.


def is_t5x_dir(path: str) -> bool:
  return os.path.isfile(os.path.join(path, CHECKPOINT_FILE))


def latest_checkpoint_dir(model_dir: str) -> str | None:
  """The `checkpoint_<step>` subdirectory with the largest step, if any."""
  steps = []
  for name in os.listdir(model_dir):
    head, _, step = name.partition('_')
    if (
      head == 'checkpoint'
      and step.isdigit()
      and is_t5x_dir(os.path.join(model_dir, name))
    ):
      steps.append(int(step))
  return os.path.join(model_dir, f'checkpoint_{max(steps)}') if steps else None


def _is_spec(leaf: Any) -> bool:
  return isinstance(leaf, dict) and 'driver' in leaf


class T5XSource:
  """The `target` parameters of a T5X checkpoint as a `TensorSource`."""

  def __init__(self, ckpt_dir: str):
    self._dir = os.path.abspath(ckpt_dir)
    file = os.path.join(self._dir, CHECKPOINT_FILE)
    self.description = file
    try:
      with open(file, 'rb') as f:
        contents = flax.serialization.msgpack_restore(f.read())
    except FileNotFoundError:
      raise FileNotFoundError(
        f'T5X checkpoint file not found: {file}'
      ) from None
    except Exception as e:  # msgpack raises several types.
      raise CheckpointError(
        f'{file}: not a T5X msgpack checkpoint ({e})'
      ) from e
    if not isinstance(contents, dict):
      raise CheckpointError(f'{file}: not a T5X checkpoint (no state dict)')
    if 'optimizer' in contents:
      version = contents.get('version', 0)
      if version < 2:
        raise CheckpointError(
          f'{file}: T5X checkpoint version {version} is '
          'older than 2 and not supported'
        )
      contents = contents['optimizer']
    if not isinstance(contents, dict) or 'target' not in contents:
      raise CheckpointError(f'{file}: no `target` parameters in the checkpoint')
    self._leaves = flax.traverse_util.flatten_dict(
      contents['target'], sep='/', is_leaf=lambda _, v: _is_spec(v)
    )

  def _spec(self, name: str) -> dict[str, Any]:
    spec = dict(self._leaves[name])
    kvstore = dict(spec.get('kvstore', {}))
    if 'path' in kvstore:
      rel = kvstore['path']
    elif 'path' in spec:  # tensorstore < 0.1.14
      rel = spec.pop('path')
    else:
      raise CheckpointError(
        f'{self.description}: {name} has a TensorStore '
        f'spec without a path: {spec}'
      )
    spec['kvstore'] = {'driver': 'file', 'path': os.path.join(self._dir, rel)}
    return spec

  def shapes(self) -> dict[str, Shape]:
    out = {}
    for name, leaf in self._leaves.items():
      if _is_spec(leaf):
        shape = leaf.get('metadata', {}).get('shape')
        if shape is None:
          shape = self._open(name).shape
        out[name] = tuple(int(d) for d in shape)
      else:
        out[name] = tuple(np.shape(leaf))
    return out

  def _open(self, name: str):
    spec = self._spec(name)
    try:
      return ts.open(spec, open=True, read=True).result()
    except Exception as e:
      raise CheckpointError(
        f'{self.description}: cannot open {name} at '
        f'{spec["kvstore"]["path"]}: {e}'
      ) from e

  def read(self, name: str, dtype: np.dtype) -> np.ndarray:
    leaf = self._leaves[name]
    if not _is_spec(leaf):
      return np.ascontiguousarray(to_dtype(np.asarray(leaf), dtype))
    store = self._open(name)
    if store.dtype.numpy_dtype != dtype:
      store = ts.cast(store, dtype)  # Converted chunk by chunk on read.
    try:
      return store.read().result()
    except Exception as e:
      raise CheckpointError(
        f'{self.description}: cannot read {name}: {e}'
      ) from e

  def read_slice(
    self, name: str, axis: int, index: int, dtype: np.dtype
  ) -> np.ndarray:
    """Entry `index` along `axis` of a stacked (scanned) parameter; from
    a TensorStore array only the chunks that hold it are read."""
    leaf = self._leaves[name]
    where = (slice(None),) * axis + (index,)
    if not _is_spec(leaf):
      return to_dtype(np.asarray(leaf)[where], dtype)
    store = self._open(name)[where]
    if store.dtype.numpy_dtype != dtype:
      store = ts.cast(store, dtype)
    try:
      return store.read().result()
    except Exception as e:
      raise CheckpointError(
        f'{self.description}: cannot read {name}[layer {index}]: {e}'
      ) from e


def _chunk_shape(shape: Shape, itemsize: int) -> list[int]:
  """Halves the largest dimension until a chunk is at most 64 MiB."""
  chunks = list(shape) or [1]
  while int(np.prod(chunks)) * itemsize > _CHUNK_BYTES:
    i = int(np.argmax(chunks))
    chunks[i] = (chunks[i] + 1) // 2
  return chunks


def save(model, ckpt_dir: str, step: int = 0) -> None:
  """Writes `model.params` in T5X's layout (float32 zarr, gzip chunks).

  Args:
    model: a `Model`.
    ckpt_dir: the `checkpoint_<step>` directory to create.
    step: stored as `state/step`.
  """
  ckpt_dir = os.path.abspath(ckpt_dir)
  if os.path.exists(os.path.join(ckpt_dir, CHECKPOINT_FILE)):
    raise FileExistsError(f'{ckpt_dir} already holds a T5X checkpoint')
  os.makedirs(ckpt_dir, exist_ok=True)
  flat = flax.traverse_util.flatten_dict(model.params, sep='/')
  written = {}
  for name, value in flat.items():
    arr = np.asarray(value, np.float32)
    rel = 'target.' + name.replace('/', '.')
    spec = {
      'driver': 'zarr',
      'dtype': 'float32',
      'kvstore': {'driver': 'file', 'path': rel},
      'metadata': {
        'compressor': {'id': 'gzip'},
        'shape': list(arr.shape),
        'chunks': _chunk_shape(arr.shape, arr.itemsize),
      },
    }
    absolute = dict(
      spec, kvstore={'driver': 'file', 'path': os.path.join(ckpt_dir, rel)}
    )
    store = ts.open(absolute, create=True, open=True).result()
    store.write(arr).result()
    written[name] = spec
  state = {
    'version': VERSION,
    'optimizer': {
      'target': flax.traverse_util.unflatten_dict(written, sep='/'),
      'state': {'step': np.asarray(step, np.int32), 'param_states': {}},
    },
  }
  with open(os.path.join(ckpt_dir, CHECKPOINT_FILE), 'wb') as f:
    f.write(flax.serialization.msgpack_serialize(state))

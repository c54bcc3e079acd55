"""Where a decode runs: the mesh interface the engine needs, and host arrays.

The engine never builds a mesh. A sharded model carries a `partitioner`
(`spec_decode.parallel.partitioning.Partitioner` implements `Placement`);
`generate` asks it to place the models and the batch, and gathers results with
`to_host`. A global array spanning several processes (multi-host runs) is
read through `local_data` and gathered once per batch.
"""

from typing import Any
from typing import Protocol

import jax
import numpy as np
from jax.experimental import multihost_utils


class Placement(Protocol):
  """What `generate` asks of a model's partitioner."""

  @property
  def data_size(self) -> int:
    """Devices on the batch (`data`) axis."""
    ...

  def place(self, lm: Any) -> Any:
    """The language model or drafter `lm`, put on this mesh."""
    ...

  def padded_batch(self, batch: int) -> int:
    """The smallest batch >= `batch` that splits over `data`."""
    ...

  def shard_batch(self, x: Any) -> jax.Array:
    """A host array (same value on every process), batch on `data`."""
    ...

  def batch_sharding(self, ndim: int) -> jax.sharding.Sharding:
    """Dimension 0 on `data`, the rest replicated."""
    ...


def placement_of(*lms: Any) -> Placement | None:
  """The partitioner of the first model that carries one (or None)."""
  for lm in lms:
    p = getattr(lm, 'partitioner', None)
    if p is not None:
      return p
  return None


def is_global(x: Any) -> bool:
  """Whether `x` is a `jax.Array` with shards on other hosts."""
  return isinstance(x, jax.Array) and not x.is_fully_addressable


def local_data(x: Any) -> np.ndarray:
  """The rows of `x` this host holds (all of `x` unless it spans hosts).

  For a global array: the addressable shards' rows, deduplicated by batch
  offset and concatenated in order (used for input validation).
  """
  if not is_global(x):
    return np.asarray(x)
  blocks = {}
  for shard in x.addressable_shards:
    start = (shard.index[0].start or 0) if shard.index else 0
    blocks.setdefault(start, np.asarray(shard.data))
  return np.concatenate([blocks[k] for k in sorted(blocks)], axis=0)


def to_host(tree: Any) -> Any:
  """Every leaf as a numpy array of its global value, on every host.

  One `process_allgather` for the leaves that span hosts (call it once per
  batch, on the final outputs); other leaves are simply copied to the host.
  """
  leaves, treedef = jax.tree.flatten(tree)
  spread = [i for i, x in enumerate(leaves) if is_global(x)]
  out = [None if i in spread else np.asarray(x) for i, x in enumerate(leaves)]
  if spread:
    gathered = multihost_utils.process_allgather(
      [leaves[i] for i in spread], tiled=True
    )
    for i, value in zip(spread, gathered, strict=True):
      out[i] = np.asarray(value)
  return jax.tree.unflatten(treedef, out)


def sharded_inputs(placement: Placement, tokens: Any, keys: jax.Array):
  """Encoder tokens and row keys with the batch on `data`.

  Pads the batch to a multiple of the `data` size with copies of the last
  row (and its seed); rows are independent, so the real rows' results do
  not change. A batch spanning hosts must already be a multiple.
  """
  batch = tokens.shape[0]
  padded = placement.padded_batch(batch)
  if padded != batch:
    if is_global(tokens):
      raise ValueError(
        f'a batch of {batch} rows spanning hosts must be a '
        f'multiple of the data axis ({placement.data_size})'
      )
    extra = padded - batch
    tokens = np.concatenate([tokens, np.repeat(tokens[-1:], extra, 0)])
    keys = jax.numpy.concatenate([keys, jax.numpy.repeat(keys[-1:], extra, 0)])
  key_data = placement.shard_batch(np.asarray(jax.random.key_data(keys)))
  keys = jax.random.wrap_key_data(key_data, impl=jax.random.key_impl(keys))
  if is_global(tokens):
    enc = jax.device_put(tokens, placement.batch_sharding(2))
  else:
    enc = placement.shard_batch(tokens)
  return enc, keys

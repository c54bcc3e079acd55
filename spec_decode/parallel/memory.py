"""Bytes per device of a decode: parameters and decode state, as placed.

What docs/capacity_plan.md computes on paper, read from the arrays
themselves: `param_bytes_per_device` sums, over a model's parameters, the
bytes of one shard (a parameter's sharding says its shard shape; an array
without a mesh is whole on every device it is used on); `cache_bytes_per_
device` builds the decode state's shapes (`jax.eval_shape` of `init_state`:
nothing is allocated) and shards them as the model's partitioner constrains
its state (KV caches `[B, H, Dh, L]` with the batch on `data` and heads on
`model`). `decode_bytes` reports both for a target and a draft as
`sd.generate` places them; eval reports and `spec-decode bench memory` print
it.

The largest device is reported (a dimension that does not split evenly is
replicated, so shards are equal or whole).
"""

from typing import Any

import jax
import numpy as np

from spec_decode.core import placement as placement_lib


def _nbytes(shape, dtype) -> int:
  return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def param_bytes_per_device(lm: Any) -> int:
  """Bytes of `lm`'s parameters (all leaves of another pytree) per device."""
  tree = getattr(lm, 'params', lm)
  total = 0
  for x in jax.tree.leaves(tree):
    if not hasattr(x, 'shape') or not hasattr(x, 'dtype'):
      continue
    sharding = getattr(x, 'sharding', None)
    shape = x.shape
    if sharding is not None and hasattr(sharding, 'shard_shape'):
      shape = sharding.shard_shape(x.shape)
    total += _nbytes(shape, x.dtype)
  return total


def cache_bytes_per_device(
  lm: Any, batch: int, input_len: int, buffer_len: int
) -> int:
  """Bytes of `lm`'s decode state per device (0 for a stateless drafter).

  Args:
    lm: a language model with `init_state` (a `Model`: cross-attention keys
      and values of the inputs and the self-attention KV cache).
    batch: rows (after padding to the `data` axis).
    input_len: encoder tokens per row (S).
    buffer_len: decoder slots (`DecodeSettings.buffer_len`).
  """
  if not hasattr(lm, 'init_state'):
    return 0
  enc = jax.ShapeDtypeStruct((batch, input_len), np.int32)
  state = jax.eval_shape(lambda e: lm.init_state(e, buffer_len), enc)
  partitioner = getattr(lm, 'partitioner', None)
  total = 0
  for x in jax.tree.leaves(state):
    shape = x.shape
    if partitioner is not None:
      shape = partitioner.state_sharding(shape).shard_shape(shape)
    total += _nbytes(shape, x.dtype)
  return total


def decode_bytes(
  target: Any,
  draft: Any,
  batch: int,
  input_len: int,
  max_decode_len: int,
  width: int,
) -> dict[str, int]:
  """Parameter and cache bytes per device of a speculative decode whose
  iterations draft at most `width` tokens (`DecodeSettings.width`: the
  largest gamma of a sweep, `max_auto_gamma` under gamma='auto').

  The draft is placed as `sd.generate` places it (an unsharded draft next
  to a sharded target is replicated: whole on every device, its state
  split by rows only), and the batch is padded to the `data` axis.

  Returns:
    `{'target_params', 'target_cache', 'draft_params', 'draft_cache',
    'total'}` in bytes per device.
  """
  mesh = placement_lib.placement_of(target, draft)
  if mesh is not None:
    batch = mesh.padded_batch(batch)
    if draft is not None and getattr(draft, 'partitioner', None) is None:
      if hasattr(draft, 'config') and hasattr(draft, 'params'):
        draft = type(draft)(
          draft.config,
          draft.params,
          getattr(draft, 'vocabulary', None),
          partitioner=mesh.replicated(),
        )
  # `DecodeSettings.buffer_len` (the model tower reads no decode settings).
  buffer_len = max_decode_len + width + 2
  out = {
    'target_params': param_bytes_per_device(target),
    'target_cache': cache_bytes_per_device(
      target, batch, input_len, buffer_len
    ),
    'draft_params': param_bytes_per_device(draft) if draft is not None else 0,
    'draft_cache': (
      cache_bytes_per_device(draft, batch, input_len, buffer_len)
      if draft is not None
      else 0
    ),
  }
  out['total'] = sum(out.values())
  return out

"""What the checkpoint readers share: expected shapes, assembly, errors.

Every reader (Hugging Face, T5X) exposes its file as a `TensorSource`: the
parameter names and shapes it holds, already in our tree's names and layout
(`'encoder/layers_0/attention/query/kernel'`, 2-D `[in, out]` kernels), and a
`read(name, dtype)` that returns one tensor. `assemble_params` checks the
names and shapes against the config before reading anything, then reads one
tensor at a time, cast straight to the requested dtype and moved to the
device, so the host never holds two full copies of a model.
"""

import functools
from typing import Any
from typing import Callable
from typing import Iterator
from typing import Protocol

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.t5 import network
from spec_decode.t5.config import T5Config

Shape = tuple[int, ...]


class CheckpointError(ValueError):
  """A checkpoint is malformed or disagrees with its config."""


class TensorSource(Protocol):
  """Read access to the tensors of one checkpoint, in our names and layout."""

  @property
  def description(self) -> str:
    """The file or directory, for error messages."""
    ...

  def shapes(self) -> dict[str, Shape]:
    """Parameter name (`'a/b/kernel'`) -> shape, without reading data."""
    ...

  def read(self, name: str, dtype: np.dtype) -> np.ndarray:
    """One parameter in our layout, converted to `dtype`."""
    ...


@functools.lru_cache(maxsize=16)
def _expected_shapes_cached(config: T5Config) -> tuple[tuple[str, Shape], ...]:
  module = network.Transformer(config)
  tokens = jnp.ones((1, 1), jnp.int32)
  shapes = jax.eval_shape(module.init, jax.random.key(0), tokens, tokens)
  flat = flax.traverse_util.flatten_dict(
    flax.core.meta.unbox(shapes['params']), sep='/'
  )
  return tuple(sorted((k, tuple(v.shape)) for k, v in flat.items()))


def expected_shapes(config: T5Config) -> dict[str, Shape]:
  """Parameter name (`'a/b/kernel'`) -> shape for `config`'s network."""
  return dict(_expected_shapes_cached(config))


def check_shapes(
  config: Any,
  found: dict[str, Shape],
  description: str,
  want: dict[str, Shape] | None = None,
) -> None:
  """Raises CheckpointError unless `found` matches `config` exactly (`want`:
  the expected shapes, when `config` is not a `T5Config`)."""
  want = expected_shapes(config) if want is None else want
  missing = sorted(set(want) - set(found))
  extra = sorted(set(found) - set(want))
  bad = sorted(k for k in set(want) & set(found) if want[k] != found[k])
  problems = []
  if missing:
    problems.append(f'missing parameters {_short(missing)}')
  if extra:
    problems.append(f'parameters the config does not have {_short(extra)}')
  if bad:
    problems.append(
      'shape mismatches '
      + _short([f'{k}: checkpoint {found[k]} vs config {want[k]}' for k in bad])
    )
  if problems:
    raise CheckpointError(
      f'{description}: weights disagree with the config ('
      f'{_config_summary(config)}): ' + '; '.join(problems)
    )


def _short(items: list[str], limit: int = 6) -> str:
  more = f' and {len(items) - limit} more' if len(items) > limit else ''
  return '[' + ', '.join(items[:limit]) + more + ']'


def _config_summary(config: Any) -> str:
  if not isinstance(config, T5Config):  # T5Gemma (version 1 or 2).
    enc, dec = config.encoder, config.decoder
    return (
      f'T5Gemma version {config.version}, vocab {config.vocab_size}, emb '
      f'{enc.emb_dim}/{dec.emb_dim}, layers {enc.num_layers}+'
      f'{dec.num_layers}, tied head {config.tie_head}'
    )
  return (
    f'vocab {config.vocab_size}, emb {config.emb_dim}, heads '
    f'{config.num_heads}x{config.head_dim}, mlp {config.mlp_dim} '
    f'{"/".join(config.mlp_activations)}, layers '
    f'{config.num_encoder_layers}+{config.num_decoder_layers}, '
    f'tied logits {config.logits_via_embedding}'
  )


def assemble_params(
  config: T5Config,
  source: TensorSource,
  progress: Callable[[Iterator], Iterator] | None = None,
  shardings: dict[str, Any] | None = None,
) -> Any:
  """Reads `source` into a parameter tree of `config.param_dtype` arrays.

  Args:
    config: the network the weights are for; `param_dtype` is the dtype of
      the result.
    source: the checkpoint's tensors.
    progress: optional wrapper of the name iterator (e.g. `tqdm`).
    shardings: optional name (`'a/b/kernel'`) -> `jax.sharding.Sharding`;
      each tensor is put straight into its shards as it is read
      (`Partitioner.param_shardings_flat`).

  Returns:
    The nested parameter dict, on the default device or in its shards.

  Raises:
    CheckpointError: names or shapes disagree with `config`.
  """
  check_shapes(config, source.shapes(), source.description)
  dtype = np.dtype(config.param_dtype)
  want = expected_shapes(config)
  names = sorted(want)
  flat = {}
  for name in progress(names) if progress else names:
    arr = source.read(name, dtype)
    if arr.shape != want[name] or arr.dtype != dtype:
      raise CheckpointError(
        f'{source.description}: {name} read as {arr.dtype}{arr.shape}, '
        f'expected {dtype}{want[name]}'
      )
    flat[name] = jax.device_put(arr, shardings[name] if shardings else None)
    del arr
  return flax.traverse_util.unflatten_dict(flat, sep='/')


def to_dtype(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
  """Casts without a copy when the dtype already matches."""
  return arr.astype(dtype, copy=False)

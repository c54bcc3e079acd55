"""Random weights that compile in seconds, for the accelerator bench.

`sd.Model.init` draws every weight inside one compiled program of T5X's
initializers; on the first H100 run that program took about 48 s to
compile for T5 v1.1 small (16 layers; XLA compiles each of its 190 random
draws), which scaled to XXL would have spent a third of the budget before
the first measurement. Here the shapes come from tracing that same init
(`jax.eval_shape`: nothing compiles) and each weight is drawn by one small
program per distinct shape (T5 v1.1 has eight), with the same scales as
T5X's initializers: ones for the norms, N(0, 1) for the embedding, and
N(0, 1 / fan_in) for kernels (the query's also over head_dim). The values
differ from `Model.init`'s, which no measurement depends on. A T5Gemma
config gets a `T5GemmaModel` the same way, with its own init's scales:
zeros for the RMSNorm weights (scale 1 + w) and the end-of-image row,
N(0, 1) for the embedding, N(0, 0.02^2) for kernels.
"""

import functools

import jax
import jax.numpy as jnp

import spec_decode as sd
from spec_decode.t5gemma.config import T5GemmaConfig


@functools.partial(jax.jit, static_argnames=('shape', 'dtype'))
def _normal(key, scale, shape, dtype):
  return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)


def _scale(path: str, shape: tuple, head_dim: int) -> float | None:
  """The standard deviation of a weight (None: ones)."""
  if len(shape) == 1:
    return None  # Norm scales.
  if 'token_embedder' in path:
    return 1.0
  scale = shape[0] ** -0.5
  if "'query'" in path:
    scale *= head_dim**-0.5
  return scale


def _t5gemma_scale(path: str, shape: tuple) -> float:
  """The standard deviation of a T5Gemma weight (0: zeros)."""
  if len(shape) == 1:
    return 0.0  # RMSNorm's w (scale 1 + w), the end-of-image row.
  return 1.0 if 'embedding' in path else 0.02


def model_class(config) -> type:
  """`sd.T5GemmaModel` for a `T5GemmaConfig`, else `sd.Model`."""
  return sd.T5GemmaModel if isinstance(config, T5GemmaConfig) else sd.Model


def random_model(config, seed: int = 0):
  """A model of `config` (`model_class`) with random weights (see the
  module doc)."""
  cls = model_class(config)
  shapes = jax.eval_shape(lambda: cls.init(config, seed=seed).params)
  key = jax.random.key(seed)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  out = []
  for i, (path, leaf) in enumerate(leaves):
    name = jax.tree_util.keystr(path)
    if cls is sd.T5GemmaModel:
      scale = _t5gemma_scale(name, leaf.shape)
    else:
      scale = _scale(name, leaf.shape, config.head_dim)
    if scale is None:
      out.append(jnp.ones(leaf.shape, leaf.dtype))
    elif scale == 0.0:
      out.append(jnp.zeros(leaf.shape, leaf.dtype))
    else:
      out.append(
        _normal(jax.random.fold_in(key, i), scale, leaf.shape, leaf.dtype)
      )
  return cls(config, jax.tree.unflatten(treedef, out))

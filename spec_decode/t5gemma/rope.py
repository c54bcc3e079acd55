"""Rotary position embeddings (the half-split layout Gemma and transformers
use: dimension i pairs with i + Dh/2)."""

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.t5gemma.config import Rope


def inverse_frequencies(rope: Rope, head_dim: int) -> np.ndarray:
  """`[Dh / 2] float32`: `1 / theta ** (2i / Dh)`, divided by the linear
  scaling factor. Computed in float32, as transformers computes them, so
  that angles (and near-tie argmaxes) follow its float32 run."""
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
  inv = np.float32(1.0) / (np.float32(rope.theta) ** exponents)
  return (inv / np.float32(rope.factor)).astype(np.float32)


def tables(rope: Rope, head_dim: int, positions: jax.Array):
  """`cos, sin [B, T, 1, Dh]` float32 for integer `positions [B, T]`."""
  inv = jnp.asarray(inverse_frequencies(rope, head_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  return jnp.cos(angles), jnp.sin(angles)


def apply(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates `x [B, T, N, Dh]` by the angles of `tables`."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return (x * cos + rotated * sin).astype(x.dtype)

"""Float32 products that keep PyTorch's precision on XLA:CPU.

XLA:CPU's dot (Eigen) adds up to 512 products of the inner dimension in
order; PyTorch's CPU matmul adds shorter runs. Measured on float32 products
with K >= 512 against float64, XLA's error is 1.6x PyTorch's, and a T5 run
through XLA ends 1.3x as far from a float64 run as transformers' own float32
run (issue 28, item 5). Summing the inner dimension in blocks (one dot per
block, the blocks' results added in order) brings the product below
PyTorch's error and the whole model to transformers' level.

Only float32 products on the CPU backend are split: accelerators have their
own summation (and their own precision settings), and bfloat16 products
gain nothing from a float32 sum of rounded blocks. The small-K decoding
kernel sums in the same blocks (`kernels/smallm.cc`, `kSumBlock`).
"""

import functools

import jax
import jax.numpy as jnp


def dot(x: jax.Array, w: jax.Array, block: int) -> jax.Array:
  """`x [..., K] @ w [K, N]`, summing K in blocks of `block` on the CPU.

  Args:
    x: the left operand, `[..., K]`.
    w: the right operand, `[K, N]`, same dtype as `x`.
    block: inner-dimension terms summed in order per block; 0 keeps XLA's
      own dot. Products with K <= block, or not float32, or on another
      backend than the CPU are one `jnp.dot`.

  Returns:
    `[..., N]` in `x`'s dtype.
  """
  k = x.shape[-1]
  if (
    not block
    or k <= block
    or x.dtype != jnp.float32
    or jax.default_backend() != 'cpu'
  ):
    return jnp.dot(x, w)
  return _blocked_dot(x, w, block)


# Gradients are XLA's plain dots: autodiff through the blocks would pad every
# block's gradient back to K and add them (twice the time of a training step,
# measured), and training gains nothing from the forward's precision.
@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _blocked_dot(x: jax.Array, w: jax.Array, block: int) -> jax.Array:
  out = None
  for start in range(0, x.shape[-1], block):
    part = jnp.dot(x[..., start : start + block], w[start : start + block])
    out = part if out is None else out + part
  return out


def _blocked_dot_fwd(x, w, block):
  return _blocked_dot(x, w, block), (x, w)


def _blocked_dot_bwd(block, residuals, g):
  del block
  x, w = residuals
  lead = tuple(range(x.ndim - 1))
  return jnp.dot(g, w.T), jnp.tensordot(x, g, axes=(lead, lead))


_blocked_dot.defvjp(_blocked_dot_fwd, _blocked_dot_bwd)

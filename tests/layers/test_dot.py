"""`layers.dot.dot`: float32 products summed in blocks on the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.layers import dot

_U = 2.0**-24


def _data(k, n=96, rows=(4, 32), seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(rows + (k,)).astype(np.float32)
  w = rng.standard_normal((k, n)).astype(np.float32)
  return x, w


def _rms_error(y, x, w):
  ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  return np.sqrt(np.mean((np.asarray(y, np.float64) - ref) ** 2)) / np.sqrt(
    np.mean(ref**2)
  )


def test_blocks_are_closer_to_float64_than_xla_dot():
  """K = 2048: blocks of 128 measure 3.6u, XLA's dot 6.8u (u = 2**-24)."""
  x, w = _data(2048)
  blocked = _rms_error(jax.jit(lambda a, b: dot.dot(a, b, 128))(x, w), x, w)
  xla = _rms_error(jax.jit(jnp.dot)(x, w), x, w)
  assert blocked <= 4.5 * _U < xla, (blocked / _U, xla / _U)


def test_blocks_are_the_sum_of_the_blocks_products_in_order():
  x, w = _data(300)
  got = jax.jit(lambda a, b: dot.dot(a, b, 128))(x, w)
  parts = [jnp.dot(x[..., s : s + 128], w[s : s + 128]) for s in (0, 128, 256)]
  np.testing.assert_array_equal(got, (parts[0] + parts[1]) + parts[2])


@pytest.mark.parametrize(
  'k,block,dtype',
  [(128, 128, jnp.float32), (300, 0, jnp.float32), (300, 128, jnp.bfloat16)],
)
def test_one_xla_dot_when_not_split(k, block, dtype):
  """K <= block, block 0 and bfloat16 products are `jnp.dot` bit for bit."""
  x, w = _data(k)
  x, w = jnp.asarray(x, dtype), jnp.asarray(w, dtype)
  f = jax.jit(lambda a, b: dot.dot(a, b, block))
  np.testing.assert_array_equal(f(x, w), jax.jit(jnp.dot)(x, w))


def test_gradients_are_the_plain_dots():
  x, w = _data(300)
  g = np.random.default_rng(1).standard_normal((4, 32, 96)).astype(np.float32)
  _, vjp = jax.vjp(lambda a, b: dot.dot(a, b, 128), x, w)
  gx, gw = jax.jit(vjp)(g)
  np.testing.assert_array_equal(gx, jax.jit(lambda g: g @ w.T)(g))
  np.testing.assert_array_equal(
    gw, jax.jit(lambda g: jnp.tensordot(x, g, ((0, 1), (0, 1))))(g)
  )
  np.testing.assert_allclose(
    gw, np.einsum('rtk,rtn->kn', x, g), rtol=1e-4, atol=1e-3
  )


@pytest.mark.parametrize('bad', [-1, 1.5, '128'])
def test_config_rejects_a_bad_block(bad):
  with pytest.raises(ValueError, match='cpu_sum_block'):
    sd.T5Config(vocab_size=32, cpu_sum_block=bad)

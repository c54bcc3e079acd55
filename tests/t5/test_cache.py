"""KV cache writes: every path equals writing the slots one by one."""

import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.t5 import cache as cache_lib


@pytest.mark.parametrize('batch,tokens', [(1, 1), (1, 3), (3, 1), (3, 2)])
def test_write_overwrites_the_row_slots(batch, tokens):
  rng = np.random.default_rng(batch * 10 + tokens)
  buffer = rng.normal(size=(batch, 2, 3, 7)).astype(np.float32)
  new = rng.normal(size=(batch, 2, 3, tokens)).astype(np.float32)
  index = rng.integers(0, 7 - tokens + 1, batch).astype(np.int32)
  expected = buffer.copy()
  for b in range(batch):
    expected[b, ..., index[b] : index[b] + tokens] = new[b]
  got = cache_lib.write(jnp.asarray(buffer), jnp.asarray(new), index)
  np.testing.assert_array_equal(np.asarray(got), expected)

"""Sampling transforms: each maps logits to one probability vector."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.core import sampling
from spec_decode.core.sampling import Sampler


def _probs(sampler, logits):
  return np.asarray(sampler.probs(jnp.asarray(logits, jnp.float32)))


def test_argmax_is_one_hot_on_first_max():
  np.testing.assert_array_equal(
    _probs(Sampler(0.0), [[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 1.0, 0.0]]),
    [[0, 1, 0, 0], [1, 0, 0, 0]],
  )


def test_temperature_is_scaled_softmax():
  logits = np.array([0.5, -1.0, 2.0, 0.0])
  for t in (0.3, 1.0, 2.5):
    want = np.exp(logits / t) / np.exp(logits / t).sum()
    np.testing.assert_allclose(_probs(Sampler(t), logits), want, rtol=1e-6)


def test_top_k_keeps_k_with_ties_to_lower_id():
  logits = np.array([1.0, 2.0, 2.0, 2.0, 0.0])
  got = _probs(Sampler(1.0, top_k=2), logits)
  np.testing.assert_allclose(got, [0, 0.5, 0.5, 0, 0], atol=1e-7)
  got = _probs(Sampler(1.0, top_k=4), logits)
  e = np.exp([1.0, 2.0, 2.0, 2.0])
  np.testing.assert_allclose(got, np.append(e / e.sum(), 0.0), rtol=1e-6)


def test_top_p_smallest_set_reaching_p():
  probs = np.array([0.1, 0.4, 0.3, 0.2])
  logits = np.log(probs)
  # Sorted: 0.4, 0.3, 0.2, 0.1. p=0.7 needs {1, 2}; p=0.71 needs {1, 2, 3}.
  np.testing.assert_allclose(
    _probs(Sampler(1.0, top_p=0.65), logits), [0, 4 / 7, 3 / 7, 0], rtol=1e-5
  )
  np.testing.assert_allclose(
    _probs(Sampler(1.0, top_p=0.75), logits),
    [0, 4 / 9, 3 / 9, 2 / 9],
    rtol=1e-5,
  )
  np.testing.assert_allclose(
    _probs(Sampler(1.0, top_p=0.3), logits), [0, 1, 0, 0], atol=1e-7
  )
  # Ties at the boundary go to the lower id.
  tie = np.log(np.array([0.25, 0.25, 0.25, 0.25]))
  np.testing.assert_allclose(
    _probs(Sampler(1.0, top_p=0.5), tie), [0.5, 0.5, 0, 0], atol=1e-6
  )


def test_combination_applies_temperature_then_top_k_then_top_p():
  logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0])
  t, k, p = 0.7, 3, 0.8
  scaled = np.exp(logits / t)
  keep = np.argsort(-logits, kind='stable')[:k]
  pk = np.zeros(5)
  pk[keep] = scaled[keep] / scaled[keep].sum()
  order = np.argsort(-pk, kind='stable')
  before = np.cumsum(pk[order]) - pk[order]
  want = np.zeros(5)
  want[order[before < p]] = pk[order[before < p]]
  want /= want.sum()
  np.testing.assert_allclose(
    _probs(Sampler(t, top_k=k, top_p=p), logits), want, rtol=1e-5, atol=1e-7
  )


def test_batched_shapes_and_normalization():
  logits = jax.random.normal(jax.random.key(0), (3, 4, 50))
  for s in (
    Sampler(0.0),
    Sampler(1.0),
    Sampler(0.7, 5),
    Sampler(1.3, 0, 0.9),
    Sampler(0.5, 10, 0.5),
  ):
    probs = np.asarray(s.probs(logits))
    assert probs.shape == (3, 4, 50)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert probs.min() >= 0.0


def test_sample_never_draws_zero_probability_ids():
  probs = jnp.array([0.0, 0.5, 0.0, 0.5])
  keys = jax.random.split(jax.random.key(1), 2000)
  draws = np.asarray(jax.vmap(lambda k: sampling.sample(k, probs))(keys))
  assert set(np.unique(draws)) == {1, 3}
  # Binomial(2000, 0.5): a 6-sigma band has false-alarm rate ~2e-9.
  assert abs((draws == 1).sum() - 1000) < 6 * np.sqrt(500)


@pytest.mark.parametrize(
  'kwargs',
  [
    dict(temperature=-0.1),
    dict(top_k=-1),
    dict(top_k=1.5),
    dict(top_p=0.0),
    dict(top_p=1.5),
  ],
)
def test_bad_settings_name_the_argument(kwargs):
  name = next(iter(kwargs))
  with pytest.raises(ValueError, match=name):
    Sampler(**kwargs)


def test_fast_argmax_equals_jnp_argmax():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 4, 257)).astype(np.float32)
  x[0, 0, [5, 9]] = 100.0  # tie: the first id wins
  x[0, 1, :] = -np.inf  # all equal
  x[1, 2, [7, 3]] = np.nan  # NaN: the first NaN, as jnp.argmax
  x[2, 3, 0] = 50.0
  got = np.asarray(sampling.argmax(jnp.asarray(x)))
  assert got.dtype == np.int32
  np.testing.assert_array_equal(got, np.asarray(jnp.argmax(x, axis=-1)))
  assert (got[0, 0], got[0, 1], got[1, 2], got[2, 3]) == (5, 0, 3, 0)

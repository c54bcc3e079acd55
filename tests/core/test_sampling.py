"""Sampling transforms: each maps logits to one probability vector."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

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


def _t5x_reference(logits, t, k, p):
  """T5X's rule restated on its definitions, in float64 numpy.

  top-k: keep x >= the k-th largest value. top-p: the largest threshold c
  among the probabilities with sum(probs[probs >= c]) >= p; keep probs >= c.
  (T5X finds both thresholds by a binary search over floats; here they are
  found by trying every candidate value.)
  """
  x = np.asarray(logits, np.float64) / t
  if 0 < k < x.size:
    x = np.where(x >= np.sort(x)[::-1][k - 1], x, -np.inf)
  probs = np.exp(x - x.max())
  probs /= probs.sum()
  if p < 1.0:
    mass = {c: probs[probs >= c].sum() for c in np.unique(probs) if c > 0}
    cutoff = max(c for c, m in mass.items() if m >= p)
    x = np.where(probs >= cutoff, x, -np.inf)
    probs = np.exp(x - x.max())
    probs /= probs.sum()
  return probs


def test_top_k_keeps_every_id_tied_with_the_kth_largest():
  # The case: T5X's topk_mask keeps {0, 2, 3} (2 is the 2nd value).
  logits = np.array([3.0, 1.0, 2.0, 2.0, 0.0])
  e = np.exp([3.0, 2.0, 2.0])
  np.testing.assert_allclose(
    _probs(Sampler(1.0, top_k=2), logits),
    [e[0] / e.sum(), 0, e[1] / e.sum(), e[2] / e.sum(), 0],
    rtol=1e-6,
  )
  assert _probs(Sampler(1.0, top_k=2), logits)[[1, 4]].tolist() == [0, 0]
  # Three ids tied at the top: k = 1 and k = 2 keep all three.
  tie = np.array([1.0, 2.0, 2.0, 2.0, 0.0])
  for k in (1, 2, 3):
    np.testing.assert_allclose(
      _probs(Sampler(1.0, top_k=k), tie), [0, 1 / 3, 1 / 3, 1 / 3, 0], atol=1e-7
    )
  e = np.exp([1.0, 2.0, 2.0, 2.0])
  np.testing.assert_allclose(
    _probs(Sampler(1.0, top_k=4), tie), np.append(e / e.sum(), 0.0), rtol=1e-6
  )


def test_top_p_smallest_set_reaching_p():
  probs = np.array([0.1, 0.4, 0.3, 0.2])
  logits = np.log(probs)
  # Sorted: 0.4, 0.3, 0.2, 0.1. p=0.65 needs {1, 2}; p=0.75 needs {1, 2, 3}.
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


def test_top_p_keeps_every_id_tied_at_the_boundary():
  # 0.4 alone is below p = 0.5; the next probability, 0.2, is shared by
  # three ids, and T5X's threshold rule keeps all of them.
  logits = np.log(np.array([0.2, 0.4, 0.2, 0.2]))
  np.testing.assert_allclose(
    _probs(Sampler(1.0, top_p=0.5), logits), [0.2, 0.4, 0.2, 0.2], rtol=1e-5
  )
  tie = np.zeros(4)
  np.testing.assert_allclose(
    _probs(Sampler(1.0, top_p=0.5), tie), [0.25] * 4, rtol=1e-6
  )
  # Below the boundary the tie does not matter: 0.4 >= p keeps id 1 alone.
  np.testing.assert_allclose(
    _probs(Sampler(1.0, top_p=0.35), logits), [0, 1, 0, 0], atol=1e-7
  )


def test_combination_applies_temperature_then_top_k_then_top_p():
  logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0])
  t, k, p = 0.7, 3, 0.8
  scaled = np.exp(logits / t)
  pk = np.where(np.isin(np.arange(5), [0, 1, 2]), scaled, 0.0)
  pk /= pk.sum()  # [0.74, 0.18, 0.09, 0, 0]: 0.74 < 0.8, so keep {0, 1}.
  want = np.array([pk[0], pk[1], 0, 0, 0]) / (pk[0] + pk[1])
  got = _probs(Sampler(t, top_k=k, top_p=p), logits)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got, _t5x_reference(logits, t, k, p), rtol=1e-5)


def test_truncation_matches_t5x_rule_on_tie_heavy_logits():
  """Random small-integer logits (many ties) against `_t5x_reference`."""
  rng = np.random.default_rng(0)
  logits = rng.integers(-3, 4, (200, 12)).astype(np.float32)
  rows_with_cut_ties = 0
  for t, k, p in [(1.0, 3, 1.0), (1.0, 0, 0.6), (0.8, 5, 0.7), (1.5, 1, 0.9)]:
    got = _probs(Sampler(t, top_k=k, top_p=p), logits)
    for x, row in zip(logits, got, strict=True):
      want = _t5x_reference(x, t, k, p)
      np.testing.assert_allclose(row, want, rtol=2e-5, atol=1e-7)
      np.testing.assert_array_equal(row > 0, want > 0)
      rows_with_cut_ties += (row > 0).sum() > max(k, 1) and k > 0
  assert rows_with_cut_ties > 50  # The ties were really exercised.


def test_order_keys_follow_the_float_order():
  """Against XLA's own comparisons (on CPU subnormals compare as 0)."""
  rng = np.random.default_rng(1)
  x = np.concatenate(
    [
      rng.normal(0, 10, 500),
      [-np.inf, np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-38, -3.4e38, 3.4e38],
    ]
  ).astype(np.float32)
  keys = np.asarray(sampling.order_keys(jnp.asarray(x))).astype(np.int64)
  xs = jnp.asarray(x)
  less = np.asarray(jax.jit(lambda v: v[:, None] < v[None, :])(xs))
  equal = np.asarray(jax.jit(lambda v: v[:, None] == v[None, :])(xs))
  np.testing.assert_array_equal(keys[:, None] < keys[None, :], less)
  np.testing.assert_array_equal(keys[:, None] == keys[None, :], equal)


def test_truncation_at_t5_vocabulary_with_ties_at_both_cuts():
  """V = 32128, logits on a coarse grid: thousands of ids share each value,
  so the k-th value and the top-p boundary are shared by many ids."""
  rng = np.random.default_rng(2)
  logits = np.round(rng.normal(0, 2, (3, 32128)) * 2) / 2
  for k, p in [(50, 1.0), (0, 0.3), (200, 0.5)]:
    got = _probs(Sampler(1.0, top_k=k, top_p=p), logits)
    for x, row in zip(logits, got, strict=True):
      want = _t5x_reference(x, 1.0, k, p)
      np.testing.assert_array_equal(row > 0, want > 0)
      np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-9)
      kept = row[row > 0]
      assert (kept == kept.min()).sum() > 1  # The cut fell inside a tie.


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


T5_VOCAB = 32128


def _sparse_probs(masses, seed=0, last_positive=False):
  """`[T5_VOCAB]` float32: `masses` at sorted random ids, 0 elsewhere.

  Id 0 is always 0; the last id is positive only with `last_positive`, so
  runs of thousands of zero ids sit before, between and after the masses.
  """
  rng = np.random.default_rng(seed)
  n = len(masses)
  ids = np.sort(rng.choice(np.arange(1, T5_VOCAB - 1), n, replace=False))
  if last_positive:
    ids[-1] = T5_VOCAB - 1
  probs = np.zeros(T5_VOCAB, np.float32)
  probs[ids] = masses
  return probs, ids


def _draw_at(u, probs, cdf=None):
  f = jax.vmap(sampling.invert_cdf, in_axes=(0, None, None))
  return np.asarray(f(jnp.asarray(u, jnp.float32), jnp.asarray(probs), cdf))


def test_no_zero_probability_id_at_any_uniform_at_t5_vocabulary():
  """Tiny, subnormal and large masses among 32,088 zeros; u at the ends
  of [0, 1), at every cdf boundary (and one ulp either side), at every
  zero id where XLA's own cumsum steps, and random.

  XLA:CPU lowers `jnp.cumsum` at this length to a `reduce_window` whose
  sums are not sequential: measured with 300 random masses, 75 zero ids
  got a cdf step, and the old rule ("first id with cdf > u * total")
  drew a zero-probability id with probability 1.7e-6 per draw.
  """
  masses = np.array([1e-30, 0.3, 1e-40, 0.2, 1e-7, 0.1, 1e-38, 0.25] * 5)
  probs, ids = _sparse_probs(masses)
  cdf = np.cumsum(probs.astype(np.float64))
  boundaries = (cdf[ids] / cdf[-1]).astype(np.float32)
  xla = np.asarray(jax.jit(jnp.cumsum)(jnp.asarray(probs)), np.float64)
  stepped = np.flatnonzero((probs[1:] == 0) & (xla[1:] != xla[:-1])) + 1
  at_steps = (xla[stepped - 1] / xla[-1]).astype(np.float32)
  one_below = np.nextafter(np.float32(1), np.float32(0))
  u = np.concatenate(
    [
      [0.0, np.float32(1e-45), 2.0**-24, 0.5, 1.0 - 2.0**-24, one_below],
      boundaries,
      np.nextafter(boundaries, np.float32(0)),
      np.nextafter(boundaries, np.float32(1)),
      at_steps,
      np.nextafter(at_steps, np.float32(1)),
      np.random.default_rng(1).random(4000),
    ]
  ).astype(np.float32)
  u = u[u < 1.0]
  draws = _draw_at(u, probs)
  assert (probs[draws] > 0).all(), sorted(set(draws[probs[draws] == 0]))
  assert draws[0] == ids[0]  # u = 0: the first positive id.
  assert draws[5] == ids[-1]  # u just below 1: the last positive id.
  # u = 1 (outside [0, 1)) or total mass rounded: the last positive id.
  assert _draw_at([1.0], probs)[0] == ids[-1]
  assert _draw_at([0.3], np.zeros(T5_VOCAB, np.float32))[0] == 0


def test_a_blocked_cumsum_cannot_make_a_zero_id_drawable():
  """A cdf whose zero-probability ids sit one ulp above the previous
  positive id's cdf (what a blocked sum can produce) and uniforms landing
  exactly on those cdf values.

  Negative control: the old rule, "the first id with cdf > u * total" over
  all ids, returns a zero-probability id for every one of these uniforms.
  """
  masses = np.random.default_rng(2).integers(1, 64, 40).astype(np.float64)
  masses[-1] += 2048 - masses.sum()  # Dyadic masses summing to exactly 1.
  probs, ids = _sparse_probs(masses / 2048, seed=3, last_positive=True)
  exact = np.cumsum(probs.astype(np.float64)).astype(np.float32)
  assert exact[-1] == 1.0
  blocked = exact.copy()
  zero = probs == 0
  blocked[zero] = np.nextafter(exact[zero], np.float32(2))
  assert (blocked[ids] == exact[ids]).all()
  u = exact[ids[:-1]]  # u * total lands exactly on a positive id's cdf.
  old_rule = np.sum(blocked[None] <= u[:, None], axis=1)
  assert (probs[old_rule] == 0).all()  # The control: each draw impossible.
  draws = _draw_at(u, probs, jnp.asarray(blocked))
  np.testing.assert_array_equal(draws, ids[1:])  # The next positive id.


def test_sample_draws_positive_ids_with_their_probabilities():
  """Pearson chi-square of N = 20,000 draws at V = 32128 (16 positive ids,
  df 15) at false-alarm rate 1e-3.

  Negative control: draws from probabilities with 10% of the largest mass
  moved to the smallest (noncentrality ~100: power > 0.999) are rejected by
  the same test.
  """
  masses = np.linspace(1.0, 4.0, 16)
  probs, ids = _sparse_probs(masses / masses.sum(), seed=4)
  wrong = probs.copy()
  big, small = ids[np.argmax(masses)], ids[np.argmin(masses)]
  wrong[big] -= 0.1 * probs[big]
  wrong[small] += 0.1 * probs[big]
  draw = jax.jit(jax.vmap(sampling.sample, in_axes=(0, None)))

  def p_value(source):
    draws = np.concatenate(
      [
        np.asarray(draw(jax.random.split(jax.random.key(i), 1000), source))
        for i in range(20)
      ]
    )
    assert (probs[draws] > 0).all()
    counts = np.array([(draws == i).sum() for i in ids])
    expected = len(draws) * probs[ids].astype(np.float64)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    return stats.chi2.sf(chi2, len(ids) - 1)

  assert p_value(jnp.asarray(probs)) > 1e-3
  assert p_value(jnp.asarray(wrong)) < 1e-3


@pytest.mark.parametrize(
  'kwargs',
  [
    dict(temperature=-0.1),
    dict(top_k=-1),
    dict(top_k=1.5),
    dict(top_p=0.0),
    dict(top_p=1.5),
    dict(temperature=float('nan')),
    dict(temperature=float('inf')),
    dict(temperature=True),
    dict(top_k=True),
    dict(top_p=float('nan')),
    dict(top_p=True),
  ],
)
def test_bad_settings_name_the_argument(kwargs):
  name = next(iter(kwargs))
  with pytest.raises(ValueError, match=name):
    Sampler(**kwargs)


def test_numpy_numbers_are_settings_too():
  s = Sampler(np.float32(0.5), np.int64(3), np.float64(0.9))
  assert s == Sampler(0.5, 3, 0.9)
  assert type(s.temperature) is float and type(s.top_k) is int


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

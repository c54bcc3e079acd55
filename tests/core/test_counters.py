"""The loop's counters and the host's statistics (`core.counters`)."""

import jax
import numpy as np
import pytest

from spec_decode.core.counters import SpecCounters
from spec_decode.core.counters import SpecStats


@pytest.mark.parametrize('with_gammas', [False, True])
def test_zero_counters_have_the_documented_shapes(with_gammas):
  c = SpecCounters.zeros(3, 4, with_gammas=with_gammas)
  shapes = {
    'iterations': ((3,), np.int32),
    'accepted_histogram': ((3, 5), np.int32),
    'position_tries': ((3, 4), np.int32),
    'position_accepts': ((3, 4), np.int32),
    'beta_sum': ((3,), np.float32),
    'proposed': ((3,), np.int32),
  }
  if with_gammas:
    shapes['gamma_histogram'] = ((3, 5), np.int32)
  else:
    assert c.gamma_histogram is None
  for name, (shape, dtype) in shapes.items():
    x = getattr(c, name)
    assert x.shape == shape and x.dtype == dtype, name
    assert not np.asarray(x).any(), name
  # A pytree of exactly those arrays (None is no leaf).
  assert len(jax.tree.leaves(c)) == len(shapes)


def _counters():
  """Two rows at G = 3 whose counts agree with each other.

  Row 0 ran 4 iterations that accepted 0, 1, 2 and 3 draft tokens (10
  tokens out; 1 + 3 + 3 + 3 proposed, the first stopping early as dynamic
  gamma does), row 1 ran 2 that accepted 1 each (4 tokens out; 2 + 3
  proposed). `gamma_histogram` is only passed through.
  """
  return SpecCounters(
    iterations=np.array([4, 2], np.int32),
    accepted_histogram=np.array([[1, 1, 1, 1], [0, 2, 0, 0]], np.int32),
    position_tries=np.array([[4, 3, 2], [2, 2, 0]], np.int32),
    position_accepts=np.array([[3, 2, 1], [2, 0, 0]], np.int32),
    beta_sum=np.array([5.4, 1.0], np.float32),
    proposed=np.array([10, 5], np.int32),
    gamma_histogram=np.array([[0, 0, 1, 3], [0, 1, 0, 1]], np.int32),
  )


def test_stats_from_counters_are_the_papers_quantities():
  s = SpecStats.from_counters(_counters(), np.array([10, 4]))
  assert s.gamma == 3
  # The batch's calls: its slowest row's iterations; drafts: the most any
  # row proposed (10 < 4 iterations x gamma 3).
  assert s.target_calls == 4 and s.draft_calls == 10
  np.testing.assert_array_equal(s.accepted_histogram, [1, 3, 1, 1])
  # Accepted over tested per position, pooled over rows: 5/6, 2/5, 1/2.
  np.testing.assert_allclose(s.per_position_acceptance, [5 / 6, 0.4, 0.5])
  # alpha: beta summed over the tested positions (9 + 4).
  np.testing.assert_allclose(s.alpha, 6.4 / 13, rtol=1e-6)
  np.testing.assert_allclose(s.row_alpha, [0.6, 0.25], rtol=1e-6)
  np.testing.assert_allclose(s.tokens_per_call, 14 / 6)
  np.testing.assert_allclose(s.row_tokens_per_call, [2.5, 2.0])
  np.testing.assert_allclose(s.mean_proposed, 15 / 6)
  np.testing.assert_array_equal(s.row_iterations, [4, 2])
  np.testing.assert_array_equal(s.row_proposed, [10, 5])
  np.testing.assert_array_equal(
    s.row_gamma_histogram, [[0, 0, 1, 3], [0, 1, 0, 1]]
  )
  np.testing.assert_array_equal(s.row_position_tries, [[4, 3, 2], [2, 2, 0]])
  # Draft calls never exceed gamma per target call.
  more = _counters().replace(proposed=np.array([20, 5], np.int32))
  assert SpecStats.from_counters(more, np.array([10, 4])).draft_calls == 12


def test_stats_of_nothing_are_zeros_not_nans():
  for batch in (2, 0):
    s = SpecStats.from_counters(SpecCounters.zeros(batch, 3), np.zeros(batch))
    assert s.target_calls == 0 and s.draft_calls == 0
    assert s.alpha == 0.0 and s.tokens_per_call == 0.0
    assert s.mean_proposed == 0.0 and s.row_gamma_histogram is None
    np.testing.assert_array_equal(s.per_position_acceptance, [0, 0, 0])
    np.testing.assert_array_equal(s.accepted_histogram, [0, 0, 0, 0])
    np.testing.assert_array_equal(s.row_alpha, np.zeros(batch))

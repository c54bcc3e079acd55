"""Algorithm 1 on fixed distributions: exact accept/reject cases."""

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.core import rejection

V = 4


def _keys(b, g):
  k = jax.random.split(jax.random.key(0), b * (g + 1)).reshape(b, g + 1)
  return k, jax.random.split(jax.random.key(1), b * (g + 1)).reshape(b, g + 1)


def _verify(p, q, tokens, uniforms, lenience=1.0):
  p = jnp.asarray(p, jnp.float32)
  q = jnp.asarray(q, jnp.float32)
  bonus, residual = _keys(p.shape[0], q.shape[1])
  return rejection.ExactVerifier(lenience)(
    p,
    q,
    jnp.asarray(tokens, jnp.int32),
    jnp.asarray(uniforms, jnp.float32),
    bonus,
    residual,
  )


def _one_hot(ids):
  return np.eye(V, dtype=np.float32)[ids]


def test_all_accepted_gives_bonus_from_last_target_position():
  # Greedy: draft guesses match the target argmax at all 3 positions.
  p = _one_hot([[2, 3, 1, 0]])
  q = _one_hot([[2, 3, 1]])
  r = _verify(p, q, [[2, 3, 1]], [[0.99, 0.5, 0.0]])
  np.testing.assert_array_equal(r.accepted, [3])
  np.testing.assert_array_equal(r.next_token, [0])
  np.testing.assert_allclose(r.beta, [[1, 1, 1]])


def test_zero_uniform_never_accepts_a_zero_probability_token():
  p = _one_hot([[2, 3]])
  q = _one_hot([[1]])
  np.testing.assert_array_equal(_verify(p, q, [[1]], [[0.0]]).accepted, [0])


def test_all_rejected_gives_residual_at_first_position():
  p = _one_hot([[2, 3, 1, 0]])
  q = _one_hot([[1, 3, 1]])
  r = _verify(p, q, [[1, 3, 1]], [[0.0, 0.0, 0.0]])
  np.testing.assert_array_equal(r.accepted, [0])
  # Residual norm(max(0, p - q)) is one-hot on the target's argmax.
  np.testing.assert_array_equal(r.next_token, [2])
  np.testing.assert_allclose(r.beta, [[0, 1, 1]])


def test_partial_acceptance_per_row():
  p = np.stack([_one_hot([0, 1, 2, 3]), _one_hot([0, 1, 2, 3])])
  q = np.stack([_one_hot([0, 1, 3]), _one_hot([0, 2, 2])])
  r = _verify(p, q, [[0, 1, 3], [0, 2, 2]], np.zeros((2, 3)))
  np.testing.assert_array_equal(r.accepted, [2, 1])
  np.testing.assert_array_equal(r.next_token, [2, 1])


def test_ratio_test_uses_uniforms():
  # p(x)/q(x) = 0.2/0.8 = 0.25 at position 0: accept iff r <= 0.25.
  p = np.array([[[0.2, 0.8, 0, 0], [0.25, 0.25, 0.25, 0.25]]], np.float32)
  q = np.array([[[0.8, 0.2, 0, 0]]], np.float32)
  for u, want in ((0.24, 1), (0.26, 0)):
    r = _verify(p, q, [[0]], [[u]])
    np.testing.assert_array_equal(r.accepted, [want])
  # Rejected: the residual max(0, p - q) = [0, 0.6, 0, 0] forces token 1.
  np.testing.assert_array_equal(_verify(p, q, [[0]], [[0.9]]).next_token, [1])
  np.testing.assert_allclose(
    _verify(p, q, [[0]], [[0.9]]).beta, [[0.4]], rtol=1e-6
  )


def test_next_distribution_residual_and_bonus():
  """The residual norm(max(0, p - q)), computed here from its definition,
  at p, q where it differs from both p and q; the bonus is p at position G.

  Three rows with G = 2 that accepted 0, 1 and 2 tokens: the first two take
  the residual at their first rejected position, the last the bonus.
  """
  p = np.array(
    [
      [[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]],
      [[0.1, 0.6, 0.3, 0.0], [0.6, 0.1, 0.1, 0.2], [0.7, 0.1, 0.1, 0.1]],
      [[0.3, 0.3, 0.2, 0.2], [0.6, 0.2, 0.1, 0.1], [0.1, 0.1, 0.2, 0.6]],
    ],
    np.float32,
  )
  q = np.array(
    [
      [[0.2, 0.4, 0.1, 0.3], [0.5, 0.2, 0.2, 0.1]],
      [[0.3, 0.3, 0.3, 0.1], [0.1, 0.5, 0.3, 0.1]],
      [[0.1, 0.1, 0.4, 0.4], [0.2, 0.2, 0.3, 0.3]],
    ],
    np.float32,
  )
  accepted = np.array([0, 1, 2])
  want = np.zeros((3, V))
  for b, a in enumerate(accepted):
    if a == q.shape[1]:
      want[b] = p[b, a]
      continue
    diff = [max(0.0, float(p[b, a, x]) - float(q[b, a, x])) for x in range(V)]
    want[b] = np.array(diff) / sum(diff)
    # The data can tell a residual from p and from q.
    assert np.abs(want[b] - p[b, a]).max() > 0.2
    assert np.abs(want[b] - q[b, a]).max() > 0.2
  np.testing.assert_allclose(want[0], [0.75, 0, 0.25, 0], rtol=1e-6)
  np.testing.assert_allclose(want[1], [5 / 6, 0, 0, 1 / 6], rtol=1e-6)
  got = rejection.next_distribution(
    jnp.asarray(p), jnp.asarray(q), jnp.asarray(accepted)
  )
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_rejected_draws_follow_the_residual():
  """`ExactVerifier` after a certain rejection (p(x) = 0 at the drafted
  token) draws from the residual, not from p: 4,000 draws, binomial
  6-sigma bands (false-alarm rate ~4e-9 over the two ids)."""
  p = np.array([[[0.0, 0.5, 0.3, 0.2], [0.25] * 4]], np.float32)
  q = np.array([[[0.6, 0.1, 0.3, 0.0]]], np.float32)
  # Residual max(0, p - q) = [0, 0.4, 0, 0.2] / 0.6: id 2 (p = 0.3) is out.
  n = 4000
  bonus, residual = _keys(n, 1)
  result = rejection.ExactVerifier()(
    jnp.asarray(np.repeat(p, n, 0)),
    jnp.asarray(np.repeat(q, n, 0)),
    jnp.zeros((n, 1), jnp.int32),
    jnp.full((n, 1), 0.5, jnp.float32),
    bonus,
    residual,
  )
  assert (np.asarray(result.accepted) == 0).all()
  counts = np.bincount(np.asarray(result.next_token), minlength=V)
  assert counts[0] == counts[2] == 0
  for x, share in ((1, 2 / 3), (3, 1 / 3)):
    sd6 = 6 * np.sqrt(n * share * (1 - share))
    assert abs(counts[x] - n * share) < sd6, counts


def test_degenerate_residual_falls_back_to_target():
  # p == q: the residual has no mass (rejection has probability 0).
  p = jnp.array([[[0.3, 0.7, 0, 0], [0.1, 0.2, 0.3, 0.4]]])
  q = p[:, :1]
  dist = rejection.next_distribution(p, q, jnp.array([0]))
  np.testing.assert_allclose(dist, p[:, 0], rtol=1e-6)
  assert np.isfinite(np.asarray(dist)).all()


def test_lenience_accepts_more():
  p = np.array([[[0.2, 0.8, 0, 0], [0.25, 0.25, 0.25, 0.25]]], np.float32)
  q = np.array([[[0.8, 0.2, 0, 0]]], np.float32)
  # Exact: accept iff r <= 0.25; l = 0.5: iff r <= 0.5.
  assert int(_verify(p, q, [[0]], [[0.4]]).accepted[0]) == 0
  assert int(_verify(p, q, [[0]], [[0.4]], lenience=0.5).accepted[0]) == 1


def test_beta_is_one_minus_total_variation():
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(V), 5)
  q = rng.dirichlet(np.ones(V), 5)
  np.testing.assert_allclose(
    rejection.beta(jnp.asarray(p), jnp.asarray(q)),
    1 - 0.5 * np.abs(p - q).sum(-1),
    rtol=1e-5,
  )


def test_greedy_path_equals_general_path_on_one_hots():
  rng = np.random.default_rng(3)
  b, g = 64, 4
  target = rng.integers(0, V, (b, g + 1))
  draft = np.where(
    rng.random((b, g)) < 0.6, target[:, :g], rng.integers(0, V, (b, g))
  )
  general = _verify(
    _one_hot(target), _one_hot(draft), draft, rng.random((b, g))
  )
  fast = rejection.ExactVerifier().greedy(
    jnp.asarray(target), jnp.asarray(draft)
  )
  np.testing.assert_array_equal(fast.accepted, general.accepted)
  np.testing.assert_array_equal(fast.next_token, general.next_token)
  np.testing.assert_allclose(fast.beta, general.beta)
  assert len(set(np.asarray(fast.accepted).tolist())) > 2

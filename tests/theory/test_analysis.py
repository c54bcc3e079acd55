"""Tests of spec_decode.theory against the paper's formulas and tables."""

import json
import os

import numpy as np
import pytest

from spec_decode import theory
from spec_decode.theory import cli

# Table 1 of Leviathan et al. (2023): alpha, gamma, operations, speed
# (c = c_hat = 0), printed to 2 decimals.
TABLE1 = [
  (0.6, 2, 1.53, 1.96),
  (0.7, 3, 1.58, 2.53),
  (0.8, 2, 1.23, 2.44),
  (0.8, 5, 1.63, 3.69),
  (0.9, 2, 1.11, 2.71),
  (0.9, 10, 1.60, 6.86),
]

# Tables 2 and 4: name, gamma, alpha, c (alpha and c printed to 2 decimals),
# Exp (Theorem 3.8, printed to 1 decimal).
TABLE4 = [
  ('EnDe small t=0', 7, 0.75, 0.02, 3.2),
  ('EnDe base t=0', 7, 0.80, 0.04, 3.3),
  ('EnDe large t=0', 7, 0.82, 0.11, 2.5),
  ('EnDe small t=1', 7, 0.62, 0.02, 2.3),
  ('EnDe base t=1', 5, 0.68, 0.04, 2.4),
  ('EnDe large t=1', 3, 0.71, 0.11, 2.0),
  ('CNNDM small t=0', 5, 0.65, 0.02, 2.4),
  ('CNNDM base t=0', 5, 0.73, 0.04, 2.6),
  ('CNNDM large t=0', 3, 0.74, 0.11, 2.0),
  ('CNNDM small t=1', 5, 0.53, 0.02, 1.9),
  ('CNNDM base t=1', 3, 0.55, 0.04, 1.8),
  ('CNNDM large t=1', 3, 0.56, 0.11, 1.6),
]

# Rows where Theorem 3.8 on the printed alpha and c rounds to 0.1 below the
# printed Exp (2.347 -> 2.3, 1.934 -> 1.9, 1.541 -> 1.5). No other rounding
# of our value (ceiling, truncation) matches all twelve rows. The paper
# computed Exp from unrounded alpha and c: within the rounding box of the
# printed inputs (+-0.005 each) Theorem 3.8 reaches a value that rounds to
# the printed Exp (see test_table4_mismatches_explained_by_input_rounding).
TABLE4_OFF_BY_ONE_DIGIT = {'EnDe base t=1', 'EnDe large t=1', 'CNNDM large t=1'}


def _round_half_up(x, decimals):
  # The paper's tables round half up; avoid banker's rounding of np.round.
  scale = 10.0**decimals
  return np.floor(np.asarray(x) * scale + 0.5 + 1e-9) / scale


@pytest.mark.parametrize('alpha,gamma,ops,speed', TABLE1)
def test_table1(alpha, gamma, ops, speed):
  np.testing.assert_allclose(
    _round_half_up(theory.ops_increase(alpha, gamma, 0.0), 2), ops, atol=1e-9
  )
  np.testing.assert_allclose(
    _round_half_up(theory.walltime_improvement(alpha, gamma, 0.0), 2),
    speed,
    atol=1e-9,
  )


def test_table1_vectorized_and_cli_rows():
  a, g, ops, speed = (np.array(col) for col in zip(*TABLE1, strict=True))
  np.testing.assert_allclose(
    theory.walltime_improvement(a, g, 0.0), speed, atol=0.005
  )
  np.testing.assert_allclose(theory.ops_increase(a, g, 0.0), ops, atol=0.005)
  rows = cli.table1()
  np.testing.assert_allclose([r['speed'] for r in rows], speed, atol=0.005)
  np.testing.assert_allclose([r['operations'] for r in rows], ops, atol=0.005)


@pytest.mark.parametrize('name,gamma,alpha,c,exp', TABLE4)
def test_table4_exp(name, gamma, alpha, c, exp):
  ours = float(theory.walltime_improvement(alpha, gamma, c))
  if name in TABLE4_OFF_BY_ONE_DIGIT:
    # Documented mismatch: one unit of the last printed digit below.
    np.testing.assert_allclose(_round_half_up(ours, 1), exp - 0.1, atol=1e-9)
    assert abs(ours - exp) < 0.07
  else:
    np.testing.assert_allclose(_round_half_up(ours, 1), exp, atol=1e-9)


@pytest.mark.parametrize(
  'name,gamma,alpha,c,exp',
  [row for row in TABLE4 if row[0] in TABLE4_OFF_BY_ONE_DIGIT],
)
def test_table4_mismatches_explained_by_input_rounding(
  name, gamma, alpha, c, exp
):
  del name
  # Theorem 3.8 increases in alpha and decreases in c: the largest value
  # over the rounding box is at (alpha + 0.005, c - 0.005).
  best = float(theory.walltime_improvement(alpha + 0.005, gamma, c - 0.005))
  np.testing.assert_allclose(_round_half_up(best, 1), exp, atol=1e-9)


def test_expected_tokens_limits():
  np.testing.assert_allclose(theory.expected_tokens(0.0, 5), 1.0)
  np.testing.assert_allclose(theory.expected_tokens(1.0, 5), 6.0)
  np.testing.assert_allclose(
    theory.expected_tokens(1.0 - 1e-10, 5), 6.0, rtol=1e-8
  )
  np.testing.assert_allclose(theory.expected_tokens(0.3, 0), 1.0)
  # Equation (1) equals the geometric sum 1 + a + ... + a^gamma.
  alphas = np.linspace(0.0, 0.999, 37)[:, None]
  gammas = np.arange(0, 12)[None, :]
  direct = np.stack(
    [
      np.sum(a ** np.arange(int(g) + 1))
      for a, g in np.broadcast(alphas, gammas)
    ]
  ).reshape(37, 12)
  np.testing.assert_allclose(
    theory.expected_tokens(alphas, gammas), direct, rtol=1e-12
  )


def test_expected_tokens_rejects_bad_input():
  with pytest.raises(ValueError):
    theory.expected_tokens(1.2, 3)
  with pytest.raises(ValueError):
    theory.expected_tokens(0.5, -1)


def test_oracle_bound():
  np.testing.assert_allclose(theory.oracle_bound([0.0, 0.5, 0.9]), [1, 2, 10])
  assert np.isinf(theory.oracle_bound(1.0))
  # Equation (1) approaches the bound from below as gamma grows.
  e = theory.expected_tokens(0.8, np.arange(1, 200))
  assert np.all(np.diff(e[:100]) > 0) and np.all(e < 5.0 + 1e-12)
  np.testing.assert_allclose(e[-1], 5.0, rtol=1e-12)


def test_walltime_improvement_with_v():
  a, g, c = 0.8, 4, 0.05
  e = (1 - a**5) / (1 - a)
  np.testing.assert_allclose(
    theory.walltime_improvement(a, g, c, v=1.5), e / (g * c + 1.5)
  )
  np.testing.assert_allclose(
    theory.walltime_improvement(a, g, c, v={5: 2.0}), e / (g * c + 2.0)
  )
  np.testing.assert_allclose(
    theory.walltime_improvement(a, [1, 4], c, v=lambda k: 1 + 0.25 * (k - 1)),
    [(1 + a) / (c + 1.25), e / (g * c + 2.0)],
  )


def test_ops_increase_matches_theorem_3_11():
  a, g, ch = 0.7, 3, 0.1
  np.testing.assert_allclose(
    theory.ops_increase(a, g, ch),
    (1 - a) * (g * ch + g + 1) / (1 - a ** (g + 1)),
  )
  np.testing.assert_allclose(theory.ops_increase(1.0, 3, 0.0), 1.0)


def test_corollary_3_9_on_grid():
  alphas = np.linspace(0.0, 0.99, 100)[:, None]
  cs = np.linspace(0.0, 1.0, 101)[None, :]
  gamma = theory.optimal_gamma(alphas, cs, max_gamma=64)
  best = theory.walltime_improvement(alphas, gamma, cs)
  bound = (1 + alphas) / (1 + cs)
  helps = np.broadcast_to(alphas > cs, best.shape)
  assert helps.sum() > 1000
  assert np.all(
    best[helps] >= np.broadcast_to(bound, best.shape)[helps] - 1e-12
  )
  assert np.all(best[helps] > 1.0)


def test_optimal_gamma_is_the_argmax():
  for a in (0.5, 0.75, 0.9):
    for c in (0.02, 0.1):
      g = int(theory.optimal_gamma(a, c, max_gamma=64))
      all_g = np.arange(1, 65)
      speed = theory.walltime_improvement(a, all_g, c)
      assert g == all_g[np.argmax(speed)]


def test_optimal_gamma_monotonic():
  alphas = np.linspace(0.05, 0.98, 94)
  cs = np.array([0.01, 0.02, 0.05, 0.1, 0.2, 0.5])
  g = theory.optimal_gamma(alphas[:, None], cs[None, :], max_gamma=200)
  assert g.shape == (94, 6)
  assert np.all(np.diff(g, axis=0) >= 0)  # Non-decreasing in alpha.
  assert np.all(np.diff(g, axis=1) <= 0)  # Non-increasing in c.
  assert np.all(g >= 1)
  # A target whose cost grows with k favours shorter drafts.
  g_cpu = theory.optimal_gamma(
    alphas[:, None], cs[None, :], v=lambda k: 1 + 0.1 * (k - 1), max_gamma=200
  )
  assert np.all(g_cpu <= g)
  # c = 0, v = 1: the improvement grows with gamma, the search hits the cap.
  assert int(theory.optimal_gamma(0.8, 0.0, max_gamma=17)) == 17


def test_choose_gamma_with_measured_v():
  v = {1: 1.0, 2: 1.1, 3: 1.2, 5: 1.4, 9: 2.0}
  gamma, speedup = theory.choose_gamma(0.7, 0.05, v, max_gamma=16)
  assert isinstance(gamma, int) and isinstance(speedup, float)
  candidates = {
    g: float(theory.walltime_improvement(0.7, g, 0.05, v[g + 1]))
    for g in (1, 2, 4, 8)
  }
  assert gamma == max(candidates, key=candidates.get)
  np.testing.assert_allclose(speedup, candidates[gamma])
  # Only measured k = gamma + 1 are candidates, within the bounds.
  gamma, _ = theory.choose_gamma(0.99, 0.0, v, max_gamma=4)
  assert gamma == 4
  with pytest.raises(ValueError):
    theory.choose_gamma(0.7, 0.05, {1: 1.0}, max_gamma=8)


def test_choose_gamma_when_speculation_does_not_help():
  gamma, speedup = theory.choose_gamma(0.1, 0.5, 1.0, min_gamma=0)
  assert gamma == 0 and speedup == 1.0
  gamma, speedup = theory.choose_gamma(0.1, 0.5, 1.0)
  assert gamma == 1 and speedup < 1.0


def test_choose_gamma_vectorized():
  gamma, speedup = theory.choose_gamma(
    np.array([0.6, 0.9]), np.array([[0.02], [0.2]]), max_gamma=64
  )
  assert gamma.shape == speedup.shape == (2, 2)
  np.testing.assert_array_equal(
    gamma, theory.optimal_gamma([0.6, 0.9], [[0.02], [0.2]])
  )


def test_beta_and_alpha_hand_computed():
  p = np.array([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
  q = np.array([[0.2, 0.2, 0.6], [0.5, 0.5, 0.0]])
  # min: [0.2, 0.2, 0.2] -> 0.6; [0.5, 0, 0] -> 0.5.
  np.testing.assert_allclose(theory.beta(p, q), [0.6, 0.5])
  np.testing.assert_allclose(theory.alpha(p, q), 0.55)
  np.testing.assert_allclose(theory.alpha(p, q, mask=[1, 0]), 0.6)
  np.testing.assert_allclose(theory.beta(p[0], p[0]), 1.0)
  # Disjoint supports never accept.
  np.testing.assert_allclose(theory.beta([1.0, 0.0], [0.0, 1.0]), 0.0)
  # beta = 1 - total variation distance (Lemma 3.3 / D_LK).
  rng = np.random.default_rng(0)
  pp = rng.dirichlet(np.ones(7), size=(4, 5))
  qq = rng.dirichlet(np.ones(7), size=(4, 5))
  np.testing.assert_allclose(
    theory.beta(pp, qq), 1 - 0.5 * np.abs(pp - qq).sum(-1), rtol=1e-12
  )
  np.testing.assert_allclose(
    theory.alpha(pp, qq), np.mean(theory.beta(pp, qq)), rtol=1e-12
  )


def test_lenient_alpha_hand_computed():
  p = np.array([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
  q = np.array([[0.2, 0.2, 0.6], [0.5, 0.5, 0.0]])
  np.testing.assert_allclose(theory.lenient_alpha(p, q, 1.0), 0.55)
  # l = 0.5: p / l = [1, .6, .4] and [2, 0, 0]; min with q: [.2, .2, .4]
  # -> 0.8 and [.5, 0, 0] -> 0.5; mean 0.65.
  np.testing.assert_allclose(theory.lenient_alpha(p, q, 0.5), 0.65)
  # l -> 0 accepts wherever p > 0: sum of q over the support of p.
  np.testing.assert_allclose(theory.lenient_alpha(p, q, 1e-9), 0.75)
  with pytest.raises(ValueError):
    theory.lenient_alpha(p, q, 0.0)


def test_cli_writes_figures(tmp_path, capsys):
  out_dir = tmp_path / 'theory'
  code = cli.main(
    [
      f'--out_dir={out_dir}',
      '--alphas=0.6,0.8,0.9',
      '--cs=0.02,0.1',
      '--max_gamma=32',
    ]
  )
  assert code == 0
  printed = capsys.readouterr().out
  assert 'Table 1' in printed and 'Optimal gamma' in printed
  for _, _, ops, speed in TABLE1:
    assert f'{ops:.2f}x' in printed and f'{speed:.2f}x' in printed
  for name in cli.FIGURE_FILES:
    path = out_dir / name
    assert path.exists() and os.path.getsize(path) > 1000
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  with open(out_dir / 'theory.json') as f:
    data = json.load(f)
  assert len(data['table1']) == 6
  np.testing.assert_array_equal(
    data['optimal_gamma']['gamma'],
    theory.optimal_gamma([[0.6], [0.8], [0.9]], [0.02, 0.1], max_gamma=32),
  )


def test_cli_rejects_bad_alpha(tmp_path):
  with pytest.raises(SystemExit):
    cli.main([f'--out_dir={tmp_path}', '--alphas=0.5,1.5'])

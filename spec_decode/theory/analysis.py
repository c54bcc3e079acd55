"""Closed-form analysis of speculative decoding (Leviathan et al., 2023, §3).

Every formula here is a numpy function that broadcasts over its arguments:

* `expected_tokens`: tokens emitted per iteration, equation (1).
* `walltime_improvement`: speedup over plain decoding, Theorem 3.8, with our
  generalization to a target whose cost grows with the number of scored
  positions (`v`, see below).
* `ops_increase`: factor of extra arithmetic operations, Theorem 3.11.
* `optimal_gamma` / `choose_gamma`: the integer γ that maximizes Theorem 3.8
  (Figure 3), the latter for picking γ from calibration measurements.
* `oracle_bound`: 1 / (1 - α), the expected tokens as γ → ∞ (the bound of an
  oracle that always drafts exactly up to the first rejection).
* `beta`, `alpha`, `lenient_alpha`: acceptance rates from distributions
  (definitions 3.1 and 3.2, and appendix A.5 for lenience).

Symbols follow the paper: α is the expected acceptance rate, γ the number of
drafted tokens per iteration, c the walltime of one draft step over that of
one target step, ĉ the arithmetic operations per token of the draft over
those of the target.

`v` is not in the paper. Theorem 3.8 assumes that the target scores γ + 1
positions in parallel in the time of one. On hardware where it does not (a
CPU, or a TPU past its memory-bound regime), let v(k) be the time of one
target call on k = γ + 1 tokens over that of a call on 1 token. One iteration
then costs γc + v(γ + 1) target steps and the improvement becomes
E[tokens] / (γc + v); v = 1 recovers Theorem 3.8.
"""

from collections.abc import Callable
from collections.abc import Mapping
from typing import NamedTuple
from typing import Union

import numpy as np

# A cost v of the target's parallel call relative to a single-token call:
# a constant (number or array, broadcast with α and c), a callable k -> v(k),
# or a mapping {k: v(k)} of measured values, with k = γ + 1.
VCost = Union[float, np.ndarray, Callable[[int], float], Mapping[int, float]]

# Below this |1 - α| the geometric sum is replaced by its limit γ + 1
# (relative error below γ * 1e-12).
_ALPHA_ONE_TOL = 1e-12


def _check_alpha(alpha: np.ndarray) -> None:
  if np.any(np.isnan(alpha)) or np.any((alpha < 0) | (alpha > 1)):
    raise ValueError(f'alpha must lie in [0, 1], got {alpha}.')


def _check_gamma(gamma: np.ndarray) -> None:
  if np.any(gamma < 0):
    raise ValueError(f'gamma must be >= 0, got {gamma}.')


def expected_tokens(alpha, gamma) -> np.ndarray:
  """Expected tokens emitted per iteration of Algorithm 1, equation (1).

  E[#tokens] = (1 - α^(γ+1)) / (1 - α), the mean of a geometric variable
  capped at γ + 1 (Theorem 3.5 / equation 1, under the i.i.d. β assumption).
  At α = 1 every draft is accepted and the value is the limit γ + 1. It is
  computed as expm1((γ+1) log α) / expm1(log α), which stays accurate near
  α = 1; at α = 0 it is 1.

  Args:
    alpha: expected acceptance rate α in [0, 1], any shape.
    gamma: number of drafted tokens γ >= 0, broadcastable with `alpha`.

  Returns:
    The expected number of emitted tokens, in [1, γ + 1], with the broadcast
    shape of the arguments (a 0-d array for scalar arguments).

  Raises:
    ValueError: if α lies outside [0, 1] or γ < 0.
  """
  alpha = np.asarray(alpha, dtype=np.float64)
  gamma = np.asarray(gamma, dtype=np.float64)
  _check_alpha(alpha)
  _check_gamma(gamma)
  near_one = np.abs(1.0 - alpha) < _ALPHA_ONE_TOL
  safe = np.where(near_one, 0.5, alpha)
  with np.errstate(divide='ignore'):
    log_a = np.log(safe)  # -inf at α = 0; expm1(-inf) = -1 gives 1 below.
  geometric = np.expm1((gamma + 1.0) * log_a) / np.expm1(log_a)
  return np.where(near_one, gamma + 1.0, geometric)


def _v_values(v: VCost, k) -> np.ndarray:
  """Resolves a cost `v` at k = γ + 1 scored tokens.

  Args:
    v: see `VCost`.
    k: integer token counts, any shape.

  Returns:
    v(k) as a float array. A constant `v` is returned as is (it broadcasts
    with the other arguments); a callable or mapping is evaluated elementwise
    and has the shape of `k`.

  Raises:
    KeyError: if a mapping has no entry for some k.
  """
  if isinstance(v, Mapping):
    lookup = lambda kk: float(v[int(kk)])
  elif callable(v):
    lookup = lambda kk: float(v(int(kk)))
  else:
    return np.asarray(v, dtype=np.float64)
  k = np.asarray(k)
  flat = [lookup(kk) for kk in k.reshape(-1)]
  return np.asarray(flat, dtype=np.float64).reshape(k.shape)


def walltime_improvement(alpha, gamma, c, v: VCost = 1.0) -> np.ndarray:
  """Expected walltime speedup over plain decoding, Theorem 3.8.

  With v = 1 this is Theorem 3.8,
    (1 - α^(γ+1)) / ((1 - α)(γc + 1)).
  In general (our extension, see the module docstring) it is
    E[#tokens] / (γc + v(γ + 1)),
  where v(k) is the cost of scoring k tokens in one target call relative to
  scoring one.

  Args:
    alpha: expected acceptance rate α in [0, 1].
    gamma: drafted tokens per iteration γ >= 0, broadcastable with `alpha`.
    c: draft step time over target step time, broadcastable.
    v: relative cost of the target's parallel call; a constant (broadcast
      with the other arguments), a callable k -> v(k), or a mapping
      {k: v(k)}, with k = γ + 1.

  Returns:
    The expected improvement factor, with the broadcast shape.
  """
  gamma_arr = np.asarray(gamma)
  cost = np.asarray(c, dtype=np.float64) * gamma_arr + _v_values(
    v, gamma_arr + 1
  )
  return expected_tokens(alpha, gamma) / cost


def ops_increase(alpha, gamma, c_hat) -> np.ndarray:
  """Expected factor of extra arithmetic operations, Theorem 3.11.

    (1 - α)(γĉ + γ + 1) / (1 - α^(γ+1)) = (γĉ + γ + 1) / E[#tokens].

  Each iteration runs the draft γ times and the target on γ + 1 positions,
  and emits E[#tokens] tokens (equation 1); plain decoding spends one target
  token's operations per emitted token.

  Args:
    alpha: expected acceptance rate α in [0, 1].
    gamma: drafted tokens per iteration γ >= 0, broadcastable.
    c_hat: operations per token of the draft over those of the target ĉ.

  Returns:
    The ops increase factor (>= 1 when ĉ >= 0), with the broadcast shape.
  """
  gamma_arr = np.asarray(gamma, dtype=np.float64)
  work = gamma_arr * np.asarray(c_hat, dtype=np.float64) + gamma_arr + 1.0
  return work / expected_tokens(alpha, gamma)


def oracle_bound(alpha) -> np.ndarray:
  """Expected tokens per iteration as γ → ∞: 1 / (1 - α) (section 3.3).

  Args:
    alpha: expected acceptance rate α in [0, 1].

  Returns:
    1 / (1 - α), infinite at α = 1.
  """
  alpha = np.asarray(alpha, dtype=np.float64)
  _check_alpha(alpha)
  with np.errstate(divide='ignore'):
    return 1.0 / (1.0 - alpha)


def optimal_gamma(
  alpha, c, v: VCost = 1.0, max_gamma: int = 64, min_gamma: int = 1
) -> np.ndarray:
  """The integer γ that maximizes the walltime improvement (Figure 3).

  Searches γ in [min_gamma, max_gamma] for the maximum of
  `walltime_improvement(alpha, γ, c, v)` (Theorem 3.8 when v = 1). Ties go to
  the smallest γ. With c = 0 and v = 1 the improvement grows without bound in
  γ and the answer is `max_gamma`.

  Corollary 3.9: if α > c (and v = 1), γ = 1 already gives
  (1 + α) / (1 + c) > 1, so the optimum is at least that.

  Args:
    alpha: expected acceptance rate α in [0, 1], any shape.
    c: draft step time over target step time, broadcastable with `alpha`.
    v: relative cost of the target's parallel call on k = γ + 1 tokens: a
      constant (broadcast with α and c), a callable k -> v(k) or a mapping
      {k: v(k)} (on CPU v grows with k). With a mapping only the γ whose
      k = γ + 1 is a key are searched.
    max_gamma: largest γ searched.
    min_gamma: smallest γ searched; 0 admits plain decoding (improvement
      1 / v(1)).

  Returns:
    The optimal γ as an int64 array with the broadcast shape of α and c
    (and a constant `v`).

  Raises:
    ValueError: if no γ is left to search.
  """
  gammas = _candidate_gammas(v, min_gamma, max_gamma)
  return _search(alpha, c, v, gammas)[0]


def _candidate_gammas(v: VCost, min_gamma: int, max_gamma: int) -> np.ndarray:
  gammas = np.arange(min_gamma, max_gamma + 1)
  if isinstance(v, Mapping):
    gammas = np.asarray([g for g in gammas if int(g) + 1 in v], dtype=int)
  if gammas.size == 0:
    where = f'[{min_gamma}, {max_gamma}]'
    if isinstance(v, Mapping):
      where += f' with k = gamma + 1 among the measured {sorted(v)}'
    raise ValueError(f'No gamma to search in {where}.')
  return gammas


def _search(alpha, c, v: VCost, gammas: np.ndarray):
  """Best γ among `gammas` and its improvement, broadcast over α, c, v."""
  alpha = np.asarray(alpha, dtype=np.float64)[..., None]
  c = np.asarray(c, dtype=np.float64)[..., None]
  if isinstance(v, Mapping) or callable(v):
    v_grid = _v_values(v, gammas + 1)  # [G]
  else:
    v_grid = np.asarray(v, dtype=np.float64)[..., None]
  speedup = walltime_improvement(alpha, gammas, c, v_grid)  # [..., G]
  best = np.argmax(speedup, axis=-1)
  best_speedup = np.take_along_axis(speedup, best[..., None], axis=-1)
  return gammas[best].astype(np.int64), best_speedup[..., 0]


class GammaChoice(NamedTuple):
  """Result of `choose_gamma`.

  Attributes:
    gamma: the chosen γ (an int for scalar inputs).
    improvement: the predicted walltime improvement at that γ (a float for
      scalar inputs); below 1 speculation is predicted not to pay off.
  """

  gamma: Union[int, np.ndarray]
  improvement: Union[float, np.ndarray]


def choose_gamma(
  alpha,
  c,
  v_of_k: VCost = 1.0,
  max_gamma: int = 16,
  min_gamma: int = 1,
) -> GammaChoice:
  """Picks γ from measured α, c and v(k) (the auto-γ feature).

  Same search as `optimal_gamma` (maximum of the generalized Theorem 3.8,
  E[#tokens] / (γc + v(γ + 1))), returning the predicted improvement too.
  Typical use, after a calibration run:

    gamma, speedup = choose_gamma(0.7, 0.05, {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8})

  Args:
    alpha: measured acceptance rate α in [0, 1].
    c: measured draft step time over target step time.
    v_of_k: measured cost of a target call on k tokens over a call on one
      token: a mapping {k: v(k)} (only γ = k - 1 for measured k are
      candidates), a callable, or a constant.
    max_gamma: largest γ considered.
    min_gamma: smallest γ considered (0 admits plain decoding).

  Returns:
    `GammaChoice(gamma, improvement)`; Python scalars when α and c are
    scalars (and v is not an array), arrays otherwise.
  """
  gammas = _candidate_gammas(v_of_k, min_gamma, max_gamma)
  gamma, speedup = _search(alpha, c, v_of_k, gammas)
  if gamma.ndim == 0:
    return GammaChoice(int(gamma), float(speedup))
  return GammaChoice(gamma, speedup)


def beta(p, q) -> np.ndarray:
  """Acceptance probability at one position, definition 3.1.

  β = Σ_x min(p(x), q(x)) = 1 - D_LK(p, q) (Lemma 3.3).

  Args:
    p: `[..., V]` target distributions (after the sampling transform).
    q: `[..., V]` draft distributions, broadcastable with `p`.

  Returns:
    `[...]` β per position.
  """
  p = np.asarray(p, dtype=np.float64)
  q = np.asarray(q, dtype=np.float64)
  return np.sum(np.minimum(p, q), axis=-1)


def _masked_mean(values: np.ndarray, mask) -> float:
  if mask is None:
    return float(np.mean(values))
  mask = np.broadcast_to(np.asarray(mask, dtype=np.float64), values.shape)
  total = np.sum(mask)
  if total == 0:
    raise ValueError('mask selects no position.')
  return float(np.sum(values * mask) / total)


def alpha(p_batch, q_batch, mask=None) -> float:
  """Expected acceptance rate α = E[β], definition 3.2.

  The paper estimates α as the mean β over positions of text generated by
  the target (10K tokens); pass the distributions at those positions.

  Args:
    p_batch: `[..., V]` target distributions.
    q_batch: `[..., V]` draft distributions, broadcastable with `p_batch`.
    mask: optional `[...]` weights (1 for real positions, 0 for padding).

  Returns:
    α, the (masked) mean of `beta(p_batch, q_batch)` over all positions.
  """
  return _masked_mean(beta(p_batch, q_batch), mask)


def lenient_alpha(p, q, l, mask=None) -> float:  # noqa: E741 (paper: l)
  """Acceptance rate with lenience l, appendix A.5.

  Accepting x when l·q(x) <= p(x) (and otherwise with probability
  p(x) / (l·q(x))) accepts with probability Σ_x min(p(x)/l, q(x)) per
  position; l = 1 is `alpha`.

  Args:
    p: `[..., V]` target distributions.
    q: `[..., V]` draft distributions, broadcastable with `p`.
    l: lenience in (0, 1].
    mask: optional `[...]` weights (1 for real positions, 0 for padding).

  Returns:
    The (masked) mean over positions of Σ_x min(p(x)/l, q(x)).

  Raises:
    ValueError: if l is not in (0, 1].
  """
  if not 0 < l <= 1:
    raise ValueError(f'lenience l must lie in (0, 1], got {l}.')
  p = np.asarray(p, dtype=np.float64)
  q = np.asarray(q, dtype=np.float64)
  per_position = np.sum(np.minimum(p / l, q), axis=-1)
  return _masked_mean(per_position, mask)

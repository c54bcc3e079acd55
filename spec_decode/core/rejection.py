"""Algorithm 1 of Leviathan et al. (2023) as pure functions on distributions.

Shapes: `B` rows, `G` = gamma drafted tokens, `V` vocabulary.
  p: `[B, G + 1, V]` target distributions at the G+1 prefixes.
  q: `[B, G, V]` draft distributions the draft tokens were drawn from.
Everything is per row: rows accept different numbers of tokens.
"""

import dataclasses
from typing import Protocol

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.core import sampling

# Below this total mass a residual is numerically empty; rejection then had
# probability ~0, and the guarded fallback is the target distribution itself.
_RESIDUAL_FLOOR = 1e-12


@flax.struct.dataclass(kw_only=True)
class VerifyResult:
  """Outcome of one verification.

  Attributes:
    accepted: `[B] int32` in [0, G], number of draft tokens kept.
    next_token: `[B] int32`, the residual sample (accepted < G) or the bonus
      sample from `p[:, G]` (accepted == G).
    beta: `[B, G] float32`, acceptance probability sum_x min(p, q) per
      drafted position (paper section 3.1); sum_x min(p / l, q) with
      lenience l (appendix A.5).
  """

  accepted: jax.Array
  next_token: jax.Array
  beta: jax.Array


def beta(p: jax.Array, q: jax.Array) -> jax.Array:
  """sum_x min(p(x), q(x)) over the last axis."""
  return jnp.sum(jnp.minimum(p, q), axis=-1)


def accepted_count(
  p_of_x: jax.Array,
  q_of_x: jax.Array,
  uniforms: jax.Array,
  lenience: float = 1.0,
  num_proposed: jax.Array | None = None,
) -> jax.Array:
  """Number of leading draft tokens kept, `[B]`.

  Token i is kept when `r_i * l * q(x_i) < p(x_i)` (r_i ~ U[0, 1)): the
  paper's "reject if r > p/q" without a division. The strict inequality
  matters: r = 0 can happen, and must not accept a token with p(x) = 0. The
  count stops at the first rejection.

  Args:
    p_of_x: `[B, G]` target probability of each draft token.
    q_of_x: `[B, G]` draft probability of each draft token (> 0).
    uniforms: `[B, G]` in [0, 1).
    lenience: l in (0, 1]; 1 is exact.
    num_proposed: optional `[B]`, tokens proposed per row; later positions
      are never accepted.
  """
  ok = uniforms * (lenience * q_of_x) < p_of_x
  if num_proposed is not None:
    ok &= jnp.arange(ok.shape[1])[None] < num_proposed[:, None]
  return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=-1), axis=-1)


def next_distribution(
  p: jax.Array,
  q: jax.Array,
  accepted: jax.Array,
  lenience: float = 1.0,
  num_proposed: jax.Array | None = None,
) -> jax.Array:
  """Distribution of the token after the accepted ones, `[B, V]`.

  `norm(max(0, p - l*q))` at the first rejected position, or `p` at position
  G (the bonus token) when everything was accepted; with `num_proposed`, `p`
  also at position `num_proposed` (nothing was proposed there). A residual
  with no mass (p == q up to rounding, where rejection has probability ~0)
  falls back to p.
  """
  g = q.shape[1]
  rows = jnp.arange(p.shape[0])
  p_next = p[rows, accepted]
  q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)
  residual = jnp.maximum(p_next - lenience * q_pad[rows, accepted], 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  residual = jnp.where(
    mass > _RESIDUAL_FLOOR,
    residual / jnp.maximum(mass, _RESIDUAL_FLOOR),
    p_next,
  )
  proposed_all = accepted == g
  if num_proposed is not None:
    proposed_all |= accepted >= num_proposed
  return jnp.where(proposed_all[:, None], p_next, residual)


class Verifier(Protocol):
  """Maps (p, q, draft tokens, randomness) to a `VerifyResult`."""

  def __call__(
    self,
    p: jax.Array,
    q: jax.Array,
    draft_tokens: jax.Array,
    uniforms: jax.Array,
    bonus_keys: jax.Array,
    residual_keys: jax.Array,
    greedy: bool = False,
    num_proposed: jax.Array | None = None,
  ) -> VerifyResult:
    """`greedy` (static): p and q are one-hot, so draws need no noise.

    `num_proposed` (`[B]`, or None for all G) is passed only by drafters that
    propose fewer than G tokens in some rows (dynamic gamma, prompt lookup).

    A verifier may also define `greedy(target_tokens [B, G+1], draft_tokens
    [B, G], num_proposed=None, target_logits=None) -> VerifyResult` for
    argmax decoding; the loop then skips building one-hot distributions.
    """
    ...


def _gather_token_probs(dist: jax.Array, tokens: jax.Array) -> jax.Array:
  return jnp.take_along_axis(dist, tokens[..., None], axis=-1)[..., 0]


@dataclasses.dataclass(frozen=True)
class ExactVerifier:
  """Algorithm 1 (with optional lenience, appendix A.5; l = 1 is exact).

  Lenience, sampling form: compare `l * q(x)` with `p(x)` (no token is then
  drawn with probability above p(x) / l). Argmax form (`greedy`, given the
  target logits): accept x when `p(x) >= l * max(p)`, on the target's raw
  (temperature-1) probabilities; a rejection emits the target's argmax.

  Randomness: `uniforms [B, G]` for the accept tests; `bonus_keys` and
  `residual_keys` `[B, G + 1]` are per-position keys, of which the one at
  position `accepted` draws the next token (bonus key when everything was
  accepted, residual key otherwise).
  """

  lenience: float = 1.0

  def __post_init__(self):
    if not 0.0 < self.lenience <= 1.0:
      raise ValueError(f'lenience must be in (0, 1], got {self.lenience!r}')

  def greedy(
    self,
    target_tokens: jax.Array,
    draft_tokens: jax.Array,
    num_proposed: jax.Array | None = None,
    target_logits: jax.Array | None = None,
  ) -> VerifyResult:
    """Algorithm 1 for argmax p and q, on token ids instead of one-hots.

    With one-hot p and q, x is accepted iff it is the target's argmax, the
    residual and the bonus are one-hot on the target's argmax, and beta is 1
    where the argmaxes agree: exactly what `__call__` computes.

    Args:
      target_tokens: `[B, G + 1]` argmax of the target at each prefix.
      draft_tokens: `[B, G]`.
      num_proposed: optional `[B]`, tokens proposed per row.
      target_logits: `[B, G + 1, V]`, needed only for lenience < 1.
    """
    g = draft_tokens.shape[1]
    if self.lenience < 1.0:
      if target_logits is None:
        raise ValueError('lenient argmax verification needs target_logits')
      logits = target_logits[:, :g]
      drafted = jnp.take_along_axis(logits, draft_tokens[..., None], -1)
      # p(x) / max(p) = exp(logit(x) - max(logit)), no softmax needed.
      gap = drafted[..., 0] - jnp.max(logits, axis=-1)
      match = gap >= jnp.log(jnp.float32(self.lenience))
    else:
      match = draft_tokens == target_tokens[:, :g]
    if num_proposed is not None:
      match &= jnp.arange(g)[None] < num_proposed[:, None]
    accepted = jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=-1), axis=-1)
    rows = jnp.arange(draft_tokens.shape[0])
    return VerifyResult(
      accepted=accepted,
      next_token=target_tokens[rows, accepted],
      beta=match.astype(jnp.float32),
    )

  def __call__(
    self,
    p,
    q,
    draft_tokens,
    uniforms,
    bonus_keys,
    residual_keys,
    greedy=False,
    num_proposed=None,
  ):
    g = q.shape[1]
    p_x = _gather_token_probs(p[:, :g], draft_tokens)
    q_x = _gather_token_probs(q, draft_tokens)
    accepted = accepted_count(p_x, q_x, uniforms, self.lenience, num_proposed)
    dist = next_distribution(p, q, accepted, self.lenience, num_proposed)
    if greedy:
      # One-hot p and q give a one-hot residual or bonus distribution.
      next_token = jnp.argmax(dist, axis=-1).astype(jnp.int32)
      return VerifyResult(
        accepted=accepted,
        next_token=next_token,
        beta=beta(p[:, :g] / self.lenience, q),
      )
    rows = jnp.arange(p.shape[0])
    # One draw from `dist`, with the bonus key when everything was accepted.
    use_bonus = (accepted == g)[:, None]
    key_data = jnp.where(
      use_bonus,
      jax.random.key_data(bonus_keys[rows, accepted]),
      jax.random.key_data(residual_keys[rows, accepted]),
    )
    keys = jax.random.wrap_key_data(
      key_data, impl=jax.random.key_impl(bonus_keys)
    )
    next_token = jax.vmap(sampling.sample)(keys, dist)
    return VerifyResult(
      accepted=accepted,
      next_token=next_token,
      beta=beta(p[:, :g] / self.lenience, q),
    )

"""Verifying one proposed block against the target's logits.

Shared by the decoding loop and by `drafters.Hierarchical` (which runs the
same step one level down). The keys of every draw come from the row's key,
the output position and a purpose, so a row's draws never depend on its
batch mates, and a draft equal to the target draws what plain sampling
draws: the token at output position k is sampled with
`fold_in(fold_in(row_key, k), SAMPLE)`, its acceptance uniform uses ACCEPT
and a residual draw RESIDUAL.
"""

import jax
import jax.numpy as jnp

from spec_decode.core import rejection
from spec_decode.core import sampling
from spec_decode.core.drafter import Proposal

# Purposes of the draws at one position.
SAMPLE, ACCEPT, RESIDUAL = 0, 1, 2


def verify_block(
  verifier: rejection.Verifier,
  sampler: sampling.Sampler,
  logits: jax.Array,
  proposal: Proposal,
  row_keys: jax.Array,
  positions: jax.Array,
) -> tuple[rejection.VerifyResult, jax.Array | None]:
  """Runs `verifier` on `logits [B, G+1, V]` and a proposal of G tokens.

  Args:
    verifier: Algorithm 1 (`rejection.ExactVerifier`) or a variant.
    sampler: the logits -> distribution map shared by draft and target.
    logits: the target's logits after the newest input and each proposed
      token.
    proposal: the drafter's tokens `[B, G]`, their `q` and count.
    row_keys: `[B]` keys of the rows.
    positions: `[B, G+1]` output positions of the proposed tokens and the
      one after them.

  Returns:
    The `VerifyResult`, and the target's distributions `[B, G+1, V]` (None
    on the greedy path, which compares argmax ids).
  """
  g = proposal.tokens.shape[1]
  extra = {} if proposal.num is None else {'num_proposed': proposal.num}
  greedy_path = getattr(verifier, 'greedy', None)
  if sampler.is_greedy and greedy_path is not None:
    if getattr(verifier, 'lenience', 1.0) < 1.0:
      extra['target_logits'] = logits
    result = greedy_path(sampling.argmax(logits), proposal.tokens, **extra)
    return result, None
  q = proposal.q
  if q is None:  # Greedy draft, verifier without a greedy path.
    q = jax.nn.one_hot(proposal.tokens, logits.shape[-1], dtype=jnp.float32)
  uniforms = jax.vmap(
    jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))
  )(sampling.position_keys(row_keys, positions[:, :g], ACCEPT))
  p = sampler.probs(logits)
  result = verifier(
    p,
    q,
    proposal.tokens,
    uniforms=uniforms,
    bonus_keys=sampling.position_keys(row_keys, positions, SAMPLE),
    residual_keys=sampling.position_keys(row_keys, positions, RESIDUAL),
    greedy=sampler.is_greedy,
    **extra,
  )
  return result, p

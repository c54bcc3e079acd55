"""A draft with a set acceptance rate, for performance measurements.

The synthetic-acceptance method of TensorRT-LLM and SGLang benchmarks: a real
draft network runs (so the draft's cost is real), but its proposal at each
position is replaced by the target's own greedy continuation with probability
alpha, and by a token the target does not choose otherwise. Under greedy
decoding every replaced proposal is accepted and every other one rejected,
so the acceptance rate is alpha by construction and the measured speedup can
be set against the paper's prediction for that alpha.
"""

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.core.protocol import DecodeState
from spec_decode.core.protocol import LanguageModel

_PROPOSAL_LOGIT = 30.0


@flax.struct.dataclass(kw_only=True)
class ControlledState:
  """Attributes: `inner`, the real draft's state (its index is ours)."""

  inner: DecodeState


@flax.struct.dataclass(kw_only=True)
class ControlledDraft:
  """Proposes `reference[b, k]` at output position k with probability alpha.

  Attributes:
    inner: the draft network that supplies the cost.
    reference: `[B, K] int32`, the target's greedy output (position k at
      column k - 1), longer than any position the loop asks about.
    alpha: scalar float, the probability of proposing the reference token.
    key: PRNG key; the coin for (row, position) is fixed, so repeated calls
      at one position agree.
  """

  inner: LanguageModel
  reference: jax.Array
  alpha: jax.Array
  key: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  @property
  def vocabulary(self):
    return getattr(self.inner, 'vocabulary', None)

  def init_state(self, encoder_tokens, length) -> ControlledState:
    return ControlledState(inner=self.inner.init_state(encoder_tokens, length))

  def _index(self, state: ControlledState) -> jax.Array:
    return state.inner.cache.index

  def score(self, state: ControlledState, tokens: jax.Array):
    index = self._index(state)
    inner_logits, inner = self.inner.score(state.inner, tokens)
    batch, t = tokens.shape
    # Input at position i predicts output token i + 1 (column i).
    cols = jnp.clip(
      index[:, None] + jnp.arange(t)[None], 0, self.reference.shape[1] - 1
    )
    ref = jnp.take_along_axis(self.reference, cols, axis=1)
    rows = jnp.arange(batch)[:, None]
    coins = jax.vmap(
      jax.vmap(
        lambda r, c: jax.random.uniform(
          jax.random.fold_in(jax.random.fold_in(self.key, r), c)
        )
      )
    )(jnp.broadcast_to(rows, cols.shape), cols)
    wrong = (ref + 1 + (ref + 1 == 1)) % self.vocab_size  # never ref, not EOS
    proposal = jnp.where(coins < self.alpha, ref, wrong)
    logits = jax.nn.one_hot(proposal, self.vocab_size) * _PROPOSAL_LOGIT
    # Keep the real draft's work live: XLA must not drop it as dead code.
    logits = logits + 0.0 * inner_logits[..., :1]
    return logits, ControlledState(inner=inner)

  def rollback(self, state: ControlledState, index) -> ControlledState:
    return ControlledState(inner=self.inner.rollback(state.inner, index))

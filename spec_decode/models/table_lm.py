"""A table-driven language model: next-token logits from the previous token.

It implements the language-model protocol with a `[V, V]` table of logits
(`table[prev, next]`), ignoring the encoder input. It serves as an exact
test double (its sequence probabilities are easy to enumerate) and as a
near-free bigram draft.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass(kw_only=True)
class TableState:
  """Attributes: `index [B] int32`, inputs held per row (nothing else)."""

  index: jax.Array


@flax.struct.dataclass(kw_only=True)
class TableLM:
  """Bigram logits `table [V, V]`: row = previous token, column = next."""

  table: jax.Array
  vocabulary: Any = flax.struct.field(pytree_node=False, default=None)

  @property
  def vocab_size(self) -> int:
    return self.table.shape[-1]

  @classmethod
  def random(
    cls, vocab_size: int, seed: int = 0, scale: float = 2.0
  ) -> 'TableLM':
    rng = np.random.default_rng(seed)
    table = rng.normal(0.0, scale, (vocab_size, vocab_size))
    return cls(table=jnp.asarray(table, jnp.float32))

  def init_state(self, encoder_tokens: jax.Array, length: int) -> TableState:
    del length
    return TableState(index=jnp.zeros((encoder_tokens.shape[0],), jnp.int32))

  def score(self, state: TableState, tokens: jax.Array):
    logits = jnp.take(self.table, tokens, axis=0).astype(jnp.float32)
    return logits, state.replace(index=state.index + tokens.shape[1])

  def score_tree(self, state: TableState, tokens: jax.Array, attention):
    """Tree nodes: a node's logits depend on its own token only."""
    del attention
    return jnp.take(self.table, tokens, axis=0).astype(jnp.float32), state

  def commit_tree(
    self, state: TableState, slots: jax.Array, count: jax.Array
  ) -> TableState:
    del slots
    return state.replace(index=state.index + jnp.asarray(count, jnp.int32))

  def rollback(self, state: TableState, index: jax.Array) -> TableState:
    return state.replace(index=jnp.asarray(index, jnp.int32))

  def log_probs(self, encoder_tokens: Any, decoder_tokens: Any) -> jax.Array:
    """`log p(x_t | x_<t)`, `[B, T]`, start id 0 prepended (as Model)."""
    del encoder_tokens
    tokens = jnp.asarray(decoder_tokens, jnp.int32)
    prev = jnp.concatenate([jnp.zeros_like(tokens[:, :1]), tokens[:, :-1]], 1)
    logp = jax.nn.log_softmax(jnp.take(self.table, prev, axis=0), axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]

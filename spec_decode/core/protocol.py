"""The one interface the decoding loops use to talk to target and draft.

An implementation is a JAX pytree (its weights are leaves, its settings static
aux data), so the loops pass it through `jax.jit` as an argument instead of
baking weights into the program as constants. The T5 `Model`, the n-gram
`TableLM` and test doubles implement it.

Position convention: decoder input 0 is the start token (id 0); input `k > 0`
is output token `k`. A state's `index [B]` counts the inputs it holds per row.
"""

from typing import Any
from typing import Protocol

import jax

DecodeState = Any  # A pytree whose leaves have a leading batch axis.


class LanguageModel(Protocol):
  """Scores new decoder tokens per row, at each row's own position."""

  @property
  def vocab_size(self) -> int:
    """Size V of the output distribution."""
    ...

  @property
  def vocabulary(self) -> Any:
    """The token vocabulary (or None); draft and target must agree."""
    ...

  def init_state(self, encoder_tokens: jax.Array, length: int) -> DecodeState:
    """Prepares decoding of `encoder_tokens [B, S]` for `length` inputs.

    The state holds no inputs yet (index 0 for every row).
    """
    ...

  def score(
    self, state: DecodeState, tokens: jax.Array
  ) -> tuple[jax.Array, DecodeState]:
    """Feeds `tokens [B, T]` at each row's index; returns float32 logits.

    Returns:
      `logits [B, T, V]`, where `logits[b, t]` is the next-token distribution
      after input `index[b] + t`, and the state with index advanced by T.
    """
    ...

  def rollback(self, state: DecodeState, index: jax.Array) -> DecodeState:
    """Keeps the first `index[b]` inputs of row `b`; `index`: `[B] int32`."""
    ...

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


class BeamReorder(Protocol):
  """Optional, for beam search: reorders decode-state rows by parent beam.

  A language model without it is reordered by gathering every leaf of its
  state (`beam.speculative.reorder_rows`); one with it can move less (a T5
  `Model` moves its self-attention cache and keeps the encoder's keys and
  values, equal across the beams of a row).
  """

  def reorder_beams(self, state: DecodeState, rows: jax.Array) -> DecodeState:
    """Row i of the result is row `rows[i]` of `state`; `rows`: `[N] int32`.

    `rows[i]` always decodes the same input as row i (beams of one row).
    """
    ...


class InputCheck(Protocol):
  """Optional: a model's own check of encoder inputs, before anything
  compiles (`core.inputs.check_model_tokens`)."""

  def check_encoder_tokens(self, tokens: Any) -> None:
    """Raises ValueError for inputs the model cannot read; `tokens`:
    `[B, S]` int32 host array, ids already in range."""
    ...


class DraftingCopy(Protocol):
  """Optional: a copy of a model that is cheaper to propose with.

  `generate` and `beam_search` propose with `draft.for_drafting()` when the
  draft has it (a T5 `Model` on the CPU kernel drafts with bfloat16-packed
  weights). Only the proposals can change, never what the decode returns:
  the target checks every token.
  """

  def for_drafting(self) -> LanguageModel:
    """The model to propose with (itself when nothing is cheaper)."""
    ...


class TreeLanguageModel(LanguageModel, Protocol):
  """A language model that can also score token trees (`core/tree_shape.py`).

  The tree loop needs it of the target, and `ModelDrafter` of a draft that
  proposes trees. A tree call writes nodes into scratch slots past the
  committed inputs and never moves the index; `commit_tree` then keeps the
  accepted path, so rejected nodes leave no trace.
  """

  def score_tree(
    self, state: DecodeState, tokens: jax.Array, attention: Any
  ) -> tuple[jax.Array, DecodeState]:
    """Scores tree nodes `tokens [B, T]` laid out by `attention`.

    Args:
      state: a decode state holding `index[b]` committed inputs.
      tokens: `[B, T]` the nodes this call feeds.
      attention: `core.tree_shape.TreeAttention` (static): node t goes to
        scratch slot `index + offset + t` at position
        `index + positions[offset + t]`, and attends to every committed
        input and to the scratch slots its mask row allows (its ancestors
        and itself).

    Returns:
      `logits [B, T, V]` float32 (the distribution after each node's path)
      and the state, index unchanged.
    """
    ...

  def commit_tree(
    self, state: DecodeState, slots: jax.Array, count: jax.Array
  ) -> DecodeState:
    """Commits a path: scratch slot `index + slots[b, j]` becomes input
    `index + j` for `j < count[b]`; the index advances by `count [B]`."""
    ...


class ProjectingTreeModel(TreeLanguageModel, Protocol):
  """A tree language model whose vocabulary projection can run apart.

  Speculative beam search scores many tree nodes per call but reads only
  K of them per replayed step; with this it projects just those (on a CPU
  the projection of a 32k vocabulary is most of a small model's work).
  Optional: without it the tree call's logits are used.
  """

  def score_tree_with_features(
    self, state: DecodeState, tokens: jax.Array, attention: Any
  ) -> tuple[jax.Array, jax.Array, DecodeState]:
    """`score_tree`, plus the final hidden states `[B, T, D]` float32."""
    ...

  def project(self, features: jax.Array) -> jax.Array:
    """Logits `[..., V]` float32 of hidden states `[..., D]`: equal to the
    logits the scoring call gave them (up to float rounding)."""
    ...

"""Any language model as a drafter: G autoregressive draft steps.

The draft lags one input behind the target (it never saw the last draft
token of a fully accepted block), so its first call feeds the two newest
inputs at index n - 1; at n = 0 it feeds [start, pad] at 0 and uses the
first position's logits. Its cache then holds inputs 0..n-2 whatever the
previous iteration accepted (no more than that iteration drafted, whose
steps wrote them), so a smaller gamma than before needs nothing more.
The remaining G - 1 steps are T=1 calls in an unrolled `lax.scan` (a
rolled scan adds per-step loop overhead inside the while loop; measured in
`make bench`).

Dynamic gamma (`settings.dynamic_gamma = tau > 0`): a row stops proposing at
the first position i >= 1 whose draft confidence, the largest raw
(temperature-1) draft probability there, is below tau. The confidence
depends only on the row's prefix, never on the verifier's draws, so the
decode stays exact. Steps after every row has stopped are skipped
(`lax.cond`), so a confident-less batch pays fewer draft calls.

Trees (`propose_tree`): the top-k children (greedy) or draws without
replacement (sampling) of every internal node, one model call per depth.
"""

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.core import sampling
from spec_decode.core import tree_draft
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.drafter import DraftContext
from spec_decode.core.drafter import Proposal
from spec_decode.core.drafter import TreeProposal
from spec_decode.core.drafter import accepted_bound
from spec_decode.core.drafter import full_proposal
from spec_decode.core.drafter import is_drafter
from spec_decode.core.protocol import DecodeState
from spec_decode.core.protocol import LanguageModel


@flax.struct.dataclass(kw_only=True)
class ModelDrafter:
  """Wraps a `LanguageModel` (T5 `Model`, `TableLM`, ...) as a drafter."""

  model: LanguageModel
  uses_target_features = False

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def vocabulary(self):
    return getattr(self.model, 'vocabulary', None)

  def init_draft(self, encoder_tokens: jax.Array, length: int) -> DecodeState:
    return self.model.init_state(encoder_tokens, length)

  def propose(
    self,
    state: DecodeState,
    context: DraftContext,
    settings: DecodeSettings,
  ) -> tuple[Proposal, DecodeState]:
    model, sampler, keys = self.model, settings.sampler, context.keys
    n = context.length
    start = jnp.maximum(n - 1, 0)
    first_inputs = jnp.take_along_axis(
      context.inputs, start[:, None] + jnp.arange(2)[None], axis=1
    )
    ds = model.rollback(state, start)
    logits, ds = model.score(ds, first_inputs)
    first_logits = jnp.where((n > 0)[:, None], logits[:, 1], logits[:, 0])
    ds = model.rollback(ds, n + 1)

    def step(ds, prev):
      logits, ds = model.score(ds, prev[:, None])
      return logits[:, 0], ds

    return draft_chain(
      step, ds, first_logits, keys, sampler, settings.dynamic_gamma
    )

  def propose_tree(
    self,
    state: DecodeState,
    context: DraftContext,
    settings: DecodeSettings,
    shape,
  ) -> tuple[TreeProposal, DecodeState]:
    """Draws the tree level by level (`tree_draft.expand`).

    One call feeds the A + 1 inputs ending at the newest, A the most tokens
    the previous iteration accepted (`drafter.accepted_bound`: the tree's
    depth D, or the previous tree's after a switch to a shallower one):
    the draft's cache holds the inputs up to the previous iteration's
    newest, n - A - 1 or later, in order, and tree nodes after them only as
    scratch, which this call overwrites. Then one `score_tree` call per
    depth feeds the nodes that have children, all of a level at once; the
    model must implement `protocol.TreeLanguageModel`.
    """
    model, sampler = self.model, settings.sampler
    behind = accepted_bound(context, shape.depth)
    n = context.length
    rows = jnp.arange(n.shape[0])
    start = jnp.maximum(n - behind, 0)
    window = jnp.take_along_axis(
      context.inputs, start[:, None] + jnp.arange(behind + 1)[None], axis=1
    )
    ds = model.rollback(state, start)
    logits, ds = model.score(ds, window)
    root_logits = logits[rows, n - start]
    ds = model.rollback(ds, n + 1)

    def level_logits(level, tokens, ds):
      return model.score_tree(ds, tokens[:, level.fed], level.attention)

    return tree_draft.expand(
      shape, sampler, root_logits, level_logits, ds, context.keys
    )


# `step(carry, prev [B] int32) -> (logits [B, V] after prev, carry)`.
ChainStep = Callable


def draft_chain(
  step: ChainStep,
  carry: Any,
  first_logits: jax.Array,
  keys: jax.Array,
  sampler: sampling.Sampler,
  tau: float = 0.0,
  vocab: tuple[jax.Array, int] | None = None,
) -> tuple[Proposal, Any]:
  """G autoregressive draws from a drafter's one-token step.

  Shared by the drafters that draft a chain one token per call
  (`ModelDrafter`, the feature and early-exit drafts): token 1 is drawn
  from `first_logits`, token i + 1 from `step` fed token i (an unrolled
  `lax.scan`), each with its own key. With `tau > 0` a row stops at the
  first position i >= 1 whose confidence (largest raw probability of the
  step's logits) is below tau (module docstring).

  Args:
    step: the drafter's next-token logits after one more token.
    carry: what `step` threads (a decode state).
    first_logits: `[B, V]` the logits of token 1.
    keys: `[B, G]` one key per drawn token.
    sampler: the loop's sampler.
    tau: the dynamic-gamma threshold, 0 for off.
    vocab: None, or a draft vocabulary `(ids [N] int32, V)`: the logits
      (`first_logits` and `step`'s) are `[B, N]`, over the distinct ids
      `ids` of the full vocabulary of size V only (`draw_in`).

  Returns:
    The proposal (`num` < G where a row stopped) and the final carry.
  """
  x1, q1 = draw_in(sampler, keys[:, 0], first_logits, vocab)
  step_keys = jnp.swapaxes(keys[:, 1:], 0, 1)
  if tau > 0.0:
    size = first_logits.shape[-1] if vocab is None else vocab[1]
    tokens, qs, num, carry = _dynamic_steps(
      step, sampler, carry, x1, step_keys, tau, size, vocab
    )
  else:
    tokens, qs, carry = _fixed_steps(step, sampler, carry, x1, step_keys, vocab)
    num = None
  q = None if q1 is None else jnp.concatenate([q1[:, None], qs], axis=1)
  tokens = jnp.concatenate([x1[:, None], tokens], axis=1)
  if num is None:
    return full_proposal(tokens, q), carry
  return Proposal(tokens=tokens, q=q, num=num), carry


def draw_in(
  sampler: sampling.Sampler,
  keys: jax.Array,
  logits: jax.Array,
  vocab: tuple[jax.Array, int] | None = None,
):
  """`sampling.draw_tokens`, over a draft vocabulary where `vocab` is one.

  With `vocab = (ids [N], V)` the logits `[B, N]` are those of ids `ids`:
  the draw is index j with probability q_N[j] (the sampler's distribution
  of the N logits), returned as token `ids[j]`, and q is scattered into
  `[B, V]` with zeros elsewhere. The ids being distinct, token `ids[j]` is
  drawn with exactly its probability in the returned q, which is what the
  acceptance test needs: a token outside the vocabulary has q = 0 and
  comes, when it does, from the target's residual max(p - q, 0). Drawing
  over N ids skips the V-wide softmax and cumulative sum per draft token.
  """
  x, q = sampling.draw_tokens(sampler, keys, logits)
  if vocab is None:
    return x, q
  ids, size = vocab
  x = jnp.take(ids, x)
  if q is not None:
    q = jnp.zeros(q.shape[:-1] + (size,), q.dtype).at[..., ids].set(q)
  return x, q


def _fixed_steps(step, sampler, carry, x1, step_keys, vocab):
  def body(c, key_i):
    carry_i, prev = c
    lg, carry_i = step(carry_i, prev)
    x, q = draw_in(sampler, key_i, lg, vocab)
    return (carry_i, x), (x, q)

  (carry, _), (xs, qs) = lax.scan(body, (carry, x1), step_keys, unroll=True)
  qs = None if qs is None else jnp.swapaxes(qs, 0, 1)
  return jnp.swapaxes(xs, 0, 1), qs, carry


def _confidence(logits: jax.Array) -> jax.Array:
  """Largest raw probability `[B]` of `logits [B, V]`."""
  return jnp.exp(jnp.max(jax.nn.log_softmax(logits, axis=-1), axis=-1))


def _dynamic_steps(step, sampler, carry, x1, step_keys, tau, vocab_size, vocab):
  batch = x1.shape[0]

  def body(c, key_i):
    carry_i, prev, going = c

    def run(carry_i):
      lg, carry_i = step(carry_i, prev)
      x, q = draw_in(sampler, key_i, lg, vocab)
      return carry_i, x, q, going & (_confidence(lg) >= tau)

    def skip(carry_i):
      x = jnp.zeros((batch,), jnp.int32)
      q = None
      if not sampler.is_greedy:
        q = jnp.zeros((batch, vocab_size), jnp.float32)
      return carry_i, x, q, jnp.zeros_like(going)

    carry_i, x, q, going = lax.cond(jnp.any(going), run, skip, carry_i)
    return (carry_i, x, going), (x, q, going)

  going = jnp.ones((batch,), bool)
  (carry, _, _), (xs, qs, kept) = lax.scan(
    body, (carry, x1, going), step_keys, unroll=True
  )
  num = 1 + jnp.sum(kept.astype(jnp.int32), axis=0)
  qs = None if qs is None else jnp.swapaxes(qs, 0, 1)
  return jnp.swapaxes(xs, 0, 1), qs, num, carry


def drafting_copy(draft, target):
  """`draft.for_drafting()` where the draft offers a cheaper copy
  (`protocol.DraftingCopy`), else `draft`. The target drafting for itself
  stays itself (it proposes the target's own tokens); None stays None."""
  for_drafting = getattr(draft, 'for_drafting', None)
  if for_drafting is None or draft is target:
    return draft
  return for_drafting()


def as_drafter(draft):
  """`draft` itself if it implements the drafter protocol, else wrapped."""
  if is_drafter(draft):
    return draft
  return ModelDrafter(model=draft)

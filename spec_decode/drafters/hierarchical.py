"""Hierarchical drafting: a draft model sped up by a draft of its own.

The paper's proposed extension "accelerate the draft with an even smaller
draft": `Hierarchical(draft_model, sub_draft, gamma=k)` is a drafter whose G
tokens per outer iteration are `draft_model`'s own samples, produced by
running Algorithm 1 one level down. Each inner iteration lets `sub_draft`
propose k tokens, scores them with `draft_model` in ONE call of k + 1 inputs,
verifies them with `rejection.ExactVerifier` (exact: no lenience inside),
and appends the accepted tokens and the next one, until every row has at
least G tokens (a `lax.while_loop` of at most G iterations, fixed shapes).
The proposal's `q` is `draft_model`'s distribution (after the loop's sampler)
at every proposed position, so the outer verification stays exact, and the
tokens are distributed exactly as `draft_model`'s autoregressive samples:
exact at both levels.

State. The draft model lags one input, as `ModelDrafter` does: the first
inner call of a proposal at outer length n feeds inputs n - 1 and n (at
n = 0 the start id alone) before the k sub-draft tokens, so its state only
needs inputs 0..n-2, which it holds whatever the outer loop accepted (its
inner loop drafted at least as many; a smaller outer gamma than before,
`DraftContext.max_accepted`, needs nothing more). The
sub-draft sees the inner sequence as its context (outer inputs, then the
drafted tokens) and is asked at each inner length, so its rollbacks work as
they do in the outer loop. One case falls outside that contract: when the
inner loop stopped at exactly G tokens and the outer loop accepted all G,
the next outer length is one past anything the sub-draft was asked about;
the sub-draft then first proposes once at length n - 1 (its proposal is
discarded; a `lax.cond` skips this when no row needs it).

Randomness. Inner draws use `fold_in(fold_in(key, j), purpose)` of the
outer key of position n + 1 (`context.keys[:, 0]`), where j >= 1 is the
inner position relative to n and the purposes are the outer loop's (0 sub
sample and bonus, 1 accept, 2 residual). No inner draw uses an outer draw's
key, every outer iteration draws afresh, and a row's tokens depend only on
its own keys.

Statistics. The drafter state keeps `InnerCounters` per row (inner
acceptance, draft-model calls, tokens per call), counted once per outer
length (repeated proposals for finished rows are not counted). The decoding
loop does not return drafter states, so `stats_callback`, when set, gets
each proposal's increments on the host (`jax.debug.callback`); `summarize`
turns summed counters into rates.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spec_decode.core import drafter
from spec_decode.core import model_drafter
from spec_decode.core import rejection
from spec_decode.core import sampling
from spec_decode.core import verified_block
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.protocol import DecodeState
from spec_decode.core.protocol import LanguageModel


@flax.struct.dataclass(kw_only=True)
class InnerCounters:
  """Inner-level statistics per row, each `[B]`.

  Counted only for proposals at a new outer length (a finished row, asked
  again at the same length, adds nothing).

  Attributes:
    proposals: `[B] int32` proposals counted.
    calls: `[B] int32` draft-model calls those proposals made (inner
      iterations of the batch, one call each).
    iterations: `[B] int32` inner iterations in which the row still needed
      tokens.
    tested: `[B] int32` sub-draft tokens tested (proposed, prefix accepted).
    accepted: `[B] int32` sub-draft tokens accepted.
    beta_sum: `[B] float32` sum of beta = sum_x min(p, q) over tested tokens.
    tokens: `[B] int32` tokens the inner iterations emitted (accepted sub
      tokens plus the residual or bonus token; may exceed G per proposal).
  """

  proposals: jax.Array
  calls: jax.Array
  iterations: jax.Array
  tested: jax.Array
  accepted: jax.Array
  beta_sum: jax.Array
  tokens: jax.Array

  @classmethod
  def zeros(cls, batch: int) -> 'InnerCounters':
    i32 = jnp.zeros((batch,), jnp.int32)
    return cls(
      proposals=i32,
      calls=i32,
      iterations=i32,
      tested=i32,
      accepted=i32,
      beta_sum=jnp.zeros((batch,), jnp.float32),
      tokens=i32,
    )


def summarize(counters: InnerCounters) -> dict[str, float]:
  """Rates from (summed) counters, over all rows.

  Returns:
    `alpha` (mean beta over tested sub-draft tokens), `acceptance`
    (accepted / tested), `tokens_per_iteration` (tokens a row gained per
    inner iteration), `calls_per_proposal` (draft-model calls per outer
    iteration), and the raw totals.
  """
  c = jax.tree.map(lambda x: float(np.sum(np.asarray(x))), counters)
  return {
    'alpha': c.beta_sum / max(c.tested, 1.0),
    'acceptance': c.accepted / max(c.tested, 1.0),
    'tokens_per_iteration': c.tokens / max(c.iterations, 1.0),
    'calls_per_proposal': c.calls / max(c.proposals, 1.0),
    **dataclasses.asdict(c),
  }


@flax.struct.dataclass(kw_only=True)
class HierarchicalState:
  """Drafter state.

  Attributes:
    draft: the draft model's decode state.
    sub: the sub-draft's drafter state.
    length: `[B] int32` outer length n of the last proposal (-1 before).
    reached: `[B] int32` n + tokens drafted by the last proposal (>= n + G).
    sub_length: `[B] int32` context length the sub-draft last proposed at.
    counters: `InnerCounters`, cumulative.
  """

  draft: DecodeState
  sub: drafter.DraftState
  length: jax.Array
  reached: jax.Array
  sub_length: jax.Array
  counters: InnerCounters


@flax.struct.dataclass(kw_only=True)
class _Inner:
  """Carry of the inner loop (relative positions count from n + 1).

  Attributes:
    draft: draft-model state, holding inputs 0..n+m-1 between iterations.
    sub: sub-draft state.
    inputs: `[B, L + X] int32` outer inputs, drafted tokens from n + 1.
    q: `[B, G + k, V] float32` draft-model distributions of the drafted
      tokens (None when greedy).
    drafted: `[B] int32` m, tokens drafted so far.
    sub_length: `[B] int32` the sub-draft's last context length.
    counters: `InnerCounters`.
    step: `[] int32` inner iterations so far.
  """

  draft: DecodeState
  sub: drafter.DraftState
  inputs: jax.Array
  q: jax.Array | None
  drafted: jax.Array
  sub_length: jax.Array
  counters: InnerCounters
  step: jax.Array


def _write(buf: jax.Array, block: jax.Array, start: jax.Array, kept):
  """Writes the first `kept[b]` entries of `block [B, W, ...]` at `start`.

  The rest of the window keeps its old content (so a clamped window of a
  row that keeps nothing is left as it was).
  """
  width = block.shape[1]
  old = jax.vmap(lambda b, s: lax.dynamic_slice_in_dim(b, s, width))(buf, start)
  mask = jnp.arange(width)[None] < kept[:, None]
  mask = mask.reshape(mask.shape + (1,) * (block.ndim - 2))
  new = jnp.where(mask, block.astype(buf.dtype), old)
  return jax.vmap(
    lambda b, n, s: lax.dynamic_update_slice_in_dim(b, n, s, axis=0)
  )(buf, new, start)


def _take(inputs: jax.Array, index: jax.Array) -> jax.Array:
  """`inputs[b, index[b]]` as `[B, 1]`."""
  return jnp.take_along_axis(inputs, index[:, None], axis=1)


def _inner_settings(settings: DecodeSettings, gamma: int) -> DecodeSettings:
  """The loop's settings with the inner gamma as width and gamma (and no
  dynamic gamma): the sub-draft proposes k tokens per inner iteration."""
  return dataclasses.replace(
    settings, width=gamma, gamma=gamma, dynamic_gamma=0.0
  )


@flax.struct.dataclass
class Hierarchical:
  """A draft model drafting through Algorithm 1 with its own sub-draft.

  Attributes:
    draft_model: the `LanguageModel` whose samples are proposed (T5
      `Model`, `TableLM`, ...).
    sub_draft: drafts for `draft_model`: a language model (wrapped in
      `ModelDrafter`) or a drafter (n-gram, another `Hierarchical`, ...)
      that, like `ModelDrafter`, may be asked again at a shorter length.
      Drafters reading target features are not supported.
    gamma: k, sub-draft tokens per inner iteration (static).
    verifier: the inner verifier (static); `ExactVerifier()` is the exact
      one the proposal's `q` relies on. Tests pass broken ones.
    stats_callback: None, or a host function receiving each proposal's
      `InnerCounters` increments (numpy; static).
  """

  draft_model: LanguageModel
  sub_draft: Any
  gamma: int = flax.struct.field(pytree_node=False, default=2)
  verifier: Any = flax.struct.field(
    pytree_node=False, default=rejection.ExactVerifier()
  )
  stats_callback: Callable[[InnerCounters], Any] | None = flax.struct.field(
    pytree_node=False, default=None
  )

  uses_target_features = False

  def __post_init__(self):
    if (
      isinstance(self.gamma, bool)
      or not isinstance(self.gamma, (int, np.integer))
      or self.gamma < 1
    ):
      raise ValueError(f'gamma must be an int >= 1, got {self.gamma!r}')

  @property
  def vocab_size(self) -> int:
    return self.draft_model.vocab_size

  @property
  def vocabulary(self):
    return getattr(self.draft_model, 'vocabulary', None)

  @property
  def _sub(self):
    return model_drafter.as_drafter(self.sub_draft)

  def init_draft(
    self, encoder_tokens: jax.Array, length: int
  ) -> HierarchicalState:
    sub = self._sub
    if getattr(sub, 'uses_target_features', False):
      raise ValueError('a sub-draft reading target features is not supported')
    if sub.vocab_size != self.vocab_size:
      raise ValueError(
        f'sub-draft and draft model vocabularies differ: sub-draft has '
        f'{sub.vocab_size} ids, draft model {self.vocab_size}'
      )
    batch = encoder_tokens.shape[0]
    # Inner calls reach past the outer buffer: up to G + 2k inputs after n.
    inner_length = length + 2 * self.gamma + 2
    return HierarchicalState(
      draft=self.draft_model.init_state(encoder_tokens, inner_length),
      sub=sub.init_draft(encoder_tokens, inner_length),
      length=jnp.full((batch,), -1, jnp.int32),
      reached=jnp.zeros((batch,), jnp.int32),
      sub_length=jnp.zeros((batch,), jnp.int32),
      counters=InnerCounters.zeros(batch),
    )

  def propose(
    self,
    state: HierarchicalState,
    context: drafter.DraftContext,
    settings: DecodeSettings,
  ) -> tuple[drafter.Proposal, HierarchicalState]:
    """Proposes G = `settings.gamma` samples of the draft model per row.

    Returns:
      `Proposal` with `tokens [B, G]`, `q [B, G, V]` (the draft model's
      distributions under `settings.sampler`; None when greedy) and all G
      proposed, and the new state.
    """
    g, k = settings.gamma, self.gamma
    sampler = settings.sampler
    sub = self._sub
    n = context.length
    batch = n.shape[0]
    inner_settings = _inner_settings(settings, k)
    base_keys = context.keys[:, 0]
    fresh = n != state.length
    inputs = jnp.pad(context.inputs, ((0, 0), (0, g + 2 * k + 4)))

    def sub_context(inputs, length):
      rel = (length - n)[:, None] + 1 + jnp.arange(k)[None]
      return drafter.DraftContext(
        inputs=inputs,
        length=length,
        encoder_tokens=context.encoder_tokens,
        keys=sampling.position_keys(base_keys, rel, verified_block.SAMPLE),
      )

    # The sub-draft was never asked at n - 1 (see the module docstring).
    behind = (n - 1 == state.reached) & (state.sub_length < state.reached)

    def catch_up(sub_state):
      ctx = sub_context(inputs, jnp.maximum(n - 1, 0))
      return sub.propose(sub_state, ctx, inner_settings)[1]

    sub_state = lax.cond(jnp.any(behind), catch_up, lambda s: s, state.sub)
    carry = _Inner(
      draft=state.draft,
      sub=sub_state,
      inputs=inputs,
      q=None
      if sampler.is_greedy
      else jnp.zeros((batch, g + k, self.vocab_size), jnp.float32),
      drafted=jnp.zeros((batch,), jnp.int32),
      sub_length=state.sub_length,
      counters=state.counters,
      step=jnp.zeros((), jnp.int32),
    )

    def iteration(c: _Inner, first: bool) -> _Inner:
      return self._iteration(
        c, first, n, fresh, base_keys, sub_context, settings, inner_settings
      )

    carry = iteration(carry, True)
    carry = lax.while_loop(
      lambda c: jnp.any(c.drafted < g) & (c.step < g),
      lambda c: iteration(c, False),
      carry,
    )
    tokens = jax.vmap(lambda b, s: lax.dynamic_slice_in_dim(b, s, g))(
      carry.inputs, n + 1
    )
    q = None if carry.q is None else carry.q[:, :g]
    new_state = HierarchicalState(
      draft=carry.draft,
      sub=carry.sub,
      length=n,
      reached=n + carry.drafted,
      sub_length=carry.sub_length,
      counters=carry.counters,
    )
    if self.stats_callback is not None:
      _check_host_backend()
      delta = jax.tree.map(jnp.subtract, carry.counters, state.counters)
      jax.debug.callback(self.stats_callback, delta)
    return drafter.full_proposal(tokens, q), new_state

  def _iteration(
    self, c, first, n, fresh, base_keys, sub_context, settings, inner_settings
  ) -> _Inner:
    """One inner step: k sub-draft tokens, one draft-model call, verify."""
    g, k = settings.gamma, self.gamma
    model, sampler = self.draft_model, settings.sampler
    m = c.drafted
    length = n + m
    active = m < g
    proposal, sub_state = self._sub.propose(
      c.sub, sub_context(c.inputs, length), inner_settings
    )
    sub_tokens = proposal.tokens
    newest = _take(c.inputs, length)
    if first:
      # Lag one input (m = 0): feed n - 1 and n, or the start id at n = 0.
      start = jnp.maximum(n - 1, 0)
      lagged = (n > 0)[:, None]
      feed = jnp.where(
        lagged,
        jnp.concatenate([_take(c.inputs, start), newest, sub_tokens], 1),
        jnp.concatenate([newest, sub_tokens, jnp.zeros_like(newest)], 1),
      )
      logits, ds = model.score(model.rollback(c.draft, start), feed)
      logits = jnp.where(lagged[..., None], logits[:, 1:], logits[:, :-1])
    else:
      feed = jnp.concatenate([newest, sub_tokens], 1)
      logits, ds = model.score(model.rollback(c.draft, length), feed)
    rel = m[:, None] + 1 + jnp.arange(k + 1)[None]
    result, p = verified_block.verify_block(
      self.verifier, sampler, logits, proposal, base_keys, rel
    )
    a = result.accepted
    kept = jnp.where(active, a + 1, 0)
    offsets = jnp.arange(k + 1)[None]
    block = jnp.where(
      offsets < a[:, None],
      jnp.concatenate([sub_tokens, jnp.zeros_like(newest)], 1),
      result.next_token[:, None],
    )
    inputs = _write(c.inputs, block, length + 1, kept)
    q = None if c.q is None else _write(c.q, p, m, kept)
    drafted = m + kept
    ds = model.rollback(ds, n + drafted)

    num = proposal.num
    if num is None:
      num = jnp.full((n.shape[0],), k, jnp.int32)
    live = active & fresh
    pos = jnp.arange(k)[None]
    tested = (pos <= a[:, None]) & (pos < num[:, None]) & live[:, None]
    accepted = (pos < a[:, None]) & live[:, None]
    old = c.counters
    counters = old.replace(
      proposals=old.proposals + (fresh & first),
      calls=old.calls + fresh,
      iterations=old.iterations + live,
      tested=old.tested + jnp.sum(tested, 1),
      accepted=old.accepted + jnp.sum(accepted, 1),
      beta_sum=old.beta_sum + jnp.sum(jnp.where(tested, result.beta, 0.0), 1),
      tokens=old.tokens + jnp.where(live, a + 1, 0),
    )
    return _Inner(
      draft=ds,
      sub=sub_state,
      inputs=inputs,
      q=q,
      drafted=drafted,
      sub_length=length,
      counters=counters,
      step=c.step + 1,
    )


def _check_host_backend() -> None:
  """`jax.debug.callback` places its inputs on a CPU device: with
  `JAX_PLATFORMS=cuda` (or tpu) alone there is none, and the decode would
  fail only when the callback first runs (seen on an H100)."""
  try:
    jax.devices('cpu')
  except RuntimeError as e:
    raise ValueError(
      'HierarchicalDrafter(stats_callback=...) needs a CPU backend for '
      "jax.debug.callback: list it, e.g. JAX_PLATFORMS='cuda,cpu'"
    ) from e

"""gamma='auto': each iteration at the gamma the in-loop policy chose.

One compiled program: the policy (`policy.finish_time.choose`) picks the
next iteration's gamma in {0, ..., G} after each iteration, from the
counters and run-time `PolicyInputs` (the measured seconds per iteration).
Gamma 0 is a plain target step; a language-model draft that skipped such
steps is caught up (its missing inputs fed in chunks) before it drafts
again. The policy reads counts of accepted draft tokens, never the draws
themselves, so the distribution stays the target's.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.chain import steps
from spec_decode.core import drafter
from spec_decode.core import loop_state
from spec_decode.core.counters import SpecCounters
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.protocol import LanguageModel
from spec_decode.core.provenance import Record
from spec_decode.policy import finish_time

# Inputs fed per call when a language-model draft catches up.
_CATCH_UP_CHUNK = 8


def auto_decode(
  target: LanguageModel,
  draft: Any,
  encoder_tokens: jax.Array,
  row_keys: jax.Array,
  settings: DecodeSettings,
  policy: finish_time.PolicyInputs | None,
) -> tuple[jax.Array, jax.Array, SpecCounters, Record | None]:
  """Speculative decoding with the gamma of each iteration chosen in-loop.

  Each iteration runs at the gamma in {0, ..., G} that the policy chose
  after the previous one, in the inner loop of that gamma.

  Args:
    target: the target language model.
    draft: a drafter (`core.drafter.Drafter`) or any language model.
    encoder_tokens: `[B, S] int32`.
    row_keys: `[B]` PRNG keys.
    settings: static settings (`width` is G, the largest gamma).
    policy: the policy's run-time inputs.

  Returns:
    tokens `[B, M]`, lengths `[B]`, `SpecCounters` (with
    `gamma_histogram`) and the `core.provenance.Record` (None with
    `settings.provenance` off).
  """
  if policy is None:
    raise ValueError('a gamma policy needs its PolicyInputs')
  gmax = settings.width
  it = steps.Iteration.create(target, draft, encoder_tokens, row_keys, settings)
  # A language-model draft's cache must hold every earlier input; after
  # plain (gamma 0) steps it is caught up before drafting.
  lm_draft = None if drafter.is_drafter(draft) else draft

  def drafting(state: loop_state.AutoState, g: int) -> loop_state.AutoState:
    if lm_draft is None:
      return it.draft(state, g)
    state = state.replace(draft=_catch_up(lm_draft, state, gmax))
    new = it.draft(state, g)
    return new.replace(draft_synced=new.length - 1)

  def choice(state: loop_state.AutoState) -> jax.Array:
    return finish_time.choose(
      state.counters.beta_sum,
      jnp.sum(state.counters.position_tries, axis=1),
      ~state.done,
      settings.max_decode_len - state.length,
      policy,
      state.step,
      state.policy_idle,
    )

  # Gamma 0 keeps a stateful drafter's state stale: it is never a candidate
  # there (its seconds are inf), and its branch drafts 1.
  zero = (
    it.plain
    if drafter.zero_gamma_ok(draft)
    else functools.partial(drafting, g=1)
  )
  branches = [zero] + [
    functools.partial(drafting, g=k) for k in range(1, gmax + 1)
  ]

  def policy_step(state: loop_state.AutoState, g: int) -> loop_state.AutoState:
    """One iteration at gamma `g`, then the policy's next choice."""
    active = ~state.done
    new = branches[g](state)
    counters = new.counters.replace(
      gamma_histogram=new.counters.gamma_histogram
      + jax.nn.one_hot(g, gmax + 1, dtype=jnp.int32)[None]
      * active[:, None].astype(jnp.int32)
    )
    idle = (
      state.policy_idle + 1 if g == 0 else jnp.zeros_like(state.policy_idle)
    )
    new = new.replace(counters=counters, policy_idle=idle)
    return new.replace(policy_gamma=choice(new))

  def not_finished(state: loop_state.AutoState) -> jax.Array:
    return loop_state.not_finished(state, settings, policy.max_iterations)

  def policy_pass(state: loop_state.AutoState) -> loop_state.AutoState:
    # One inner loop per gamma, each running while the policy keeps
    # choosing it, instead of a `lax.switch` over the gammas: a branch of a
    # conditional cannot update the caches it is given in place (XLA copies
    # every cache buffer a branch writes, each iteration), a loop body can.
    # The inner loop of the gamma chosen on entry runs at least once.
    for g in range(gmax + 1):
      state = lax.while_loop(
        lambda s, g=g: not_finished(s) & (s.policy_gamma == g),
        functools.partial(policy_step, g=g),
        state,
      )
    return state

  batch = encoder_tokens.shape[0]
  state = it.init(
    with_gammas=True,
    state_type=loop_state.AutoState,
    draft_synced=(None if lm_draft is None else jnp.zeros((batch,), jnp.int32)),
    policy_idle=jnp.zeros((), jnp.int32),
    policy_gamma=jnp.zeros((), jnp.int32),
  )
  state = state.replace(policy_gamma=choice(state))
  state = lax.while_loop(not_finished, policy_pass, state)
  tokens, lengths = loop_state.outputs(state, settings)
  return tokens, lengths, state.counters, state.provenance


def _catch_up(model, state: loop_state.AutoState, gmax: int):
  """`model`'s decode state fed the inputs it missed during plain steps.

  `state.draft_synced [B]` counts the leading inputs the draft's cache
  holds; drafting at length n needs n - 1 of them (the drafter feeds inputs
  n - 1 and n itself). Chunks of K inputs are scored until every active row
  has them; K <= G + 2 keeps every write inside the buffer.
  """
  k = min(_CATCH_UP_CHUNK, gmax + 2)
  width = state.inputs.shape[1]
  need = jnp.where(
    state.done, state.draft_synced, jnp.maximum(state.length - 1, 0)
  )

  def behind(carry):
    return jnp.any(carry[1] < need)

  def feed(carry):
    ds, synced = carry
    idx = jnp.minimum(synced, need)
    cols = jnp.minimum(idx[:, None] + jnp.arange(k)[None], width - 1)
    _, ds = model.score(
      model.rollback(ds, idx), loop_state.gather(state.inputs, cols)
    )
    return ds, jnp.minimum(idx + k, need)

  ds, _ = lax.while_loop(behind, feed, (state.draft, state.draft_synced))
  return ds

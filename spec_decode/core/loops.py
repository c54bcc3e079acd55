"""Plain and speculative decoding, each one jitted `lax.while_loop`.

Both loops talk to models only through the language-model protocol
(`spec_decode.core.protocol`). Shapes: `B` rows, `G` = gamma, `M` =
max_decode_len, `V` vocabulary.

Token buffer: `inputs [B, M + G + 2]` holds decoder inputs; `inputs[:, 0]` is
the start id 0 and `inputs[:, k]` is output token k (1-based). A row with `n`
output tokens has its target state at index `n`: it holds inputs `0..n-1`,
and input `n` (the newest token) is fed next.

Randomness: every row has its own key; the draws for output token `k` use
`fold_in(fold_in(row_key, k), purpose)` (`verify_block`), so a row's tokens
depend only on its seed, never on its batch mates, and a draft equal to the
target draws exactly the tokens plain sampling draws.
"""

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.core import drafter
from spec_decode.core import gamma_policy
from spec_decode.core import model_drafter
from spec_decode.core import sampling
from spec_decode.core import verify_block
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.protocol import LanguageModel


@flax.struct.dataclass(kw_only=True)
class SpecCounters:
  """Per-row statistics of a speculative decode (all `[B, ...]`).

  Attributes:
    iterations: `[B]` iterations (= target calls) while the row was active.
    accepted_histogram: `[B, G + 1]` iterations that accepted 0..G tokens.
    position_tries: `[B, G]` iterations whose draft token i was tested (its
      prefix accepted).
    position_accepts: `[B, G]` iterations whose draft token i was accepted.
    beta_sum: `[B]` sum of beta over tested positions.
    proposed: `[B]` draft tokens proposed while the row was active (G per
      iteration unless the drafter proposes fewer).
    gamma_histogram: `[B, G + 1]` iterations run at each gamma while the row
      was active (gamma='auto'; None with a fixed gamma).
  """

  iterations: jax.Array
  accepted_histogram: jax.Array
  position_tries: jax.Array
  position_accepts: jax.Array
  beta_sum: jax.Array
  proposed: jax.Array
  gamma_histogram: jax.Array | None = None

  @classmethod
  def zeros(
    cls, batch: int, gamma: int, with_gammas: bool = False
  ) -> 'SpecCounters':
    return cls(
      iterations=jnp.zeros((batch,), jnp.int32),
      accepted_histogram=jnp.zeros((batch, gamma + 1), jnp.int32),
      position_tries=jnp.zeros((batch, gamma), jnp.int32),
      position_accepts=jnp.zeros((batch, gamma), jnp.int32),
      beta_sum=jnp.zeros((batch,), jnp.float32),
      proposed=jnp.zeros((batch,), jnp.int32),
      gamma_histogram=(
        jnp.zeros((batch, gamma + 1), jnp.int32) if with_gammas else None
      ),
    )


@flax.struct.dataclass(kw_only=True)
class LoopState:
  """Carry of both while loops.

  Attributes:
    inputs: `[B, M + G + 2] int32` decoder inputs (see module docstring).
    length: `[B] int32` output tokens so far (EOS included).
    done: `[B] bool` EOS emitted or M reached.
    step: `[] int32` loop iterations so far.
    target: the target's decode state.
    draft: the draft's decode state (None for plain decoding).
    counters: speculative statistics (None for plain decoding).
    features: `[B, D] float32` target hidden state that predicted the newest
      token, for drafters that use target features (else None).
    draft_synced: `[B] int32` leading inputs a language-model draft's cache
      holds (gamma='auto', where plain steps skip the draft; else None).
    policy_idle: `[] int32` consecutive gamma-0 iterations just before this
      one (gamma='auto': the policy's probe schedule; else None).
    policy_gamma: `[] int32` the gamma the policy chose for the next
      iteration (gamma='auto'; else None).
  """

  inputs: jax.Array
  length: jax.Array
  done: jax.Array
  step: jax.Array
  target: object
  draft: object = None
  counters: SpecCounters | None = None
  features: jax.Array | None = None
  draft_synced: jax.Array | None = None
  policy_idle: jax.Array | None = None
  policy_gamma: jax.Array | None = None


def _gather(inputs: jax.Array, positions: jax.Array) -> jax.Array:
  return jnp.take_along_axis(inputs, positions, axis=1)


def commit_block(
  state: Any,
  block: jax.Array,
  num_new: jax.Array,
  settings: DecodeSettings,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Appends up to `num_new [B]` tokens of `block [B, W]` per active row.

  `state` is any loop state with `inputs [B, M+1]`, `length [B]` and
  `done [B]` (the chain and the tree loops share this). Tokens after an EOS
  and past M are dropped. Returns the new inputs, lengths, done flags and
  the number of tokens actually kept `[B]`.
  """
  width = block.shape[1]
  offsets = jnp.arange(width)[None, :]
  is_eos = (block == settings.eos_id) & (offsets < num_new[:, None])
  first_eos = jnp.where(
    jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, width
  )
  room = settings.max_decode_len - state.length
  kept = jnp.minimum(jnp.minimum(num_new, first_eos), room)
  kept = jnp.where(state.done, 0, kept)
  start = state.length + 1
  old = jax.vmap(lambda buf, s: lax.dynamic_slice_in_dim(buf, s, width))(
    state.inputs, start
  )
  block = jnp.where(offsets < kept[:, None], block, old)
  inputs = jax.vmap(
    lambda buf, blk, s: lax.dynamic_update_slice_in_dim(buf, blk, s, axis=0)
  )(state.inputs, block, start)
  length = state.length + kept
  hit_eos = jnp.any(
    (block == settings.eos_id) & (offsets < kept[:, None]), axis=1
  )
  done = state.done | hit_eos | (length >= settings.max_decode_len)
  return inputs, length, done, kept


def _init_loop(
  target: LanguageModel, encoder_tokens: jax.Array, settings: DecodeSettings
) -> LoopState:
  batch = encoder_tokens.shape[0]
  return LoopState(
    inputs=jnp.zeros((batch, settings.buffer_len), jnp.int32),
    length=jnp.zeros((batch,), jnp.int32),
    done=jnp.zeros((batch,), bool),
    step=jnp.zeros((), jnp.int32),
    target=target.init_state(encoder_tokens, settings.buffer_len),
  )


def _not_finished(state: LoopState, settings: DecodeSettings) -> jax.Array:
  return jnp.any(~state.done) & (state.step < settings.max_decode_len)


def _outputs(state: LoopState, settings: DecodeSettings):
  tokens = state.inputs[:, 1 : settings.max_decode_len + 1]
  return tokens, state.length


def plain_decode(
  target: LanguageModel,
  encoder_tokens: jax.Array,
  row_keys: jax.Array,
  settings: DecodeSettings,
):
  """Autoregressive sampling from the target alone (T5X temperature_sample).

  Returns:
    tokens `[B, M]` (pad after EOS) and lengths `[B]`.
  """
  sampler = settings.sampler

  def body(state: LoopState) -> LoopState:
    n = state.length
    last = _gather(state.inputs, n[:, None])
    tgt = target.rollback(state.target, n)
    logits, tgt = target.score(tgt, last)
    keys = sampling.position_keys(
      row_keys, (n + 1)[:, None], verify_block.SAMPLE
    )[:, 0]
    token, _ = sampling.draw_tokens(sampler, keys, logits[:, 0])
    inputs, length, done, _ = commit_block(
      state, token[:, None], jnp.ones_like(n), settings
    )
    return state.replace(
      inputs=inputs, length=length, done=done, step=state.step + 1, target=tgt
    )

  state = _init_loop(target, encoder_tokens, settings)
  state = lax.while_loop(lambda s: _not_finished(s, settings), body, state)
  return _outputs(state, settings)


def _score_target(target, state, tokens, with_features: bool):
  """Target logits `[B, T, V]`, features `[B, T, D]` (or None), state."""
  if with_features:
    return target.score_with_features(state, tokens)
  logits, state = target.score(state, tokens)
  return logits, None, state


def speculative_decode(
  target: LanguageModel,
  draft,
  encoder_tokens: jax.Array,
  row_keys: jax.Array,
  settings: DecodeSettings,
  policy: gamma_policy.PolicyInputs | None = None,
):
  """Algorithm 1 in a loop: a draft block, one target call over G+1 inputs.

  With `settings.gamma_policy`, each iteration runs at the gamma in
  {0, ..., G} that the policy chose after the previous one
  (`gamma_policy.choose`, from `policy`), in the inner loop of that gamma:
  one compiled program, gamma chosen at run time. Gamma 0 is
  a plain target step; a language-model draft that skipped such steps is
  caught up (its missing inputs fed in chunks) before it drafts again.

  Args:
    target: the target language model.
    draft: a drafter (`spec_decode.core.drafter.Drafter`) or any language
      model (drafting G autoregressive steps).
    encoder_tokens: `[B, S] int32`.
    row_keys: `[B]` PRNG keys.
    settings: static settings (`gamma` is G, the largest gamma).
    policy: the policy's run-time inputs (needed with `gamma_policy`).

  Returns:
    tokens `[B, M]`, lengths `[B]`, and `SpecCounters`.
  """
  gmax = settings.gamma
  batch = encoder_tokens.shape[0]
  proposer = model_drafter.as_drafter(draft)
  with_features = bool(getattr(proposer, 'uses_target_features', False))
  auto = settings.gamma_policy
  if auto and policy is None:
    raise ValueError('a gamma policy needs its PolicyInputs')
  # A language-model draft's cache must hold every earlier input; after
  # plain (gamma 0) steps it is caught up before drafting.
  lm_draft = None if drafter.is_drafter(draft) else draft

  def draft_step(state: LoopState, g: int) -> LoopState:
    n = state.length
    active = ~state.done
    positions = n[:, None] + 1 + jnp.arange(g + 1)[None]
    context = drafter.DraftContext(
      inputs=state.inputs,
      length=n,
      encoder_tokens=encoder_tokens,
      keys=sampling.position_keys(
        row_keys, positions[:, :g], verify_block.SAMPLE
      ),
      target_features=state.features,
    )
    ds = state.draft
    if auto and lm_draft is not None:
      ds = _catch_up(lm_draft, ds, state, gmax)
    proposal, ds = proposer.propose(
      ds, context, dataclasses.replace(settings, gamma=g)
    )
    draft_tokens = proposal.tokens
    newest = _gather(state.inputs, n[:, None])
    tgt = target.rollback(state.target, n)
    logits, features, tgt = _score_target(
      target,
      tgt,
      jnp.concatenate([newest, draft_tokens], axis=1),
      with_features,
    )
    result, _ = verify_block.verify_block(
      settings.verifier, settings.sampler, logits, proposal, row_keys, positions
    )
    a = result.accepted
    offsets = jnp.arange(g + 1)[None]
    block = jnp.where(
      offsets < a[:, None],
      jnp.concatenate([draft_tokens, jnp.zeros_like(newest)], axis=1),
      result.next_token[:, None],
    )
    inputs, length, done, kept = commit_block(state, block, a + 1, settings)
    num = proposal.num
    if num is None:
      num = jnp.full((batch,), g, jnp.int32)

    c = state.counters
    # Position i (0-based) was tested when it was proposed, its prefix was
    # accepted and it lies inside what the row kept (nothing after EOS or
    # past M counts).
    tested = (offsets[:, :g] <= a[:, None]) & (offsets[:, :g] < kept[:, None])
    tested &= active[:, None] & (offsets[:, :g] < num[:, None])
    accepted = tested & (offsets[:, :g] < a[:, None])
    act = active.astype(jnp.int32)

    def pad(x):  # [B, g] -> [B, G]
      return jnp.pad(x, ((0, 0), (0, gmax - g)))

    counters = c.replace(
      iterations=c.iterations + act,
      accepted_histogram=c.accepted_histogram
      + jax.nn.one_hot(a, gmax + 1, dtype=jnp.int32) * act[:, None],
      position_tries=c.position_tries + pad(tested),
      position_accepts=c.position_accepts + pad(accepted),
      beta_sum=c.beta_sum
      + jnp.sum(jnp.where(tested, result.beta, 0.0), axis=1),
      proposed=c.proposed + num * act,
    )
    if with_features:
      # The hidden after input n_new - 1 predicted the token just emitted.
      features = features[jnp.arange(batch), a]
    return state.replace(
      inputs=inputs,
      length=length,
      done=done,
      step=state.step + 1,
      target=tgt,
      draft=ds,
      counters=counters,
      features=features,
      draft_synced=None if state.draft_synced is None else length - 1,
    )

  def plain_step(state: LoopState) -> LoopState:
    """Gamma 0: one target step (the draft is left as it is)."""
    n = state.length
    tgt = target.rollback(state.target, n)
    logits, features, tgt = _score_target(
      target, tgt, _gather(state.inputs, n[:, None]), with_features
    )
    keys = sampling.position_keys(
      row_keys, (n + 1)[:, None], verify_block.SAMPLE
    )[:, 0]
    token, _ = sampling.draw_tokens(settings.sampler, keys, logits[:, 0])
    inputs, length, done, _ = commit_block(
      state, token[:, None], jnp.ones_like(n), settings
    )
    c = state.counters
    counters = c.replace(iterations=c.iterations + (~state.done))
    return state.replace(
      inputs=inputs,
      length=length,
      done=done,
      step=state.step + 1,
      target=tgt,
      counters=counters,
      features=None if features is None else features[:, 0],
    )

  def choice(state: LoopState) -> jax.Array:
    return gamma_policy.choose(
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
    plain_step if zero_gamma_ok(draft) else functools.partial(draft_step, g=1)
  )
  branches = [zero] + [
    functools.partial(draft_step, g=k) for k in range(1, gmax + 1)
  ]

  def policy_step(state: LoopState, g: int) -> LoopState:
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

  def policy_pass(state: LoopState) -> LoopState:
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

  def not_finished(state: LoopState) -> jax.Array:
    going = _not_finished(state, settings)
    if auto:
      going &= state.step < policy.max_iterations
    return going

  state = _init_loop(target, encoder_tokens, settings)
  features = None
  if with_features:
    size = getattr(target, 'feature_size', None) or target.config.emb_dim
    features = jnp.zeros((batch, size), jnp.float32)
  state = state.replace(
    draft=proposer.init_draft(encoder_tokens, settings.buffer_len),
    counters=SpecCounters.zeros(batch, gmax, with_gammas=auto),
    features=features,
    draft_synced=(
      jnp.zeros((batch,), jnp.int32) if auto and lm_draft is not None else None
    ),
    policy_idle=jnp.zeros((), jnp.int32) if auto else None,
  )
  if auto:
    state = state.replace(policy_gamma=choice(state))
  body = policy_pass if auto else functools.partial(draft_step, g=gmax)
  state = lax.while_loop(not_finished, body, state)
  tokens, lengths = _outputs(state, settings)
  return tokens, lengths, state.counters


def zero_gamma_ok(draft) -> bool:
  """Gamma 0 (no draft call) keeps `draft` usable: a language model (caught
  up later) or a drafter without state."""
  if not drafter.is_drafter(draft):
    return True
  return draft.init_draft(jnp.zeros((1, 1), jnp.int32), 1) is None


# Inputs fed per call when a language-model draft catches up.
_CATCH_UP_CHUNK = 8


def _catch_up(model, ds, state: LoopState, gmax: int):
  """Feeds `model` the inputs it missed during plain steps.

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
    _, ds = model.score(model.rollback(ds, idx), _gather(state.inputs, cols))
    return ds, jnp.minimum(idx + k, need)

  ds, _ = lax.while_loop(behind, feed, (ds, state.draft_synced))
  return ds


plain_decode_jit = jax.jit(plain_decode, static_argnames=('settings',))
speculative_decode_jit = jax.jit(
  speculative_decode, static_argnames=('settings',)
)

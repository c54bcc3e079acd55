"""Plain and speculative decoding, each one jitted `lax.while_loop`.

Both loops talk to models only through the language-model protocol
(`spec_decode.protocol`). Shapes: `B` rows, `G` = gamma, `M` =
max_decode_len, `V` vocabulary.

Token buffer: `inputs [B, M + G + 2]` holds decoder inputs; `inputs[:, 0]` is
the start id 0 and `inputs[:, k]` is output token k (1-based). A row with `n`
output tokens has its target state at index `n`: it holds inputs `0..n-1`,
and input `n` (the newest token) is fed next.

Randomness: every row has its own key; the draws for output token `k` use
`fold_in(fold_in(row_key, k), purpose)`, so a row's tokens depend only on its
seed, never on its batch mates, and a draft equal to the target draws exactly
the tokens plain sampling draws.
"""

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from spec_decode import sampling
from spec_decode import speculative
from spec_decode.config import EOS_ID
from spec_decode.config import PAD_ID
from spec_decode.protocol import LanguageModel

# `purpose` of a draw at one position (see module docstring).
_SAMPLE, _ACCEPT, _RESIDUAL = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """Static settings of a decode (hashable: part of the jit cache key).

  Attributes:
    max_decode_len: M, output tokens per row at most (EOS included).
    sampler: logits -> distribution, shared by draft and target.
    gamma: G, draft tokens per iteration (speculative only).
    verifier: Algorithm 1 or a variant with the same signature.
    eos_id: end-of-sequence id.
  """

  max_decode_len: int
  sampler: sampling.Sampler = sampling.Sampler()
  gamma: int = 4
  verifier: speculative.Verifier = speculative.ExactVerifier()
  eos_id: int = EOS_ID

  @property
  def buffer_len(self) -> int:
    return self.max_decode_len + self.gamma + 2


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
  """

  iterations: jax.Array
  accepted_histogram: jax.Array
  position_tries: jax.Array
  position_accepts: jax.Array
  beta_sum: jax.Array

  @classmethod
  def zeros(cls, batch: int, gamma: int) -> 'SpecCounters':
    return cls(
      iterations=jnp.zeros((batch,), jnp.int32),
      accepted_histogram=jnp.zeros((batch, gamma + 1), jnp.int32),
      position_tries=jnp.zeros((batch, gamma), jnp.int32),
      position_accepts=jnp.zeros((batch, gamma), jnp.int32),
      beta_sum=jnp.zeros((batch,), jnp.float32),
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
  """

  inputs: jax.Array
  length: jax.Array
  done: jax.Array
  step: jax.Array
  target: object
  draft: object = None
  counters: SpecCounters | None = None


def position_keys(
  row_keys: jax.Array, positions: jax.Array, purpose: int
) -> jax.Array:
  """Keys `[B, T]` for output positions `[B, T]` of rows with `row_keys [B]`."""

  def one_row(key, pos):
    return jax.vmap(
      lambda p: jax.random.fold_in(jax.random.fold_in(key, p), purpose)
    )(pos)

  return jax.vmap(one_row)(row_keys, positions)


def _gather(inputs: jax.Array, positions: jax.Array) -> jax.Array:
  return jnp.take_along_axis(inputs, positions, axis=1)


def _commit(
  state: LoopState,
  block: jax.Array,
  num_new: jax.Array,
  settings: DecodeSettings,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Appends up to `num_new [B]` tokens of `block [B, W]` per active row.

  Tokens after an EOS and past M are dropped. Returns the new inputs,
  lengths, done flags and the number of tokens actually kept `[B]`.
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
  block = jnp.where(offsets < kept[:, None], block, PAD_ID)
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


def _draw(sampler: sampling.Sampler, keys: jax.Array, logits: jax.Array):
  """Tokens `[B]` from `logits [B, V]`, and the distribution drawn from.

  Greedy draws are the argmax and their one-hot distribution is not
  materialized (None): skipping V-wide passes per draw matters on CPU.
  """
  if sampler.is_greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
  probs = sampler.probs(logits)
  return jax.vmap(sampling.sample)(keys, probs), probs


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
    keys = position_keys(row_keys, (n + 1)[:, None], _SAMPLE)[:, 0]
    token, _ = _draw(sampler, keys, logits[:, 0])
    inputs, length, done, _ = _commit(
      state, token[:, None], jnp.ones_like(n), settings
    )
    return state.replace(
      inputs=inputs, length=length, done=done, step=state.step + 1, target=tgt
    )

  state = _init_loop(target, encoder_tokens, settings)
  state = lax.while_loop(lambda s: _not_finished(s, settings), body, state)
  return _outputs(state, settings)


def _draft_block(
  draft: LanguageModel,
  draft_state,
  state: LoopState,
  row_keys: jax.Array,
  settings: DecodeSettings,
):
  """Draws G tokens from the draft: one T=2 call, then a scan of T=1 calls.

  The draft lags one input behind the target (it never saw the last draft
  token of a fully accepted block), so its first call feeds the two newest
  inputs at index n - 1. At n = 0 it feeds [start, pad] at 0 and uses the
  first position's logits.

  Returns:
    draft tokens `[B, G]`, their distributions `q [B, G, V]` (None when
    greedy: one-hot on the tokens), and the draft state.
  """
  n = state.length
  sampler = settings.sampler
  start = jnp.maximum(n - 1, 0)
  first_inputs = _gather(state.inputs, start[:, None] + jnp.arange(2)[None])
  ds = draft.rollback(draft_state, start)
  logits, ds = draft.score(ds, first_inputs)
  first_logits = jnp.where((n > 0)[:, None], logits[:, 1], logits[:, 0])
  ds = draft.rollback(ds, n + 1)
  positions = n[:, None] + 1 + jnp.arange(settings.gamma)[None]  # [B, G]
  keys = position_keys(row_keys, positions, _SAMPLE)

  x1, q1 = _draw(sampler, keys[:, 0], first_logits)

  def step(carry, key_i):
    ds_i, prev = carry
    lg, ds_i = draft.score(ds_i, prev[:, None])
    x, q = _draw(sampler, key_i, lg[:, 0])
    return (ds_i, x), (x, q)

  # Unrolled: the steps are small, and a rolled scan adds per-step loop
  # overhead inside the while_loop (measured in `make bench`).
  (ds, _), (xs, qs) = lax.scan(
    step, (ds, x1), jnp.swapaxes(keys[:, 1:], 0, 1), unroll=True
  )
  tokens = jnp.concatenate([x1[:, None], jnp.swapaxes(xs, 0, 1)], axis=1)
  if q1 is None:
    return tokens, None, ds
  q = jnp.concatenate([q1[:, None], jnp.swapaxes(qs, 0, 1)], axis=1)
  return tokens, q, ds


def _verify(
  settings: DecodeSettings,
  logits: jax.Array,
  q,
  draft_tokens,
  row_keys: jax.Array,
  positions: jax.Array,
):
  """Runs the verifier on target `logits [B, G+1, V]` and draft `q`."""
  g = settings.gamma
  sampler = settings.sampler
  verifier = settings.verifier
  greedy_path = getattr(verifier, 'greedy', None)
  if sampler.is_greedy and greedy_path is not None:
    return greedy_path(
      jnp.argmax(logits, axis=-1).astype(jnp.int32), draft_tokens
    )
  if q is None:  # Greedy draft, verifier without a greedy path.
    q = jax.nn.one_hot(draft_tokens, logits.shape[-1], dtype=jnp.float32)
  uniforms = jax.vmap(
    jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))
  )(position_keys(row_keys, positions[:, :g], _ACCEPT))
  return verifier(
    sampler.probs(logits),
    q,
    draft_tokens,
    uniforms=uniforms,
    bonus_keys=position_keys(row_keys, positions, _SAMPLE),
    residual_keys=position_keys(row_keys, positions, _RESIDUAL),
    greedy=sampler.is_greedy,
  )


def speculative_decode(
  target: LanguageModel,
  draft: LanguageModel,
  encoder_tokens: jax.Array,
  row_keys: jax.Array,
  settings: DecodeSettings,
):
  """Algorithm 1 in a loop: G draft steps, one target call over G+1 inputs.

  Returns:
    tokens `[B, M]`, lengths `[B]`, and `SpecCounters`.
  """
  g = settings.gamma
  batch = encoder_tokens.shape[0]

  def body(state: LoopState) -> LoopState:
    n = state.length
    active = ~state.done
    draft_tokens, q, ds = _draft_block(
      draft, state.draft, state, row_keys, settings
    )
    newest = _gather(state.inputs, n[:, None])
    tgt = target.rollback(state.target, n)
    logits, tgt = target.score(
      tgt, jnp.concatenate([newest, draft_tokens], axis=1)
    )
    positions = n[:, None] + 1 + jnp.arange(g + 1)[None]
    result = _verify(settings, logits, q, draft_tokens, row_keys, positions)
    a = result.accepted
    offsets = jnp.arange(g + 1)[None]
    block = jnp.where(
      offsets < a[:, None],
      jnp.concatenate([draft_tokens, jnp.zeros_like(newest)], axis=1),
      result.next_token[:, None],
    )
    inputs, length, done, kept = _commit(state, block, a + 1, settings)

    c = state.counters
    # Position i (0-based) was tested when its prefix was accepted and it
    # lies inside what the row kept (nothing after EOS or past M counts).
    tested = (offsets[:, :g] <= a[:, None]) & (offsets[:, :g] < kept[:, None])
    tested &= active[:, None]
    accepted = tested & (offsets[:, :g] < a[:, None])
    act = active.astype(jnp.int32)
    counters = SpecCounters(
      iterations=c.iterations + act,
      accepted_histogram=c.accepted_histogram
      + jax.nn.one_hot(a, g + 1, dtype=jnp.int32) * act[:, None],
      position_tries=c.position_tries + tested,
      position_accepts=c.position_accepts + accepted,
      beta_sum=c.beta_sum
      + jnp.sum(jnp.where(tested, result.beta, 0.0), axis=1),
    )
    return state.replace(
      inputs=inputs,
      length=length,
      done=done,
      step=state.step + 1,
      target=tgt,
      draft=ds,
      counters=counters,
    )

  state = _init_loop(target, encoder_tokens, settings)
  state = state.replace(
    draft=draft.init_state(encoder_tokens, settings.buffer_len),
    counters=SpecCounters.zeros(batch, g),
  )
  state = lax.while_loop(lambda s: _not_finished(s, settings), body, state)
  tokens, lengths = _outputs(state, settings)
  return tokens, lengths, state.counters


plain_decode_jit = jax.jit(plain_decode, static_argnames=('settings',))
speculative_decode_jit = jax.jit(
  speculative_decode, static_argnames=('settings',)
)

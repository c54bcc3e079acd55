"""Controlled acceptance for beam search (`bench beam`, section 2).

Plain beam search's own path, recorded step by step (`Trajectory`), and a
draft that agrees with it at a set rate (`ControlledBeamDraft`): the rule
is in `spec_decode.bench.beam.search`'s module doc.
"""

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import spec_decode as sd
from spec_decode.beam import rules as beam_rules
from spec_decode.beam import search as beam_search
from spec_decode.beam import speculative as spec_beam
from spec_decode.core.protocol import DecodeState
from spec_decode.core.protocol import LanguageModel

_BIG = 1.0e4


@flax.struct.dataclass(kw_only=True)
class Trajectory:
  """Plain beam search's live beams at every step, by last two tokens.

  Index s (0..M + 1) is the step: entry `[b, s, k]` describes live beam k
  of row b after step s (s tokens).

  Attributes:
    prev: `[B, M + 2, K] int32` the beam's token s - 1 (0: the start id).
    next: `[B, M + 2, K] int32` its token s (its newest).
    valid: `[B, M + 2, K] bool` the row took step s and the beam is a real
      live beam (not a -1e7 placeholder).
    steps: `[B] int32` the steps each row took.
  """

  prev: jax.Array
  next: jax.Array
  valid: jax.Array
  steps: jax.Array


@functools.partial(
  jax.jit, static_argnames=('num_beams', 'alpha', 'max_decode_len')
)
def live_sequences(model, enc, num_beams, alpha, max_decode_len):
  """Plain beam search (the loop of `beam_search.beam_decode`), keeping
  every step's live sequences: `[B, M + 1, K, M + 1]` and their flags."""
  batch, k, m = enc.shape[0], num_beams, max_decode_len
  settings = beam_search.BeamSettings(
    num_beams=k, alpha=alpha, max_decode_len=m, eos_id=sd.EOS_ID
  )
  state = model.init_state(enc, settings.buffer_len)
  state = jax.tree.map(lambda x: jnp.repeat(x, k, axis=0), state)
  rows = jnp.arange(batch)

  def body(carry):
    b, done, st, seqs, live = carry
    new, done, st, _ = spec_beam.plain_step(model, st, b, done, settings)
    # A stopped row keeps its beams: it rewrites its last entry unchanged.
    seqs = seqs.at[rows, new.step].set(new.live_seqs)
    real = new.live_logprobs > beam_rules.NEG_INF / 2
    live = live.at[rows, new.step].set(real)
    return new, done, st, seqs, live

  beams = beam_rules.Beams.init(batch, k, m)
  carry = (
    beams,
    beam_rules.stopped(beams, alpha),
    state,
    jnp.zeros((batch, m + 1, k, m + 1), jnp.int32),
    jnp.zeros((batch, m + 1, k), bool),
  )
  beams, _, _, seqs, live = lax.while_loop(
    lambda c: jnp.any(~c[1]), body, carry
  )
  tokens, _, _ = beam_rules.outputs(beams, sd.EOS_ID)
  return seqs, live, beams.step, tokens


def trajectory(
  model: LanguageModel, enc: np.ndarray, num_beams: int, alpha: float, m: int
) -> tuple[Trajectory, np.ndarray]:
  """Plain beam search's `Trajectory` over `enc [B, S]`, and its output
  tokens `[B, K, M]` (best first) to check it against `sd.beam_search`."""
  seqs, live, steps, tokens = jax.device_get(
    live_sequences(model, jnp.asarray(enc), num_beams, float(alpha), m)
  )
  batch, k = enc.shape[0], num_beams
  prev = np.zeros((batch, m + 2, k), np.int32)
  nxt = np.zeros((batch, m + 2, k), np.int32)
  valid = np.zeros((batch, m + 2, k), bool)
  for s in range(1, m + 1):
    prev[:, s] = seqs[:, s, :, s - 1]
    nxt[:, s] = seqs[:, s, :, s]
    valid[:, s] = live[:, s] & (steps >= s)[:, None]
  traj = Trajectory(
    prev=jnp.asarray(prev),
    next=jnp.asarray(nxt),
    valid=jnp.asarray(valid),
    steps=jnp.asarray(steps),
  )
  return traj, tokens


def shared_last_fraction(traj: Trajectory) -> float:
  """Fraction of (row, step s >= 2) where two live beams of step s - 1
  share their last token (their children are proposed as one set)."""
  last = np.asarray(traj.next)[:, 1:-2]  # Steps 1 .. M - 1 (parents).
  valid = np.asarray(traj.valid)[:, 1:-2]
  child_step = np.asarray(traj.valid)[:, 2:-1].any(-1)
  k = last.shape[-1]
  same = (last[..., :, None] == last[..., None, :]) & ~np.eye(k, dtype=bool)
  same &= valid[..., :, None] & valid[..., None, :]
  shared = same.any((-1, -2)) & child_step
  return float(shared.sum() / max(child_step.sum(), 1))


@flax.struct.dataclass(kw_only=True)
class ControlledBeamState:
  """Attributes: `inner`, the real draft's state (its index is ours);
  `row`, `[R] int32` the batch row of each model row (it follows the rows
  through `jnp.repeat` and reorders, as every leaf of a state does)."""

  inner: DecodeState
  row: jax.Array


@flax.struct.dataclass(kw_only=True)
class ControlledBeamDraft:
  """A draft that agrees with the target's beams at a set rate (module doc).

  Attributes:
    inner: the draft network (a `TreeLanguageModel`: it supplies the cost,
      and the logits where the trajectory says nothing).
    traj: plain beam search's `Trajectory` on the same inputs.
    alpha: scalar float, the probability per (row, step) of agreeing.
    key: PRNG key of the coins (fixed per row and step).
  """

  inner: LanguageModel
  traj: Trajectory
  alpha: jax.Array
  key: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  @property
  def vocabulary(self):
    return getattr(self.inner, 'vocabulary', None)

  def init_state(self, encoder_tokens, length) -> ControlledBeamState:
    batch = encoder_tokens.shape[0]
    return ControlledBeamState(
      inner=self.inner.init_state(encoder_tokens, length),
      row=jnp.arange(batch, dtype=jnp.int32),
    )

  def _bias(self, row, positions, tokens) -> jax.Array:
    """`[R, T, V]`: +-1e4 on the target's children after `tokens [R, T]`
    at input `positions [R, T]` (output step position + 1), else 0."""
    t = self.traj
    s = jnp.clip(positions + 1, 0, t.prev.shape[1] - 1)
    b = jnp.broadcast_to(row[:, None], s.shape)
    match = t.valid[b, s] & (t.prev[b, s] == tokens[..., None])  # [R, T, K]
    r, n, k = match.shape
    hit = jnp.zeros((r, n, self.vocab_size), jnp.float32)
    hit = hit.at[
      jnp.arange(r)[:, None, None], jnp.arange(n)[None, :, None], t.next[b, s]
    ].max(match.astype(jnp.float32))

    def coin(b, s):
      key = jax.random.fold_in(jax.random.fold_in(self.key, b), s)
      return jax.random.uniform(key)

    agree = jax.vmap(jax.vmap(coin))(b, s) < self.alpha
    return hit * jnp.where(agree, _BIG, -_BIG)[..., None]

  def score(self, state: ControlledBeamState, tokens: jax.Array):
    index = state.inner.cache.index
    logits, inner = self.inner.score(state.inner, tokens)
    positions = index[:, None] + jnp.arange(tokens.shape[1])[None]
    logits = logits + self._bias(state.row, positions, tokens)
    return logits, state.replace(inner=inner)

  def score_tree(self, state: ControlledBeamState, tokens, attention):
    index = state.inner.cache.index
    logits, inner = self.inner.score_tree(state.inner, tokens, attention)
    rel = jnp.asarray(attention.new_positions(), jnp.int32)
    logits = logits + self._bias(state.row, index[:, None] + rel, tokens)
    return logits, state.replace(inner=inner)

  def commit_tree(self, state: ControlledBeamState, slots, count):
    return state.replace(
      inner=self.inner.commit_tree(state.inner, slots, count)
    )

  def rollback(self, state: ControlledBeamState, index):
    return state.replace(inner=self.inner.rollback(state.inner, index))

  def reorder_beams(self, state: ControlledBeamState, rows):
    return ControlledBeamState(
      inner=spec_beam.reorder_rows(self.inner, state.inner, rows),
      row=jnp.take(state.row, rows, axis=0),
    )


def expected_steps_per_call(alpha: float, gamma: int) -> float:
  """(1 - alpha^(gamma + 1)) / (1 - alpha): coins independent per step."""
  return float(sum(alpha**i for i in range(gamma + 1)))

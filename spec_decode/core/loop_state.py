"""The loops' carry: one documented state per loop, its token buffer, and
the step every speculative iteration ends with.

States (`flax.struct` pytrees; shapes: `B` rows, `M` max_decode_len, `W`
the widest block an iteration may write, `DecodeSettings.width`: the fixed
gamma, the largest gamma under gamma='auto', or a tree's depth; `D` the
target's feature width):
  * `PlainState`: plain decoding, and what every loop shares;
  * `SpecState`: a speculative loop (the fixed-gamma chain and the tree
    loop) adds the draft, the counters, the feature window and the
    provenance;
  * `AutoState`: gamma='auto' adds what the in-loop policy reads and what a
    skipped draft needs to catch up;
  * `TreeState`: the tree loop adds the (static) depth of the deepest tree
    it ran.
`Loop` is what every iteration of a speculative decode closes over (the
chain's `chain.steps.Iteration` and the tree's `tree.loop.Iteration` are
built on it); `SpecState.commit` appends a verified block and records it
(tokens, provenance, feature window, counters) for both.

Token buffer: `inputs [B, M + W + 2]` holds decoder inputs; `inputs[:, 0]`
is the start id 0 and `inputs[:, k]` is output token k (1-based). A row
with `n` output tokens has its target state at index `n`: it holds inputs
`0..n-1`, and input `n` (the newest token) is fed next. Every loop shares
this layout and `commit_block`.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.core import drafter
from spec_decode.core import model_drafter
from spec_decode.core import provenance as provenance_lib
from spec_decode.core import sampling
from spec_decode.core import verified_block
from spec_decode.core.counters import SpecCounters
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.protocol import LanguageModel


def gather(inputs: jax.Array, positions: jax.Array) -> jax.Array:
  """`inputs [B, L]` at `positions [B, K]`: `[B, K]`."""
  return jnp.take_along_axis(inputs, positions, axis=1)


def commit_block(
  state: Any,
  block: jax.Array,
  num_new: jax.Array,
  settings: DecodeSettings,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Appends up to `num_new [B]` tokens of `block [B, W]` per active row.

  `state` is any loop state (`PlainState` or a subclass) with room for the
  block in its `inputs`. Tokens after an EOS and past M are dropped.
  Returns the new inputs, lengths, done flags and the number of tokens
  actually kept `[B]`.
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


@flax.struct.dataclass(kw_only=True)
class VerifiedPath:
  """What one speculative iteration verified, per row (`W`: g, or the
  tree's depth).

  Attributes:
    tokens: `[B, W] int32` the proposed tokens along the path the verifier
      walked (a chain's draft; a tree's accepted path, then filler).
    accepted: `[B] int32` the first a of them were accepted.
    next_token: `[B] int32` the target's token after them.
    tested: `[B, W] bool` position i was tested (proposed, its prefix
      accepted).
    beta: `[B, W] float32` the verifier's beta per position.
    proposed: `[B] int32` draft tokens (tree nodes) proposed.
    features: `[B, W + 1, D]` the target's hidden states at the newest
      input and along the path (the drafter reads features), else None.
  """

  tokens: jax.Array
  accepted: jax.Array
  next_token: jax.Array
  tested: jax.Array
  beta: jax.Array
  proposed: jax.Array
  features: jax.Array | None = None


@flax.struct.dataclass(kw_only=True)
class PlainState:
  """Carry of the plain loop (and the part every loop shares).

  Attributes:
    inputs: `[B, M + W + 2] int32` decoder inputs (module docstring).
    length: `[B] int32` output tokens so far (EOS included).
    done: `[B] bool` EOS emitted or M reached.
    step: `[] int32` loop iterations so far.
    target: the target's decode state.
  """

  inputs: jax.Array
  length: jax.Array
  done: jax.Array
  step: jax.Array
  target: object


@flax.struct.dataclass(kw_only=True)
class SpecState(PlainState):
  """Carry of a speculative loop (fixed gamma; the tree loop's `TreeState`).

  Attributes:
    draft: the drafter's state (a language model's decode state, a
      drafter's own state, or None for a stateless drafter).
    counters: the speculative statistics, `W` positions wide (a tree's:
      with its per-node counts).
    features: `[B, K, D] float32` the target's hidden states at inputs
      n-K..n-1 (the last predicted the newest token) for drafters that read
      target features, K = W + 1 for those that read recent features, else
      1 (`core.drafter.feature_window`); None for the others.
    provenance: where each output token came from
      (`core.provenance.Record`, the inputs' layout); None when
      `settings.provenance` is off.
  """

  draft: object = None
  counters: SpecCounters
  features: jax.Array | None = None
  provenance: provenance_lib.Record | None = None

  def commit(
    self,
    settings: DecodeSettings,
    path: VerifiedPath,
    target: Any,
    draft: Any,
    codes: Callable[[], tuple],
  ) -> tuple['SpecState', jax.Array]:
    """The state after one speculative iteration: the accepted tokens and
    the target's next token appended (`commit_block`), their provenance
    recorded, the feature window moved on and the iteration counted.

    Args:
      settings: the decode's settings.
      path: what the iteration verified.
      target: the target's state after its call.
      draft: the drafter's state after its proposal.
      codes: returns `Record.write`'s codes (and rejected tokens, ranks)
        `[B, W + 1]` of the block; called only when provenance is on.

    Returns:
      The new state (of this state's type) and the tokens each row kept
      `[B]`.
    """
    a = path.accepted
    offsets = jnp.arange(path.tokens.shape[1] + 1)[None]
    block = jnp.where(
      offsets < a[:, None],
      jnp.concatenate([path.tokens, jnp.zeros_like(path.tokens[:, :1])], 1),
      path.next_token[:, None],
    )
    inputs, length, done, kept = commit_block(self, block, a + 1, settings)
    record = self.provenance
    if record is not None:
      record = record.write(self.length, kept, *codes())
    features = self.features
    if path.features is not None:
      # The hidden state after input t predicted output token t + 1: the
      # window moves on by the inputs this iteration committed.
      features = drafter.slide_features(
        features, path.features, length - self.length
      )
    counters = self.counters.counted(
      ~self.done, a, kept, path.tested, path.beta, path.proposed
    )
    new = self.replace(
      inputs=inputs,
      length=length,
      done=done,
      step=self.step + 1,
      target=target,
      draft=draft,
      counters=counters,
      features=features,
      provenance=record,
    )
    return new, kept


@flax.struct.dataclass(kw_only=True)
class AutoState(SpecState):
  """Carry of the gamma='auto' loop (`counters.gamma_histogram` is set).

  Attributes:
    draft_synced: `[B] int32` leading inputs a language-model draft's cache
      holds (plain steps skip the draft; None for a drafter).
    policy_idle: `[] int32` consecutive gamma-0 iterations just before this
      one (the policy's probe schedule).
    policy_gamma: `[] int32` the gamma the policy chose for the next
      iteration.
  """

  draft_synced: jax.Array | None = None
  policy_idle: jax.Array
  policy_gamma: jax.Array


@flax.struct.dataclass(kw_only=True)
class TreeState(SpecState):
  """Carry of the tree loop (`counters` has the per-node counts; `W` is
  the deepest tree the state has room for).

  Attributes:
    deepest: static; the depth of the deepest tree the state was iterated
      with (None before any iteration): a bound on the tokens a row
      accepted in its last iteration (`tree.loop`).
  """

  deepest: int | None = flax.struct.field(pytree_node=False, default=None)


def init_plain(
  target: LanguageModel,
  encoder_tokens: jax.Array,
  settings: DecodeSettings,
  buffer_len: int | None = None,
  cache_len: int | None = None,
) -> PlainState:
  """The first `PlainState`: `buffer_len` inputs (default
  `settings.buffer_len`), a target cache of `cache_len` (default the
  same)."""
  batch = encoder_tokens.shape[0]
  buffer_len = buffer_len or settings.buffer_len
  return PlainState(
    inputs=jnp.zeros((batch, buffer_len), jnp.int32),
    length=jnp.zeros((batch,), jnp.int32),
    done=jnp.zeros((batch,), bool),
    step=jnp.zeros((), jnp.int32),
    target=target.init_state(encoder_tokens, cache_len or buffer_len),
  )


def shared_fields(state: PlainState) -> dict:
  """The `PlainState` fields of `state`, to build a richer state from."""
  return {
    'inputs': state.inputs,
    'length': state.length,
    'done': state.done,
    'step': state.step,
    'target': state.target,
  }


def not_finished(
  state: PlainState,
  settings: DecodeSettings,
  max_iterations: jax.Array | int | None = None,
) -> jax.Array:
  """Some row is not done and the loop has run fewer than M (and fewer
  than `max_iterations`, a run-time value) iterations."""
  going = jnp.any(~state.done) & (state.step < settings.max_decode_len)
  if max_iterations is not None:
    going &= state.step < max_iterations
  return going


def outputs(
  state: PlainState, settings: DecodeSettings
) -> tuple[jax.Array, jax.Array]:
  """tokens `[B, M]` (pad after EOS) and lengths `[B]`."""
  tokens = state.inputs[:, 1 : settings.max_decode_len + 1]
  return tokens, state.length


@dataclasses.dataclass(frozen=True)
class Loop:
  """What every iteration of one speculative decode closes over.

  Attributes:
    target: the target language model.
    proposer: the draft as a `core.drafter.Drafter`.
    encoder_tokens: `[B, S] int32`.
    row_keys: `[B]` PRNG keys.
    settings: the decode's static settings.
    with_features: the drafter reads the target's features (the target
      then scores with them; the state keeps them in a window,
      `core.drafter.feature_window`).
  """

  target: LanguageModel
  proposer: Any
  encoder_tokens: jax.Array
  row_keys: jax.Array
  settings: DecodeSettings
  with_features: bool

  @classmethod
  def create(
    cls,
    target: LanguageModel,
    draft: Any,
    encoder_tokens: jax.Array,
    row_keys: jax.Array,
    settings: DecodeSettings,
    **more: Any,
  ):
    """`draft`: a drafter or any language model (`core.model_drafter`);
    `more`: a subclass's own fields."""
    proposer = model_drafter.as_drafter(draft)
    return cls(
      target=target,
      proposer=proposer,
      encoder_tokens=encoder_tokens,
      row_keys=row_keys,
      settings=settings,
      with_features=bool(getattr(proposer, 'uses_target_features', False)),
      **more,
    )

  def first_state(
    self,
    state_type: type[SpecState],
    counters: SpecCounters,
    window: int,
    buffer_len: int | None = None,
    cache_len: int | None = None,
    **more: Any,
  ) -> SpecState:
    """A speculative loop's first state.

    Args:
      state_type: `SpecState` or a subclass.
      counters: zero counters.
      window: the most inputs one iteration commits (the feature window's:
        W + 1).
      buffer_len: the token buffer's length (`init_plain`).
      cache_len: the models' cache length (default `buffer_len`).
      **more: the subclass's own fields.
    """
    enc, settings = self.encoder_tokens, self.settings
    batch = enc.shape[0]
    buffer_len = buffer_len or settings.buffer_len
    cache_len = cache_len or buffer_len
    start = init_plain(self.target, enc, settings, buffer_len, cache_len)
    return state_type(
      **shared_fields(start),
      draft=self.proposer.init_draft(enc, cache_len),
      counters=counters,
      features=drafter.feature_window(
        self.proposer, self.target, batch, window
      ),
      provenance=(
        provenance_lib.Record.zeros(batch, buffer_len)
        if settings.provenance
        else None
      ),
      **more,
    )

  def context(
    self, state: SpecState, depth: int, max_accepted: int | None
  ) -> drafter.DraftContext:
    """What the drafter reads to propose `depth` tokens (a chain's g, a
    tree's depth) after `state`; `max_accepted`: the most tokens the last
    iteration may have accepted, when more than `depth`
    (`core.drafter.accepted_bound`)."""
    n = state.length
    return drafter.DraftContext(
      inputs=state.inputs,
      length=n,
      encoder_tokens=self.encoder_tokens,
      keys=sampling.position_keys(
        self.row_keys,
        n[:, None] + 1 + jnp.arange(depth)[None],
        verified_block.SAMPLE,
      ),
      **drafter.context_reads(self.proposer, state.features, state.target),
      max_accepted=max_accepted,
    )

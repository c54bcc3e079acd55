"""The carry of each chain loop: one documented state per mode.

Plain decoding carries `PlainState`; fixed-gamma speculative decoding adds
the draft and the counters (`SpecState`); gamma='auto' adds what the
in-loop policy reads and what a skipped draft needs to catch up
(`AutoState`). Shapes: `B` rows, `M` max_decode_len, `G` the (largest)
gamma, `D` the target's feature width. The buffer layout is
`core.buffer`'s.
"""

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.core import provenance as provenance_lib
from spec_decode.core.counters import SpecCounters
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.protocol import LanguageModel


@flax.struct.dataclass(kw_only=True)
class PlainState:
  """Carry of the plain loop (and the part every chain loop shares).

  Attributes:
    inputs: `[B, M + G + 2] int32` decoder inputs (`core.buffer`).
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
  """Carry of the fixed-gamma loop.

  Attributes:
    draft: the drafter's state (a language model's decode state, a
      drafter's own state, or None for a stateless drafter).
    counters: the speculative statistics, `G` positions wide.
    features: `[B, K, D] float32` the target's hidden states at inputs
      n-K..n-1 (the last predicted the newest token) for drafters that read
      target features, K = G + 1 for those that read recent features, else
      1 (`core.drafter.feature_window`); None for the others.
    provenance: where each output token came from
      (`core.provenance.Record`, the inputs' layout); None when
      `settings.provenance` is off.
  """

  draft: object = None
  counters: SpecCounters
  features: jax.Array | None = None
  provenance: provenance_lib.Record | None = None


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


def init_plain(
  target: LanguageModel, encoder_tokens: jax.Array, settings: DecodeSettings
) -> PlainState:
  batch = encoder_tokens.shape[0]
  return PlainState(
    inputs=jnp.zeros((batch, settings.buffer_len), jnp.int32),
    length=jnp.zeros((batch,), jnp.int32),
    done=jnp.zeros((batch,), bool),
    step=jnp.zeros((), jnp.int32),
    target=target.init_state(encoder_tokens, settings.buffer_len),
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


def not_finished(state: PlainState, settings: DecodeSettings) -> jax.Array:
  return jnp.any(~state.done) & (state.step < settings.max_decode_len)


def outputs(
  state: PlainState, settings: DecodeSettings
) -> tuple[jax.Array, jax.Array]:
  """tokens `[B, M]` (pad after EOS) and lengths `[B]`."""
  tokens = state.inputs[:, 1 : settings.max_decode_len + 1]
  return tokens, state.length

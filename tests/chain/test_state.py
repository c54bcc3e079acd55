"""The chain loops' carries (`chain.state`)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.chain import state as chain_state
from spec_decode.core.counters import SpecCounters

PLAIN = ['inputs', 'length', 'done', 'step', 'target']
SPEC = PLAIN + ['draft', 'counters', 'features', 'provenance']
AUTO = SPEC + ['draft_synced', 'policy_idle', 'policy_gamma']


def _plain_fields():
  """A distinct `[2]` array for each `PlainState` field (the target too)."""
  return {name: jnp.full((2,), i) for i, name in enumerate(PLAIN)}


def _auto_state():
  return chain_state.AutoState(
    **_plain_fields(),
    draft=jnp.full((2,), 10),
    counters=SpecCounters.zeros(2, 3, with_gammas=True),
    features=jnp.zeros((2, 4)),
    draft_synced=jnp.full((2,), 11),
    policy_idle=jnp.int32(12),
    policy_gamma=jnp.int32(13),
  )


def test_states_are_pytrees_of_their_documented_fields():
  plain = chain_state.PlainState(**_plain_fields())
  spec = chain_state.SpecState(
    **_plain_fields(), counters=SpecCounters.zeros(2, 3)
  )
  auto = _auto_state()
  for s, names in ((plain, PLAIN), (spec, SPEC), (auto, AUTO)):
    assert [f.name for f in dataclasses.fields(s)] == names
  # Every field a leaf (the counters: 6 arrays, 7 with gamma_histogram);
  # None (a stateless draft, no features) is no leaf.
  assert len(jax.tree.leaves(plain)) == 5
  assert len(jax.tree.leaves(spec)) == 5 + 6
  assert len(jax.tree.leaves(auto)) == 5 + 1 + 7 + 1 + 3
  leaves, tree = jax.tree.flatten(auto)
  again = jax.tree.unflatten(tree, leaves)
  assert type(again) is chain_state.AutoState
  np.testing.assert_array_equal(again.draft_synced, auto.draft_synced)
  # The counters and the policy's fields are required.
  with pytest.raises(TypeError):
    chain_state.SpecState(**_plain_fields())
  with pytest.raises(TypeError):
    chain_state.AutoState(
      **_plain_fields(), counters=SpecCounters.zeros(2, 3), policy_idle=0
    )


def test_replace_keeps_an_auto_states_own_fields():
  auto = _auto_state()
  new = auto.replace(length=jnp.full((2,), 7), step=jnp.int32(3))
  assert type(new) is chain_state.AutoState
  np.testing.assert_array_equal(new.length, [7, 7])
  assert int(new.step) == 3
  for name in ('draft', 'features', 'draft_synced', 'inputs', 'target'):
    assert getattr(new, name) is getattr(auto, name), name
  assert new.counters is auto.counters
  assert int(new.policy_idle) == 12 and int(new.policy_gamma) == 13
  # shared_fields: the PlainState part only, to build a richer state from.
  assert list(chain_state.shared_fields(new)) == PLAIN
  assert chain_state.shared_fields(new)['length'] is new.length


def test_init_plain_shapes():
  target = sd.TableLM.random(8)
  settings = sd.DecodeSettings(max_decode_len=6, gamma=3)
  s = chain_state.init_plain(target, jnp.zeros((3, 5), jnp.int32), settings)
  assert type(s) is chain_state.PlainState
  assert s.inputs.shape == (3, 6 + 3 + 2) and s.inputs.dtype == jnp.int32
  assert s.length.shape == (3,) and s.length.dtype == jnp.int32
  assert s.done.shape == (3,) and s.done.dtype == jnp.bool_
  assert s.step.shape == () and s.step.dtype == jnp.int32
  for x in (s.inputs, s.length, s.done, s.step):
    assert not np.asarray(x).any()
  # The target's own decode state, one entry per row.
  np.testing.assert_array_equal(s.target.index, [0, 0, 0])


def test_not_finished_and_outputs():
  settings = sd.DecodeSettings(max_decode_len=4, gamma=2)
  inputs = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)

  def state(done, step):
    return chain_state.PlainState(
      inputs=inputs,
      length=jnp.asarray([4, 2], jnp.int32),
      done=jnp.asarray(done),
      step=jnp.int32(step),
      target=None,
    )

  assert bool(chain_state.not_finished(state([True, False], 3), settings))
  assert not bool(chain_state.not_finished(state([True, True], 3), settings))
  # M iterations at most, whatever the rows say.
  assert not bool(chain_state.not_finished(state([False, False], 4), settings))
  tokens, lengths = chain_state.outputs(state([True, True], 4), settings)
  # Output tokens 1..M (index 0 is the start id).
  np.testing.assert_array_equal(tokens, [[1, 2, 3, 4], [9, 10, 11, 12]])
  np.testing.assert_array_equal(lengths, [4, 2])

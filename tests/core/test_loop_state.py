"""The loops' carries (`core.loop_state`): their fields, the first states,
and the commit-and-record step every speculative iteration ends with."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.core import loop_state
from spec_decode.core import provenance
from spec_decode.core.counters import SpecCounters

PLAIN = ['inputs', 'length', 'done', 'step', 'target']
SPEC = PLAIN + ['draft', 'counters', 'features', 'provenance']
AUTO = SPEC + ['draft_synced', 'policy_idle', 'policy_gamma']
TREE = SPEC + ['deepest']


def _plain_fields():
  """A distinct `[2]` array for each `PlainState` field (the target too)."""
  return {name: jnp.full((2,), i) for i, name in enumerate(PLAIN)}


def _auto_state():
  return loop_state.AutoState(
    **_plain_fields(),
    draft=jnp.full((2,), 10),
    counters=SpecCounters.zeros(2, 3, with_gammas=True),
    features=jnp.zeros((2, 4)),
    draft_synced=jnp.full((2,), 11),
    policy_idle=jnp.int32(12),
    policy_gamma=jnp.int32(13),
  )


def test_states_are_pytrees_of_their_documented_fields():
  plain = loop_state.PlainState(**_plain_fields())
  spec = loop_state.SpecState(
    **_plain_fields(), counters=SpecCounters.zeros(2, 3)
  )
  auto = _auto_state()
  tree = loop_state.TreeState(
    **_plain_fields(),
    counters=SpecCounters.zeros(2, 3, num_nodes=5),
    deepest=3,
  )
  for s, names in ((plain, PLAIN), (spec, SPEC), (auto, AUTO), (tree, TREE)):
    assert [f.name for f in dataclasses.fields(s)] == names
  # Every field a leaf (the counters: 6 arrays, 7 with gamma_histogram, 8
  # with a tree's per-node counts); None (a stateless draft, no features)
  # is no leaf, nor the tree's static `deepest`.
  assert len(jax.tree.leaves(plain)) == 5
  assert len(jax.tree.leaves(spec)) == 5 + 6
  assert len(jax.tree.leaves(auto)) == 5 + 1 + 7 + 1 + 3
  assert len(jax.tree.leaves(tree)) == 5 + 8
  assert tree.counters.node_tries.shape == (2, 5)
  again = jax.tree.unflatten(*reversed(jax.tree.flatten(tree)))
  assert type(again) is loop_state.TreeState and again.deepest == 3
  leaves, tree = jax.tree.flatten(auto)
  again = jax.tree.unflatten(tree, leaves)
  assert type(again) is loop_state.AutoState
  np.testing.assert_array_equal(again.draft_synced, auto.draft_synced)
  # The counters and the policy's fields are required.
  with pytest.raises(TypeError):
    loop_state.SpecState(**_plain_fields())
  with pytest.raises(TypeError):
    loop_state.AutoState(
      **_plain_fields(), counters=SpecCounters.zeros(2, 3), policy_idle=0
    )


def test_replace_keeps_an_auto_states_own_fields():
  auto = _auto_state()
  new = auto.replace(length=jnp.full((2,), 7), step=jnp.int32(3))
  assert type(new) is loop_state.AutoState
  np.testing.assert_array_equal(new.length, [7, 7])
  assert int(new.step) == 3
  for name in ('draft', 'features', 'draft_synced', 'inputs', 'target'):
    assert getattr(new, name) is getattr(auto, name), name
  assert new.counters is auto.counters
  assert int(new.policy_idle) == 12 and int(new.policy_gamma) == 13
  # shared_fields: the PlainState part only, to build a richer state from.
  assert list(loop_state.shared_fields(new)) == PLAIN
  assert loop_state.shared_fields(new)['length'] is new.length


def test_init_plain_shapes():
  target = sd.TableLM.random(8)
  settings = sd.DecodeSettings(max_decode_len=6, gamma=3)
  s = loop_state.init_plain(target, jnp.zeros((3, 5), jnp.int32), settings)
  assert type(s) is loop_state.PlainState
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
    return loop_state.PlainState(
      inputs=inputs,
      length=jnp.asarray([4, 2], jnp.int32),
      done=jnp.asarray(done),
      step=jnp.int32(step),
      target=None,
    )

  assert bool(loop_state.not_finished(state([True, False], 3), settings))
  assert not bool(loop_state.not_finished(state([True, True], 3), settings))
  # M iterations at most, whatever the rows say.
  assert not bool(loop_state.not_finished(state([False, False], 4), settings))
  # A run-time cap on the iterations (the tree loop's and gamma='auto''s).
  assert not bool(loop_state.not_finished(state([True, False], 3), settings, 3))
  assert bool(loop_state.not_finished(state([True, False], 3), settings, 4))
  tokens, lengths = loop_state.outputs(state([True, True], 4), settings)
  # Output tokens 1..M (index 0 is the start id).
  np.testing.assert_array_equal(tokens, [[1, 2, 3, 4], [9, 10, 11, 12]])
  np.testing.assert_array_equal(lengths, [4, 2])


def test_init_plain_sizes_buffer_and_cache_apart():
  """The tree loop's buffer is as wide as its deepest tree, its caches as
  its most nodes."""
  target = sd.TableLM.random(8)
  settings = sd.DecodeSettings(max_decode_len=6, gamma=3)
  s = loop_state.init_plain(
    target, jnp.zeros((3, 5), jnp.int32), settings, buffer_len=9, cache_len=20
  )
  assert s.inputs.shape == (3, 9)


def _commit(a, next_token, eos_at=None, done=(False, False), length=(0, 0)):
  """One chain block of W = 3 drafted tokens 5, 6, 7 committed on two rows
  (M = 6, G = 4 wide counters); `eos_at`: a drafted token made EOS."""
  tokens = jnp.asarray([[5, 6, 7], [5, 6, 7]], jnp.int32)
  if eos_at is not None:
    tokens = tokens.at[:, eos_at].set(1)
  settings = sd.DecodeSettings(max_decode_len=6, gamma=4, eos_id=1)
  state = loop_state.SpecState(
    inputs=jnp.zeros((2, 12), jnp.int32),
    length=jnp.asarray(length, jnp.int32),
    done=jnp.asarray(done),
    step=jnp.int32(0),
    target=None,
    counters=SpecCounters.zeros(2, 4),
    provenance=provenance.Record.zeros(2, 12),
  )
  a = jnp.asarray(a, jnp.int32)
  offsets = jnp.arange(3)[None]
  path = loop_state.VerifiedPath(
    tokens=tokens,
    accepted=a,
    next_token=jnp.asarray(next_token, jnp.int32),
    tested=offsets <= a[:, None],
    beta=jnp.full((2, 3), 0.5),
    proposed=jnp.full((2,), 3, jnp.int32),
  )
  num = jnp.full((2,), 3, jnp.int32)
  return state.commit(
    settings,
    path,
    target='t',
    draft='d',
    codes=lambda: provenance.chain_block(a, num, tokens),
  )


def test_commit_appends_records_and_counts_a_block():
  new, kept = _commit(a=[1, 3], next_token=[9, 8])
  np.testing.assert_array_equal(kept, [2, 4])
  np.testing.assert_array_equal(new.length, [2, 4])
  np.testing.assert_array_equal(
    new.inputs[:, 1:6], [[5, 9, 0, 0, 0], [5, 6, 7, 8, 0]]
  )
  assert int(new.step) == 1 and (new.target, new.draft) == ('t', 'd')
  c = new.counters
  np.testing.assert_array_equal(c.iterations, [1, 1])
  # Row 0 tested positions 0, 1 and accepted 0; row 1 tested and accepted
  # all three; the fourth (G = 4) was not drafted.
  np.testing.assert_array_equal(c.position_tries, [[1, 1, 0, 0], [1, 1, 1, 0]])
  np.testing.assert_array_equal(
    c.position_accepts, [[1, 0, 0, 0], [1, 1, 1, 0]]
  )
  np.testing.assert_array_equal(
    c.accepted_histogram[:, :4], [[0, 1, 0, 0], [0, 0, 0, 1]]
  )
  np.testing.assert_allclose(c.beta_sum, [1.0, 1.5])
  np.testing.assert_array_equal(c.proposed, [3, 3])
  kinds = np.asarray(new.provenance.codes)[:, 1:5] & provenance.KIND_MASK
  np.testing.assert_array_equal(
    kinds,
    [
      [provenance.ACCEPTED, provenance.REPLACED, 0, 0],
      [provenance.ACCEPTED] * 3 + [provenance.BONUS],
    ],
  )


def test_commit_counts_nothing_past_the_rows_end():
  """An accepted draft EOS at position 1: the row keeps 2 tokens, and the
  accepted token after the EOS counts nowhere; a done row counts nothing."""
  new, kept = _commit(a=[3, 3], next_token=[8, 8], eos_at=1, done=(False, True))
  np.testing.assert_array_equal(kept, [2, 0])
  np.testing.assert_array_equal(new.done, [True, True])
  c = new.counters
  np.testing.assert_array_equal(c.iterations, [1, 0])
  np.testing.assert_array_equal(c.position_tries, [[1, 1, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(
    c.position_accepts, [[1, 1, 0, 0], [0, 0, 0, 0]]
  )
  np.testing.assert_array_equal(c.accepted_histogram[0], [0, 0, 1, 0, 0])
  np.testing.assert_array_equal(c.accepted_histogram[1], [0] * 5)
  np.testing.assert_array_equal(c.proposed, [3, 0])

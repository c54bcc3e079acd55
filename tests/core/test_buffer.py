"""The decoder-input buffer (`core.loop_state`): appending verified blocks."""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.core import loop_state
from spec_decode.core.decode_settings import DecodeSettings

# M = 6 output tokens, blocks of W = 3: buffers of M + W + 2 = 11 inputs.
SETTINGS = DecodeSettings(max_decode_len=6, gamma=3, eos_id=1)
# Untouched buffer entries hold S = 9 (not 0), so a stray write shows.
S = 9


@flax.struct.dataclass
class _State:
  inputs: jax.Array
  length: jax.Array
  done: jax.Array


# Per row: length, done, block, num_new (its buffer: BEFORE, then AFTER).
ROWS = [
  (0, False, [5, 6, 7], 3),  # all kept
  (2, False, [5, 1, 7], 3),  # cut after the EOS, done
  (5, False, [5, 6, 7], 3),  # one place left before M: done
  (2, True, [1, 6, 7], 3),  # done before: unchanged
  (1, False, [5, 6, 1], 2),  # an EOS past num_new is not read
  (3, False, [5, 6, 7], 0),  # nothing new
  (0, False, [1, 5, 6], 3),  # EOS first
  (4, False, [5, 6, 1], 3),  # room for 2: the EOS past M is dropped
]
BEFORE = [
  [0, S, S, S, S, S, S, S, S, S, S],
  [0, 3, 3, S, S, S, S, S, S, S, S],
  [0, 3, 3, 3, 3, 3, S, S, S, S, S],
  [0, 3, 3, S, S, S, S, S, S, S, S],
  [0, 3, S, S, S, S, S, S, S, S, S],
  [0, 3, 3, 3, S, S, S, S, S, S, S],
  [0, S, S, S, S, S, S, S, S, S, S],
  [0, 3, 3, 3, 3, S, S, S, S, S, S],
]
AFTER = [
  [0, 5, 6, 7, S, S, S, S, S, S, S],
  [0, 3, 3, 5, 1, S, S, S, S, S, S],
  [0, 3, 3, 3, 3, 3, 5, S, S, S, S],
  [0, 3, 3, S, S, S, S, S, S, S, S],
  [0, 3, 5, 6, S, S, S, S, S, S, S],
  [0, 3, 3, 3, S, S, S, S, S, S, S],
  [0, 1, S, S, S, S, S, S, S, S, S],
  [0, 3, 3, 3, 3, 5, 6, S, S, S, S],
]
KEPT = [3, 2, 1, 0, 2, 0, 1, 2]
DONE = [False, True, True, True, False, False, True, True]


def _commit(state, block, num_new):
  return loop_state.commit_block(state, block, num_new, SETTINGS)


def test_commit_block_drops_after_eos_and_past_max_decode_len():
  length, done, block, num_new = (np.array(x) for x in zip(*ROWS, strict=True))
  state = _State(
    inputs=jnp.asarray(BEFORE, jnp.int32),
    length=jnp.asarray(length, jnp.int32),
    done=jnp.asarray(done),
  )
  assert state.inputs.shape[1] == SETTINGS.buffer_len
  args = (state, jnp.asarray(block, jnp.int32), jnp.asarray(num_new))
  eager = _commit(*args)
  inputs, new_length, new_done, kept = (np.asarray(x) for x in eager)
  np.testing.assert_array_equal(inputs, AFTER)
  np.testing.assert_array_equal(kept, KEPT)
  np.testing.assert_array_equal(new_length, length + np.array(KEPT))
  np.testing.assert_array_equal(new_done, DONE)
  # The loops run it compiled: the same.
  for got, want in zip(jax.jit(_commit)(*args), eager, strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_gather_reads_each_rows_positions():
  inputs = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
  positions = jnp.asarray([[0, 5, 2], [1, 1, 4]])
  np.testing.assert_array_equal(
    np.asarray(loop_state.gather(inputs, positions)), [[0, 5, 2], [7, 7, 10]]
  )

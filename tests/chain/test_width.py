"""The chain loops are sized by `DecodeSettings.width` and draft
`DecodeSettings.gamma`: a loop given a gamma below its width keeps every
buffer, counter and feature window width wide, hands its drafter the
gamma it drafts now, and decodes greedily as plain decoding does.

A recording drafter (the target as a model draft, declaring that it reads
the target's recent features so that the loop keeps a feature window) notes
what each `propose` call was handed, once per traced iteration body. Had
a sizing site read gamma, the token buffer, the window or the counters
would be gamma wide and these tests fail.
"""

import flax.struct
import numpy as np
import pytest
from _distribution_util import WrappedDrafter
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.chain import loops
from spec_decode.core import model_drafter
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.inputs import row_keys
from spec_decode.policy import finish_time

M = 12
W = 5


@flax.struct.dataclass(kw_only=True)
class Recording(WrappedDrafter):
  """The wrapped drafter, noting what each `propose` call saw."""

  seen: list = flax.struct.field(pytree_node=False)

  uses_recent_features = True

  def propose(self, state, context, settings):
    self.seen.append(
      dict(
        gamma=settings.gamma,
        width=settings.width,
        buffer=context.inputs.shape[1],
        window=context.recent_features.shape[1],
        keys=context.keys.shape[1],
      )
    )
    return super().propose(state, context, settings)


@pytest.fixture(scope='module')
def enc():
  return encoder_batch(4, 7, 16, seed=3)


@pytest.fixture(scope='module')
def plain(target, enc):
  return sd.generate(target, enc, max_decode_len=M)


def _decode(target, enc, settings, policy=None):
  draft = Recording(
    inner=model_drafter.as_drafter(target), uses_target_features=True, seen=[]
  )
  tokens, lengths, counters, _ = loops.speculative_decode_jit(
    target,
    draft,
    np.asarray(enc),
    row_keys(0, enc.shape[0]),
    settings=settings,
    policy=policy,
  )
  counters = {
    k: np.asarray(v) for k, v in vars(counters).items() if v is not None
  }
  return np.asarray(tokens), np.asarray(lengths), counters, draft.seen


def _sized_by_width(counters, seen, gammas):
  assert counters['position_tries'].shape == (4, W)
  assert counters['accepted_histogram'].shape == (4, W + 1)
  assert {s['gamma'] for s in seen} == set(gammas)
  for s in seen:
    assert s['width'] == W
    assert s['buffer'] == M + W + 2
    assert s['window'] == W + 1
    assert s['keys'] == s['gamma']


def test_fixed_loop_drafts_gamma_in_a_loop_width_wide(target, enc, plain):
  settings = DecodeSettings(max_decode_len=M, width=W, gamma=2)
  tokens, lengths, counters, seen = _decode(target, enc, settings)
  np.testing.assert_array_equal(tokens, plain.tokens)
  np.testing.assert_array_equal(lengths, plain.lengths)
  _sized_by_width(counters, seen, [2])
  # Two tokens drafted, tested and (the target's own) accepted per
  # iteration; positions 2.. never drafted.
  np.testing.assert_array_equal(
    counters['proposed'], 2 * counters['iterations']
  )
  assert counters['position_tries'][:, :2].sum() > 0
  assert counters['position_tries'][:, 2:].sum() == 0
  assert counters['accepted_histogram'][:, 3:].sum() == 0


def test_auto_loop_is_sized_by_width_whatever_gamma_says(target, enc, plain):
  # The top-level gamma (1) is not the auto loop's largest: its width is.
  settings = DecodeSettings(
    max_decode_len=M, width=W, gamma=1, gamma_policy=True
  )
  policy = finish_time.PolicyInputs.create(
    np.ones(W + 1), forced_gamma=[3, 1, 2]
  )
  tokens, lengths, counters, seen = _decode(target, enc, settings, policy)
  np.testing.assert_array_equal(tokens, plain.tokens)
  np.testing.assert_array_equal(lengths, plain.lengths)
  # Every gamma's iteration body was traced (the seen calls: 1..W, each
  # handed its own gamma); the forced ones ran.
  _sized_by_width(counters, seen, range(1, W + 1))
  hist = counters['gamma_histogram']
  assert hist.shape == (4, W + 1)
  assert list(np.nonzero(hist.sum(0))[0]) == [1, 2, 3]

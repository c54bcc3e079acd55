"""gamma='auto' switching gamma down: every drafter stays in step with the
committed prefix (issue 43, the chains' half).

The gamma='auto' loop runs a forced schedule (`PolicyInputs.forced_gamma`)
that alternates the largest gamma G = 2 with 1, so an iteration often
follows one that accepted more tokens than it drafts. Drafters that propose
the target's own greedy tokens (`_self_draft_util`), and a hierarchical
draft whose draft model is the target, must have every draft token
accepted. (The chain drafters never relied on the current gamma: a model
draft lags one input, an early exit's own steps wrote the slots it did not
copy, a feature draft re-feeds its whole window of G + 1 inputs; these
tests keep it so.)
"""

import numpy as np
import pytest
from _self_draft_util import SELF_DRAFTS
from _self_draft_util import self_draft
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.chain import loops
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.inputs import row_keys
from spec_decode.drafters import Copy
from spec_decode.drafters import Hierarchical
from spec_decode.policy import finish_time

M = 20
SCHEDULE = [2, 1]


@pytest.fixture(scope='module')
def enc():
  return encoder_batch(8, 7, 16, seed=3)


@pytest.fixture(scope='module')
def plain(target, enc):
  return sd.generate(target, enc, max_decode_len=M)


def _scheduled(target, draft, enc):
  settings = DecodeSettings(
    max_decode_len=M, gamma=max(SCHEDULE), gamma_policy=True
  )
  policy = finish_time.PolicyInputs.create(
    [1.0, 1.5, 1.7], forced_gamma=SCHEDULE
  )
  tokens, lengths, counters, _ = loops.speculative_decode_jit(
    target,
    draft,
    np.asarray(enc),
    row_keys(0, enc.shape[0]),
    settings=settings,
    policy=policy,
  )
  return np.asarray(tokens), np.asarray(lengths), counters


@pytest.mark.parametrize('name', SELF_DRAFTS + ('hierarchical',))
def test_draft_equal_to_target_is_accepted_after_gamma_drops(
  target, enc, plain, name
):
  if name == 'hierarchical':
    # Its proposals are its draft model's greedy tokens, whatever the
    # sub-draft (a cheap one here).
    draft = Hierarchical(
      draft_model=target, sub_draft=Copy(vocab_size=16, max_ngram=3), gamma=2
    )
  else:
    draft = self_draft(name, target)
  tokens, lengths, counters = _scheduled(target, draft, enc)
  np.testing.assert_array_equal(tokens, plain.tokens)
  np.testing.assert_array_equal(lengths, plain.lengths)
  # Every gamma of the schedule ran.
  used = np.asarray(counters.gamma_histogram).sum(0)
  assert list(np.nonzero(used)[0]) == [1, 2]
  tries = int(np.asarray(counters.position_tries).sum())
  accepts = int(np.asarray(counters.position_accepts).sum())
  assert tries >= 60
  assert accepts == tries, f'{accepts} of {tries} accepted'

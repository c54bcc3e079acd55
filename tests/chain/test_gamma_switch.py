"""gamma='auto' switching gamma down: every drafter stays in step with the
committed prefix (issue 43, the chains' half).

The gamma='auto' loop runs a forced schedule (`PolicyInputs.forced_gamma`)
that alternates the largest gamma G = 2 with 1, so an iteration often
follows one that accepted more tokens than it drafts. Drafters that propose
the target's own greedy tokens (`_self_draft_util`), and a hierarchical
draft whose draft model is the target, must have every draft token
accepted. (The model draft lags one input and an early exit's own draft
steps wrote the slots it does not copy: neither relies on the current
gamma.)

The feature draft re-feeds the inputs committed since its last call with
the target's features in place of the ones it predicted (EAGLE's
correction): G + 1 of them after an iteration at G
(`DraftContext.max_accepted`), whatever gamma it drafts now. Its
self-draft above ignores the features, so a slot computed from a predicted
feature would not show there; a draft near the target that reads them is
checked against teacher forcing instead (`test_feature_handoff`'s check).
Without the loop's `max_accepted` it re-feeds only gamma + 1 inputs and
that check fails (q off by 7.0e-03 in a run with it removed).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_feature_handoff as handoff
from _self_draft_util import SELF_DRAFTS
from _self_draft_util import feature_as_target
from _self_draft_util import self_draft
from conftest import encoder_batch
from conftest import sharpened
from conftest import tiny_config

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


def test_feature_draft_refeeds_what_a_larger_gamma_committed():
  target = sharpened(sd.Model.init(tiny_config(num_decoder_layers=3), seed=0))
  draft = feature_as_target(target)
  # The fusion reads the feature a little: near the target (gamma 3 is
  # often accepted in full at temperature 1), but every slot depends on
  # the feature it was computed from.
  d = target.config.emb_dim
  params = jax.tree.map(np.array, draft.params)
  rng = np.random.default_rng(0)
  params['fc']['kernel'][d:] = 0.2 * rng.standard_normal((d, d)) / np.sqrt(d)
  draft = draft.with_params(params)
  enc = jnp.asarray(encoder_batch(6, 7, 16, seed=3))
  keys = jax.random.split(jax.random.key(11), 6)
  rec = handoff.Recorder(inner=draft, width=4)
  inputs, lengths, rec_state, counters = handoff._chain(
    target, rec, enc, keys, (3, 1)
  )
  # Gamma-3 iterations that accepted 2 or 3 tokens, each followed by a
  # gamma-1 one (the case under test).
  assert np.asarray(counters.accepted_histogram)[:, 2:].sum() >= 4
  feat_err, uncovered, q_err = handoff._errors(
    target, draft, enc, np.asarray(inputs), lengths, rec_state
  )
  assert feat_err < 1e-4, feat_err
  assert uncovered == 0
  assert q_err < 1e-4, q_err

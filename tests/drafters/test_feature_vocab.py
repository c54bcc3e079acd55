"""The feature draft's draft vocabulary and narrower feed-forward.

A draft vocabulary (`FeatureDraft.with_draft_vocab`) makes the draft
propose only N ids, with q = 0 at every other one; Algorithm 1's residual
must then produce those from the target with exactly their probability.
Exactness through `generate`: greedy identity, and the whole-sequence G-test
of `_distribution_util` (N = 24,000, false-alarm rate 1e-3, seeds from
3,000,000) with a negative control that scatters the vocabulary's q to the
wrong ids.
"""

import json
import os

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distribution_util import ENC
from _distribution_util import FALSE_ALARM
from _distribution_util import WrappedDrafter
from _distribution_util import exact_probs
from _distribution_util import g_test
from _distribution_util import sample_sequences
from _distribution_util import target_model
from conftest import encoder_batch
from conftest import sharpened
from conftest import tiny_config

import spec_decode as sd
from spec_decode.core import model_drafter
from spec_decode.drafters import on_target
from spec_decode.drafters.feature import FeatureDraft


def _noisy(draft: FeatureDraft, scale: float, seed: int) -> FeatureDraft:
  """The draft with relative noise on every weight (ragged acceptance)."""
  leaves, tree = jax.tree.flatten(draft.params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [
    x + scale * jnp.std(x) * jax.random.normal(k, x.shape)
    for x, k in zip(leaves, keys, strict=True)
  ]
  return draft.with_params(jax.tree.unflatten(tree, noisy))


@pytest.fixture(scope='module')
def model():
  return sharpened(sd.Model.init(tiny_config(num_decoder_layers=3), seed=0))


@pytest.mark.parametrize('kw', [dict(gamma=3), dict(tree=(2, 2, 1))])
def test_greedy_identity_with_a_draft_vocabulary(model, kw):
  """Plain greedy's output, although it holds tokens the draft cannot
  propose (they come from the target's corrections)."""
  enc = encoder_batch(8, 7, 16, seed=9)
  plain = sd.generate(model, enc, max_decode_len=14)
  ids = np.arange(1, 16, 2)  # EOS and the odd ids.
  draft = _noisy(FeatureDraft.init(model, mlp_dim=32), 0.3, 2)
  draft = draft.with_draft_vocab(ids)
  spec = sd.generate(model, enc, draft=draft, max_decode_len=14, **kw)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)
  outside = ~np.isin(plain.tokens, ids) & (plain.tokens > 0)
  assert outside.sum() >= 8
  assert 0.05 < spec.stats.alpha < 0.95


def test_draft_logits_are_the_output_projection_rows(model):
  """`draft_logits` are the target's logits of the N ids; `logits` the
  full vector with -inf elsewhere; chain draws stay inside the ids."""
  draft = FeatureDraft.init(model).with_draft_vocab([9, 2, 5])
  np.testing.assert_array_equal(draft.draft_vocab, [2, 5, 9])
  h = jax.random.normal(jax.random.key(1), (3, model.config.emb_dim))
  full = model.project(h)
  np.testing.assert_allclose(
    draft.draft_logits(h), full[:, [2, 5, 9]], rtol=1e-5, atol=1e-5
  )
  masked = np.asarray(draft.logits(h))
  np.testing.assert_allclose(masked[:, [2, 5, 9]], full[:, [2, 5, 9]], 1e-5)
  assert np.all(np.isneginf(np.delete(masked, [2, 5, 9], axis=1)))
  sampler = sd.Sampler(1.0)
  keys = jax.random.split(jax.random.key(2), 3)
  x, q = model_drafter.draw_in(
    sampler, keys, draft.draft_logits(h), (draft.draft_vocab, 16)
  )
  assert set(np.asarray(x).tolist()) <= {2, 5, 9}
  np.testing.assert_allclose(
    q, sampler.probs(draft.logits(h)), rtol=1e-6, atol=1e-7
  )


def test_bad_draft_vocabularies_are_refused(model):
  draft = FeatureDraft.init(model)
  for ids in ([], [3, 3], [0, 16], [-1], [[1, 2]], [1.5]):
    with pytest.raises(ValueError, match='draft_vocab'):
      draft.with_draft_vocab(ids)


def test_vocabulary_and_width_survive_save_load(model, tmp_path):
  """The ids go with the draft; a checkpoint without them (written before
  draft vocabularies) loads with the full vocabulary."""
  draft = FeatureDraft.init(model, mlp_dim=48).with_draft_vocab([1, 4, 7])
  path = str(tmp_path / 'feature')
  draft.save(path)
  back = FeatureDraft.load(path, model)
  np.testing.assert_array_equal(back.draft_vocab, [1, 4, 7])
  assert back.net_config.mlp_dim == 48 and back.draft_vocab_size == 3
  info_file = os.path.join(path, on_target.INFO_FILE)
  with open(info_file) as f:
    info = json.load(f)
  del info['draft_vocab']
  with open(info_file, 'w') as f:
    json.dump(info, f)
  old = FeatureDraft.load(path, model)
  assert old.draft_vocab is None and old.draft_vocab_size == 16


def test_narrower_mlp_starts_from_the_widest_target_units(model):
  draft = FeatureDraft.init(model, mlp_dim=16)
  src = model.params['decoder']['layers_2']['mlp']
  mlp = draft.params['layers_0']['mlp']
  norm = lambda w, axis: np.linalg.norm(np.asarray(w), axis=axis)
  score = (
    norm(src['wo']['kernel'], 1)
    * norm(src['wi_0']['kernel'], 0)
    * norm(src['wi_1']['kernel'], 0)
  )
  keep = np.sort(np.argsort(-score)[:16])
  np.testing.assert_array_equal(mlp['wo']['kernel'], src['wo']['kernel'][keep])
  for name in ('wi_0', 'wi_1'):
    np.testing.assert_array_equal(
      mlp[name]['kernel'], src[name]['kernel'][:, keep]
    )


# ---------------------------------------------- whole-sequence distribution.

# The V = 6 target's ids 0 (pad), 1 (EOS) and 5 lie outside the vocabulary:
# the draft never proposes them, and every output holds at least one of
# EOS or 5 unless it is four tokens of 2..4.
VOCAB = (2, 3, 4)


@pytest.fixture(scope='module')
def pair():
  target = target_model()
  draft = _noisy(FeatureDraft.init(target, mlp_dim=32), 0.5, 3)
  return target, draft.with_draft_vocab(VOCAB)


@flax.struct.dataclass(kw_only=True)
class MisScattered(WrappedDrafter):
  """Negative control: the vocabulary's q put at ids 0..N-1 instead of at
  its own ids (the id map forgotten when scattering q into V)."""

  uses_recent_features = True
  uses_target_state = True

  def propose(self, state, context, settings):
    proposal, state = self.inner.propose(state, context, settings)
    ids = jnp.asarray(VOCAB)
    q = (
      jnp.zeros_like(proposal.q).at[..., : len(VOCAB)].set(proposal.q[..., ids])
    )
    return proposal.replace(q=q), state


@pytest.mark.parametrize(
  'kw', [dict(gamma=3), dict(tree=(2, 1, 1))], ids=['chain', 'tree']
)
def test_outside_tokens_keep_the_target_probability(pair, kw):
  """At t = 1 the outputs follow the target's distribution (G-test), and
  the tokens outside the vocabulary appear in them (from the residual)."""
  target, draft = pair
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  samples, run_stats = sample_sequences(
    target, draft, ENC, first_seed=3 * 10**6, temperature=1.0, **kw
  )
  assert 0.05 < run_stats[0].alpha < 0.95
  assert g_test(samples, seqs, p) > FALSE_ALARM
  has_five = (seqs == 5).any(1)
  expected = p[has_five].sum() * len(samples)
  seen = (samples == 5).any(1).sum()
  assert abs(seen - expected) < 5 * np.sqrt(expected)


def test_negative_control_mis_scattered_q(pair):
  """The same test, draft, seeds and N reject q scattered to wrong ids."""
  target, draft = pair
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  samples, _ = sample_sequences(
    target,
    MisScattered(inner=draft, uses_target_features=True),
    ENC,
    first_seed=3 * 10**6,
    gamma=3,
    temperature=1.0,
  )
  assert g_test(samples, seqs, p) < FALSE_ALARM

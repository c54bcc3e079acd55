"""Tests of the EAGLE-style feature draft (`drafters.feature`).

Exactness (greedy identity, whole-sequence distribution with a negative
control) through `generate`; the draft's in-loop state against teacher
forcing; checkpoints. The loops' hand-off of the target's features is
tested in `tests/chain/test_feature_handoff.py`, training in
`tests/train/test_feature_train.py`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distribution_util import ENC
from _distribution_util import FALSE_ALARM
from _distribution_util import ResidualDroppingVerifier
from _distribution_util import exact_probs
from _distribution_util import g_test
from _distribution_util import sample_sequences
from _distribution_util import target_model
from conftest import encoder_batch
from conftest import sharpened
from conftest import tiny_config

import spec_decode as sd
from spec_decode.core import drafter
from spec_decode.core import sampling
from spec_decode.core import tree_shape
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.drafters.feature import FeatureDraft
from spec_decode.models.t5_model import shift_right


@pytest.fixture(scope='module')
def model():
  return sharpened(sd.Model.init(tiny_config(num_decoder_layers=3), seed=0))


def _noisy(draft: FeatureDraft, scale: float, seed: int) -> FeatureDraft:
  """The draft with relative noise on every weight (ragged acceptance)."""
  leaves, tree = jax.tree.flatten(draft.params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [
    x + scale * jnp.std(x) * jax.random.normal(k, x.shape)
    for x, k in zip(leaves, keys, strict=True)
  ]
  return draft.with_params(jax.tree.unflatten(tree, noisy))


def _committed_context(model, enc, outputs, n, width, gamma, temperature):
  """A context at lengths `n [B]` with the target's state after the
  committed inputs and its features of the last `width` inputs, saying
  that the previous iteration may have committed all `width` of them
  (`max_accepted`: the draft re-feeds them all)."""
  b, length = outputs.shape[0], outputs.shape[1] + 8
  inputs = np.zeros((b, length), np.int32)
  inputs[:, 1 : outputs.shape[1] + 1] = outputs
  state = model.init_state(enc, length)
  _, feats, state = model.score_with_features(
    state, jnp.asarray(inputs[:, : outputs.shape[1]])
  )
  n = jnp.asarray(n, jnp.int32)
  cols = n[:, None] - width + jnp.arange(width)[None]
  window = jnp.take_along_axis(feats, jnp.clip(cols, 0)[..., None], 1)
  window = jnp.where((cols >= 0)[..., None], window, 0.0)
  keys = sampling.position_keys(
    jax.random.split(jax.random.key(0), b),
    n[:, None] + 1 + jnp.arange(gamma)[None],
    0,
  )
  context = drafter.DraftContext(
    inputs=jnp.asarray(inputs),
    length=n,
    encoder_tokens=enc,
    keys=keys,
    target_features=window[:, -1],
    recent_features=window,
    target_state=model.rollback(state, n),
    max_accepted=width - 1,
  )
  settings = DecodeSettings(
    max_decode_len=length, sampler=sd.Sampler(temperature), gamma=gamma
  )
  return context, settings, inputs


def test_propose_equals_the_teacher_forced_draft(model):
  """From a fresh state, a window as long as the prefix makes the draft's
  cache what teacher forcing on the target's features computes: the first
  token's q is the teacher-forced draft distribution at input n."""
  enc = jnp.asarray(encoder_batch(3, 6, 16, seed=2))
  outputs = np.random.default_rng(1).integers(2, 16, (3, 9)).astype(np.int32)
  n = [0, 4, 8]
  context, settings, inputs = _committed_context(
    model, enc, outputs, n, 9, 3, 1.0
  )
  draft = _noisy(FeatureDraft.init(model, num_layers=2), 0.5, 1)
  prop, state = jax.jit(lambda s, c: draft.propose(s, c, settings))(
    draft.init_draft(enc, 20), context
  )
  dec = jnp.asarray(inputs[:, :10])
  predicted = draft.teacher_forced(enc, dec, model.features(enc, dec))
  want = jax.nn.softmax(draft.logits(predicted[jnp.arange(3), jnp.asarray(n)]))
  np.testing.assert_allclose(prop.q[:, 0], want, atol=2e-5)
  np.testing.assert_array_equal(state.cache.index, np.asarray(n) + 3)
  # The token was drawn from that q with the context's key.
  drawn = jax.vmap(sampling.sample)(context.keys[:, 0], prop.q[:, 0])
  np.testing.assert_array_equal(prop.tokens[:, 0], drawn)


def test_tree_root_is_the_chain_first_token(model):
  enc = jnp.asarray(encoder_batch(2, 6, 16, seed=3))
  outputs = np.random.default_rng(2).integers(2, 16, (2, 9)).astype(np.int32)
  shape = tree_shape.from_branching((2, 2, 1))
  context, settings, _ = _committed_context(
    model, enc, outputs, [3, 6], shape.depth + 1, shape.depth, 1.0
  )
  draft = FeatureDraft.init(model)
  chain, _ = jax.jit(lambda s, c: draft.propose(s, c, settings))(
    draft.init_draft(enc, 30), context
  )
  tree, _ = jax.jit(lambda s, c: draft.propose_tree(s, c, settings, shape))(
    draft.init_draft(enc, 30), context
  )
  # Node 1 (the rank-0 child of the root) is drawn as the chain's first.
  np.testing.assert_array_equal(tree.tokens[:, 0], chain.tokens[:, 0])
  np.testing.assert_allclose(tree.q[:, 0], chain.q[:, 0], atol=1e-6)
  assert bool(jnp.all(tree.valid))


@pytest.mark.parametrize(
  'kw',
  [
    dict(gamma=3),
    dict(tree=(2, 2, 1)),
    dict(tree=sd.DynamicTree((2, 3, 2), width=2)),
    dict(gamma='auto'),
    dict(gamma=4, dynamic_gamma=0.2),
  ],
)
def test_greedy_identity_batch_8(model, kw):
  """Chains, trees (static and dynamic), gamma='auto' and dynamic gamma
  (rows stop drafting at low draft confidence): the output is plain
  greedy's, with rows that accept different numbers of tokens."""
  enc = encoder_batch(8, 7, 16, seed=9)
  plain = sd.generate(model, enc, max_decode_len=14)
  draft = _noisy(FeatureDraft.init(model), 0.3, 2)
  extra = dict(max_auto_gamma=3) if kw.get('gamma') == 'auto' else {}
  spec = sd.generate(model, enc, draft=draft, max_decode_len=14, **kw, **extra)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)
  hist = spec.stats.row_accepted_histogram
  assert len({tuple(h) for h in hist}) > 2
  if 'dynamic_gamma' in kw:  # Some rows stopped early.
    assert 1.0 <= spec.stats.mean_proposed < 4.0


@pytest.fixture(scope='module')
def pair():
  """The distribution tests' tiny target (V = 6) and a feature draft."""
  target = target_model()
  return target, _noisy(FeatureDraft.init(target), 0.5, 3)


SETTINGS = {
  'chain_t1': dict(gamma=3, temperature=1.0),
  'tree_top_k_top_p': dict(tree=(2, 1, 1), temperature=0.8, top_k=4, top_p=0.9),
}


@pytest.mark.parametrize('name', sorted(SETTINGS))
def test_sampled_feature_draft_samples_the_target(pair, name):
  """Whole-sequence G-test (N = 24,000, false-alarm rate 1e-3,
  `_distribution_util`), seeds from 2,000,000."""
  target, draft = pair
  kw = dict(SETTINGS[name])
  sampler = sd.Sampler(
    kw['temperature'], kw.get('top_k', 0), kw.get('top_p', 1.0)
  )
  seqs, p = exact_probs(target, ENC, sampler)
  samples, run_stats = sample_sequences(
    target, draft, ENC, first_seed=2 * 10**6, **kw
  )
  assert 0.05 < run_stats[0].alpha < 0.95
  assert len({tuple(h) for h in run_stats[0].row_accepted_histogram}) > 3
  assert g_test(samples, seqs, p) > FALSE_ALARM


def test_negative_control_feature_draft_residual_dropped(pair):
  """The same test, draft, seeds and N reject a verifier that samples p
  instead of the residual after a rejection."""
  target, draft = pair
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  samples, _ = sample_sequences(
    target,
    draft,
    ENC,
    first_seed=2 * 10**6,
    gamma=3,
    temperature=1.0,
    verifier=ResidualDroppingVerifier(),
  )
  assert g_test(samples, seqs, p) < FALSE_ALARM


def test_init_from_target_copies_the_last_layers(model):
  draft = FeatureDraft.init(model, num_layers=2)
  assert draft.cross_layers == (1, 2)
  dec = model.params['decoder']
  for i, j in enumerate(draft.cross_layers):
    np.testing.assert_array_equal(
      draft.params[f'layers_{i}']['mlp']['wo']['kernel'],
      dec[f'layers_{j}']['mlp']['wo']['kernel'],
    )
  assert 'key' not in draft.params['layers_0']['encoder_decoder_attention']
  with pytest.raises(ValueError, match='cross_layers'):
    FeatureDraft.init(model, num_layers=1, cross_layers=(3,))


def test_save_load_round_trip(model, tmp_path):
  draft = _noisy(FeatureDraft.init(model, num_layers=1, mlp_dim=48), 0.1, 4)
  path = str(tmp_path / 'feature')
  draft.save(path)
  back = FeatureDraft.load(path, model)
  assert back.net_config == draft.net_config
  assert back.cross_layers == draft.cross_layers
  for a, b in zip(
    jax.tree.leaves(draft.params), jax.tree.leaves(back.params), strict=True
  ):
    np.testing.assert_array_equal(a, b)
  other = sd.Model.init(tiny_config(emb_dim=16), seed=1)
  with pytest.raises(ValueError, match='another target'):
    FeatureDraft.load(path, other)


def test_teacher_forced_positions_read_the_previous_feature(model):
  """Input t reads the target's feature of input t - 1 (zeros at 0)."""
  enc = jnp.asarray(encoder_batch(2, 5, 16, seed=5))
  dec = jnp.asarray(
    shift_right(np.random.default_rng(3).integers(2, 16, (2, 6), np.int32))
  )
  feats = model.features(enc, dec)
  draft = FeatureDraft.init(model)
  full = draft.teacher_forced(enc, dec, feats)
  # Changing the last feature changes nothing the draft predicts.
  changed = draft.teacher_forced(enc, dec, feats.at[:, -1].add(5.0))
  np.testing.assert_allclose(full, changed, atol=1e-6)
  changed = draft.teacher_forced(enc, dec, feats.at[:, 2].add(5.0))
  np.testing.assert_allclose(full[:, :3], changed[:, :3], atol=1e-6)
  assert float(jnp.max(jnp.abs(full[:, 3] - changed[:, 3]))) > 1e-3

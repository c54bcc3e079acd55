"""Tests of the early-exit self-draft (`drafters.early_exit`).

What it shares with the target equals what it would compute itself
(teacher forcing), exactness through `generate` (greedy identity, a
whole-sequence distribution test with a negative control).
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
from spec_decode.drafters.early_exit import EarlyExit
from spec_decode.drafters.early_exit import truncated


@pytest.fixture(scope='module')
def model():
  return sharpened(sd.Model.init(tiny_config(num_decoder_layers=3), seed=0))


def test_truncated_model_is_the_first_layers(model):
  """The cut model's teacher-forced self-attention keys and values are the
  target's of the same layers; its logits differ (fewer layers)."""
  enc = jnp.asarray(encoder_batch(2, 6, 16, seed=1))
  dec = jnp.asarray(np.random.default_rng(0).integers(1, 16, (2, 8)))
  dec = dec.at[:, 0].set(0)
  cut = truncated(model, 2)
  assert cut.config.num_decoder_layers == 2
  s_full = model.score(model.init_state(enc, 10), dec)[1]
  s_cut = cut.score(cut.init_state(enc, 10), dec)[1]
  for i in range(2):
    np.testing.assert_allclose(
      s_cut.cache.keys[i], s_full.cache.keys[i], atol=1e-6
    )
    np.testing.assert_allclose(
      s_cut.cache.values[i], s_full.cache.values[i], atol=1e-6
    )
    np.testing.assert_array_equal(s_cut.cross.keys[i], s_full.cross.keys[i])
  assert not np.allclose(cut.logits(enc, dec), model.logits(enc, dec))
  with pytest.raises(ValueError, match='num_layers must be in'):
    EarlyExit.of(model, 4)


def _context(model, enc, inputs, n, gamma):
  b = inputs.shape[0]
  state = model.init_state(enc, inputs.shape[1])
  _, state = model.score(state, jnp.asarray(inputs[:, :10]))
  n = jnp.asarray(n, jnp.int32)
  return drafter.DraftContext(
    inputs=jnp.asarray(inputs),
    length=n,
    encoder_tokens=enc,
    keys=sampling.position_keys(
      jax.random.split(jax.random.key(0), b),
      n[:, None] + 1 + jnp.arange(gamma)[None],
      0,
    ),
    target_state=model.rollback(state, n),
  )


@pytest.mark.parametrize('tree', [False, True])
def test_shared_slots_and_first_q_equal_teacher_forcing(model, tree):
  """After a propose at lengths n, the draft's cache slots of the
  committed inputs equal the cut model's teacher-forced ones (copied from
  the target where the draft did not compute them), and the first token's
  q is the cut model's teacher-forced distribution at input n."""
  enc = jnp.asarray(encoder_batch(3, 6, 16, seed=2))
  inputs = np.zeros((3, 24), np.int32)
  inputs[:, 1:11] = np.random.default_rng(1).integers(2, 16, (3, 10))
  n = np.asarray([1, 5, 9])
  ee = EarlyExit.of(model, 2)
  cut = ee.model()
  shape = tree_shape.from_branching((2, 1))
  gamma = shape.depth if tree else 3
  context = _context(model, enc, inputs, n, gamma)
  settings = DecodeSettings(
    max_decode_len=12, sampler=sd.Sampler(1.0), gamma=gamma
  )
  # The draft's own cache holds the inputs up to n - 1 - K (as after
  # earlier iterations), garbage later.
  own = cut.score(cut.init_state(enc, 24), jnp.asarray(inputs[:, :10]))[1]
  width = shape.depth + 1 if tree else 1
  keep = jnp.asarray(np.maximum(n - width, 0), jnp.int32)
  noise = jax.tree.map(lambda x: x + 7.0, own.cache)
  mixed = jax.tree.map(
    lambda a, b: jnp.where(
      jnp.arange(24)[None, None, None] < keep[:, None, None, None], a, b
    ),
    own.cache.keys + own.cache.values,
    noise.keys + noise.values,
  )
  state = ee.init_draft(enc, 24).replace(
    cache=own.cache.replace(keys=mixed[:2], values=mixed[2:])
  )
  if tree:
    run = lambda s, c: ee.propose_tree(s, c, settings, shape)  # noqa: E731
  else:
    run = lambda s, c: ee.propose(s, c, settings)  # noqa: E731
  prop, new = jax.jit(run)(state, context)
  for i in range(2):
    for b in range(3):
      np.testing.assert_allclose(
        new.cache.keys[i][b, ..., : n[b]],
        own.cache.keys[i][b, ..., : n[b]],
        atol=1e-5,
      )
  want = jax.nn.softmax(cut.logits(enc, jnp.asarray(inputs[:, :11])))
  np.testing.assert_allclose(
    prop.q[:, 0], want[jnp.arange(3), jnp.asarray(n)], atol=2e-5
  )


@pytest.mark.parametrize(
  'kw',
  [
    dict(gamma=3),
    dict(tree=(2, 2, 1)),
    dict(tree=sd.DynamicTree((2, 3, 2), width=2)),
  ],
)
def test_greedy_identity_batch_8(model, kw):
  enc = encoder_batch(8, 7, 16, seed=9)
  plain = sd.generate(model, enc, max_decode_len=14)
  for k in (1, 2):
    spec = sd.generate(
      model, enc, draft=EarlyExit.of(model, k), max_decode_len=14, **kw
    )
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.lengths, plain.lengths)
  hist = spec.stats.row_accepted_histogram
  assert len({tuple(h) for h in hist}) > 2


def test_all_layers_is_the_target(model):
  """k = all layers proposes the target's own tokens: every greedy
  proposal is accepted."""
  enc = encoder_batch(4, 7, 16, seed=4)
  spec = sd.generate(
    model, enc, draft=EarlyExit.of(model, 3), gamma=3, max_decode_len=14
  )
  assert spec.stats.alpha == pytest.approx(1.0)


def test_sampled_self_draft_samples_the_target():
  """Whole-sequence G-test at temperature 1 (N = 24,000, false-alarm rate
  1e-3, `_distribution_util`), seeds from 3,000,000, then the negative
  control (the residual dropped) at the same N and seeds must fail."""
  target = target_model()
  draft = EarlyExit.of(target, 1)
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  kw = dict(first_seed=3 * 10**6, gamma=3, temperature=1.0)
  samples, run_stats = sample_sequences(target, draft, ENC, **kw)
  assert 0.05 < run_stats[0].alpha < 0.95
  assert g_test(samples, seqs, p) > FALSE_ALARM
  samples, _ = sample_sequences(
    target, draft, ENC, verifier=ResidualDroppingVerifier(), **kw
  )
  assert g_test(samples, seqs, p) < FALSE_ALARM

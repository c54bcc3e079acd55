"""Hierarchical drafting (draft-of-draft) is exact at both levels.

Outer level: speculative decoding with a `Hierarchical` draft equals plain
greedy decoding, and samples the target's distribution (whole-sequence
G-test of `_distribution_util`: N = 24,000 sequences, false-alarm rate
1e-3). Inner level: the G tokens one `propose` returns are distributed as
the draft model's own samples (G-test of N = 24,000 proposals against the
exact distribution of the V^G = 216 continuations, false-alarm rate 1e-3),
its `q` is the draft model's distribution at every proposed position (by
teacher forcing, through outer iterations that accept 0..G tokens), and in
greedy mode it proposes exactly the draft model's greedy tokens.

Negative controls: an inner verifier that drops the residual (inner G-test)
and a drafter reporting the sub-draft's q instead of the draft model's
(outer G-test) must both be detected at the same N.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distribution_util import ENC
from _distribution_util import FALSE_ALARM
from _distribution_util import N
from _distribution_util import ResidualDroppingVerifier
from _distribution_util import V
from _distribution_util import WrappedDrafter
from _distribution_util import exact_probs
from _distribution_util import g_test
from _distribution_util import sample_sequences
from _distribution_util import target_model
from conftest import encoder_batch
from conftest import perturbed
from conftest import tiny_config

import spec_decode as sd
from spec_decode.core import drafter
from spec_decode.core import sampling
from spec_decode.core.inputs import row_keys
from spec_decode.drafters.hierarchical import Hierarchical
from spec_decode.drafters.hierarchical import summarize
from spec_decode.models.t5_model import shift_right

BATCH = 4_000


def _total(parts):
  return jax.tree.map(lambda *x: np.sum(np.stack(x), 0), *parts)


# --------------------------------------------------------------- greedy


@pytest.fixture(scope='module')
def greedy_models(target, near_draft):
  """Draft model near the target, sub-draft near the draft model."""
  return target, near_draft, perturbed(near_draft, 0.3, seed=5)


@pytest.mark.parametrize('gamma', [1, 3, 4])
def test_greedy_equals_plain_and_proposes_the_draft_models_tokens(
  greedy_models, gamma
):
  target, draft, sub = greedy_models
  enc = encoder_batch(8, 7, 16, seed=0)
  plain = sd.generate(target, enc, max_decode_len=24)
  # EOS inside the horizon for some rows, not all.
  assert (plain.lengths < 24).sum() >= 2 and (plain.lengths == 24).sum() >= 2
  parts = []
  h = Hierarchical(draft, sub, gamma=2, stats_callback=parts.append)
  out = sd.generate(target, enc, draft=h, gamma=gamma, max_decode_len=24)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  # The proposals are the draft model's greedy tokens: every iteration
  # accepts what a plain draft-model draft would have.
  ref = sd.generate(target, enc, draft=draft, gamma=gamma, max_decode_len=24)
  np.testing.assert_array_equal(
    out.stats.row_accepted_histogram, ref.stats.row_accepted_histogram
  )
  assert len({tuple(r) for r in out.stats.row_accepted_histogram}) > 2
  inner = _total(parts)
  assert 0.05 < summarize(inner)['acceptance'] < 0.95
  assert len(set((inner.accepted / inner.tested).round(3).tolist())) > 2


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_sub_draft_equal_to_draft_model_is_always_accepted(
  greedy_models, temperature
):
  """Sub-draft states stay right across outer iterations (0..G accepted)."""
  target, draft, _ = greedy_models
  enc = encoder_batch(16, 7, 16, seed=0)
  parts = []
  h = Hierarchical(draft, draft, gamma=2, stats_callback=parts.append)
  out = sd.generate(
    target, enc, draft=h, gamma=3, temperature=temperature, max_decode_len=24
  )
  hist = out.stats.accepted_histogram
  assert hist[0] > 0 and hist[-1] > 0
  inner = summarize(_total(parts))
  assert inner['tested'] > 100
  assert inner['acceptance'] == 1.0


def test_table_lms_as_target_draft_model_and_sub_draft():
  target = sd.TableLM.random(16, seed=1, scale=3.0)
  draft = sd.TableLM(
    table=target.table
    + jnp.asarray(
      np.random.default_rng(2).normal(0, 1.0, (16, 16)), jnp.float32
    )
  )
  sub = sd.TableLM.random(16, seed=3, scale=2.0)
  enc = encoder_batch(8, 5, 16, seed=0)
  plain = sd.generate(target, enc, max_decode_len=20)
  h = Hierarchical(draft, sub, gamma=3)
  out = sd.generate(target, enc, draft=h, gamma=4, max_decode_len=20)
  ref = sd.generate(target, enc, draft=draft, gamma=4, max_decode_len=20)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(
    out.stats.row_accepted_histogram, ref.stats.row_accepted_histogram
  )


def test_rejects_bad_arguments(greedy_models):
  _, draft, _ = greedy_models
  with pytest.raises(ValueError, match='gamma'):
    Hierarchical(draft, draft, gamma=0)
  h = Hierarchical(draft, sd.TableLM.random(5), gamma=2)
  with pytest.raises(ValueError, match='vocabularies'):
    h.init_draft(jnp.ones((1, 3), jnp.int32), 8)


# ------------------------------------------------- propose, called directly

G_INNER = 3
PREFIX = [3]  # The output token before the tested proposal (n = 1).


@pytest.fixture(scope='module')
def sampled_models():
  """Tiny target (V = 6), a 1-layer draft model, a bigram sub-draft."""
  draft = sd.Model.init(tiny_config(vocab_size=V, num_decoder_layers=1), seed=4)
  return target_model(), draft, sd.TableLM.random(V, seed=5, scale=1.0)


def _settings(temperature, gamma=G_INNER):
  return sd.DecodeSettings(
    max_decode_len=8, sampler=sd.Sampler(temperature), gamma=gamma
  )


def _context(inputs, length, seeds, enc, gamma=G_INNER):
  positions = length[:, None] + 1 + jnp.arange(gamma)[None]
  keys = row_keys(np.asarray(seeds), len(seeds))
  return drafter.DraftContext(
    inputs=jnp.asarray(inputs, jnp.int32),
    length=jnp.asarray(length, jnp.int32),
    encoder_tokens=jnp.asarray(enc),
    keys=sampling.position_keys(keys, positions, 0),
  )


def _propose_fn(settings):
  return jax.jit(lambda h, s, c: h.propose(s, c, settings))


def _proposals(h, seeds, settings):
  """Tokens `[N, G]` proposed after PREFIX, one row per seed.

  As in a decode: a first proposal at n = 0, then (the outer loop having
  accepted none of it and emitted PREFIX) the tested one at n = 1.
  """
  propose = _propose_fn(settings)
  width = settings.buffer_len
  out = []
  for start in range(0, len(seeds), BATCH):
    rows = seeds[start : start + BATCH]
    inputs = np.zeros((len(rows), width), np.int32)
    length = np.zeros((len(rows),), np.int32)
    enc = np.repeat(ENC, len(rows), 0)
    state = h.init_draft(jnp.asarray(enc), width)
    _, state = propose(h, state, _context(inputs, length, rows + N, enc))
    inputs[:, 1 : 1 + len(PREFIX)] = PREFIX
    length[:] = len(PREFIX)
    proposal, _ = propose(h, state, _context(inputs, length, rows, enc))
    out.append(np.asarray(proposal.tokens))
  return np.concatenate(out)


def _continuation_probs(model, sampler):
  """All V^G continuations of PREFIX and their exact probabilities."""
  grids = np.meshgrid(*([np.arange(V)] * G_INNER), indexing='ij')
  conts = np.stack([g.ravel() for g in grids], 1).astype(np.int32)
  seqs = np.concatenate([np.tile(PREFIX, (len(conts), 1)), conts], 1)
  logits = model.logits(np.repeat(ENC, len(seqs), 0), shift_right(seqs))
  probs = np.asarray(sampler.probs(logits), np.float64)[:, len(PREFIX) :]
  per_token = np.take_along_axis(probs, conts[..., None], -1)[..., 0]
  p = per_token.prod(1)
  np.testing.assert_allclose(p.sum(), 1.0, atol=1e-4)
  return conts, p


def test_proposals_are_the_draft_models_samples(sampled_models):
  _, draft, sub = sampled_models
  settings = _settings(1.0)
  conts, p = _continuation_probs(draft, settings.sampler)
  parts = []
  h = Hierarchical(draft, sub, gamma=2, stats_callback=parts.append)
  samples = _proposals(h, np.arange(N), settings)
  assert g_test(samples, conts, p) > FALSE_ALARM
  # Rows of one batch accepted different numbers of sub-draft tokens.
  inner = parts[1]
  assert len(set(inner.accepted.tolist())) >= 3
  assert 0.1 < summarize(_total(parts))['acceptance'] < 0.9


def test_negative_control_inner_residual_dropped_is_detected(sampled_models):
  _, draft, sub = sampled_models
  settings = _settings(1.0)
  conts, p = _continuation_probs(draft, settings.sampler)
  h = Hierarchical(draft, sub, gamma=2, verifier=ResidualDroppingVerifier())
  samples = _proposals(h, np.arange(N), settings)
  assert g_test(samples, conts, p) < FALSE_ALARM


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_q_and_tokens_follow_the_draft_model_across_iterations(
  sampled_models, temperature
):
  """Outer iterations accepting 0..G tokens keep the draft model's state.

  Row b accepts `(b + step) % (G + 1)` proposed tokens, then a token of its
  own; at every step q must be the draft model's distribution (teacher
  forcing) at each proposed position, and greedy tokens its argmax chain.
  """
  _, draft, sub = sampled_models
  settings = _settings(temperature)
  sampler = settings.sampler
  rows, width = 12, 64
  enc = np.repeat(ENC, rows, 0)
  h = Hierarchical(draft, sub, gamma=2)
  propose = _propose_fn(settings)
  state = h.init_draft(jnp.asarray(enc), width)
  inputs = np.zeros((rows, width), np.int32)
  length = np.zeros((rows,), np.int32)
  rng = np.random.default_rng(0)
  for step in range(6):
    ctx = _context(inputs, length, np.arange(rows) + 100 * step, enc)
    proposal, state = propose(h, state, ctx)
    tokens = np.asarray(proposal.tokens)
    top = int(length.max()) + G_INNER
    full = inputs[:, 1 : top + 1].copy()
    for b in range(rows):
      full[b, length[b] : length[b] + G_INNER] = tokens[b]
    probs = np.asarray(sampler.probs(draft.logits(enc, shift_right(full))))
    cols = length[:, None] + np.arange(G_INNER)[None]
    expected = np.take_along_axis(probs, cols[..., None], 1)
    if temperature == 0.0:
      assert proposal.q is None
      np.testing.assert_array_equal(tokens, expected.argmax(-1))
    else:
      np.testing.assert_allclose(proposal.q, expected, atol=1e-5)
    accept = (np.arange(rows) + step) % (G_INNER + 1)
    for b in range(rows):
      n, a = length[b], accept[b]
      inputs[b, n + 1 : n + 1 + a] = tokens[b, :a]
      inputs[b, n + 1 + a] = rng.integers(2, V)
      length[b] = n + a + 1


# ------------------------------------------------------------ outer level


@flax.struct.dataclass(kw_only=True)
class _SubDraftQ(WrappedDrafter):
  """Negative control: reports the bigram sub-draft's q, not the model's."""

  def propose(self, state, context, settings):
    proposal, state = self.inner.propose(state, context, settings)
    newest = jnp.take_along_axis(context.inputs, context.length[:, None], 1)
    prev = jnp.concatenate([newest, proposal.tokens[:, :-1]], 1)
    table = self.inner.sub_draft.table
    q = settings.sampler.probs(jnp.take(table, prev, axis=0))
    return proposal.replace(q=q), state


def test_speculative_with_hierarchical_draft_samples_the_target(
  sampled_models,
):
  target, draft, sub = sampled_models
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  h = Hierarchical(draft, sub, gamma=2)
  samples, run_stats = sample_sequences(
    target, h, ENC, gamma=3, temperature=1.0
  )
  per_row = run_stats[0].row_accepted_histogram
  assert len({tuple(r) for r in per_row}) > 5
  assert 0.05 < run_stats[0].alpha < 0.95
  assert g_test(samples, seqs, p) > FALSE_ALARM


def test_negative_control_sub_draft_q_reported_is_detected(sampled_models):
  target, draft, sub = sampled_models
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  wrong = _SubDraftQ(inner=Hierarchical(draft, sub, gamma=2))
  samples, _ = sample_sequences(target, wrong, ENC, gamma=3, temperature=1.0)
  assert g_test(samples, seqs, p) < FALSE_ALARM


def test_stats_without_a_cpu_backend_fail_before_decoding(
  greedy_models, monkeypatch
):
  """`jax.debug.callback` needs a CPU device; `JAX_PLATFORMS=cuda` alone
  has none (seen on an H100), which must be said at trace time."""
  target, draft, sub = greedy_models
  enc = encoder_batch(2, 7, 16, seed=0)
  real = jax.devices

  def no_cpu(backend=None):
    if backend == 'cpu':
      raise RuntimeError('Unknown backend cpu')
    return real(backend)

  monkeypatch.setattr(jax, 'devices', no_cpu)
  h = Hierarchical(draft, sub, gamma=2, stats_callback=lambda c: None)
  with pytest.raises(ValueError, match="JAX_PLATFORMS='cuda,cpu'"):
    sd.generate(target, enc, draft=h, gamma=3, max_decode_len=8)
  # Without statistics no callback is traced, and decoding runs.
  plain = Hierarchical(draft, sub, gamma=2)
  out = sd.generate(target, enc, draft=plain, gamma=3, max_decode_len=8)
  assert out.tokens.shape == (2, 8)

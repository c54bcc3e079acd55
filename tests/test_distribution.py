"""Whole-sequence distribution tests: speculative sampling samples the target.

Method. A tiny target (vocabulary 6, EOS = 1) decodes sequences of at most
M = 4 tokens for one input; every possible output (EOS ends a sequence, pad
after it) is enumerated, 1 + 5 + 25 + 125 + 625 = 781 of them, and its exact
probability under the target's sampling distribution is computed by teacher
forcing. N = 24,000 speculative samples (rows of different seeds, in batches
of 4,000 whose rows accept different numbers of tokens) are compared with it
by a G-test: sequences with expected count >= 5 are their own bins, the rest
are pooled into one; degrees of freedom = bins - 1. A test fails when the
p-value is below 1e-3, its false-alarm rate. Any sample the target gives zero
probability fails at once.

Negative control: a verifier that, after a rejection, samples the target's p
instead of the residual norm(max(0, p - q)) (a plausible bug) produces a
different distribution; the same test at the same N must reject it.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from scipy import stats

import spec_decode as sd
from spec_decode import speculative
from spec_decode.models import shift_right

V, M, N, BATCH = 6, 4, 24_000, 4_000
FALSE_ALARM = 1e-3


@dataclasses.dataclass(frozen=True)
class ResidualDroppingVerifier:
  """Negative control: on rejection, samples p instead of the residual."""

  def __call__(
    self, p, q, draft_tokens, uniforms, bonus_keys, residual_keys, greedy=False
  ):
    exact = speculative.ExactVerifier()(
      p, q, draft_tokens, uniforms, bonus_keys, residual_keys, greedy
    )
    rows = jnp.arange(p.shape[0])
    wrong = jax.vmap(sd.sampling.sample)(
      residual_keys[rows, exact.accepted], p[rows, exact.accepted]
    )
    g = q.shape[1]
    return exact.replace(
      next_token=jnp.where(exact.accepted == g, exact.next_token, wrong)
    )


def _all_sequences() -> np.ndarray:
  seqs = []
  non_eos = [t for t in range(V) if t != sd.EOS_ID]
  for length in range(1, M + 1):
    grids = np.meshgrid(*([non_eos] * (length - 1)), indexing='ij')
    prefixes = (
      np.stack([g.ravel() for g in grids], 1)
      if grids
      else np.zeros((1, 0), int)
    )
    for pre in prefixes:
      seqs.append(list(pre) + [sd.EOS_ID] + [0] * (M - length))
  grids = np.meshgrid(*([non_eos] * M), indexing='ij')
  seqs.extend(np.stack([g.ravel() for g in grids], 1).tolist())
  return np.asarray(seqs, np.int32)


def _exact_probs(model, enc, sampler) -> tuple[np.ndarray, np.ndarray]:
  seqs = _all_sequences()
  logits = model.logits(np.repeat(enc, len(seqs), 0), shift_right(seqs))
  probs = np.asarray(sampler.probs(logits), np.float64)
  per_token = np.take_along_axis(probs, seqs[..., None], -1)[..., 0]
  is_eos = seqs == sd.EOS_ID
  length = np.where(is_eos.any(1), is_eos.argmax(1) + 1, M)
  mask = np.arange(M)[None] < length[:, None]
  p = np.prod(np.where(mask, per_token, 1.0), axis=1)
  np.testing.assert_allclose(p.sum(), 1.0, atol=1e-4)
  return seqs, p


def g_test(samples: np.ndarray, seqs: np.ndarray, p: np.ndarray) -> float:
  """p-value of the G-test of `samples [N, M]` against P(seqs) = p."""
  index = {tuple(s): i for i, s in enumerate(seqs)}
  counts = np.zeros(len(seqs))
  for s in map(tuple, samples):
    assert s in index and p[index[s]] > 0, f'impossible sample {s}'
    counts[index[s]] += 1
  expected = len(samples) * p
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  exp = exp * obs.sum() / exp.sum()
  nz = obs > 0
  g = 2.0 * np.sum(obs[nz] * np.log(obs[nz] / exp[nz]))
  return float(stats.chi2.sf(g, len(obs) - 1))


def _sample(target, draft, enc, **kwargs) -> tuple[np.ndarray, list]:
  out, hists = [], []
  for start in range(0, N, BATCH):
    res = sd.generate(
      target,
      np.repeat(enc, BATCH, 0),
      draft=draft,
      max_decode_len=M,
      seed=np.arange(start, start + BATCH),
      **kwargs,
    )
    out.append(res.tokens)
    hists.append(res.stats)
  return np.concatenate(out), hists


@pytest.fixture(scope='module')
def models():
  cfg = tiny_config(vocab_size=V)
  target = sd.Model.init(cfg, seed=3)
  draft = sd.Model.init(cfg.replace(num_decoder_layers=1), seed=4)
  return target, draft


ENC = np.array([[3, 4, 5, 2, 0]], np.int32)

SETTINGS = {
  'temperature_1': dict(temperature=1.0),
  'temperature_0.7_top_k_3': dict(temperature=0.7, top_k=3),
  'top_p_0.8': dict(temperature=1.0, top_p=0.8),
}


@pytest.mark.parametrize('name', sorted(SETTINGS))
def test_speculative_samples_the_target_distribution(models, name):
  target, draft = models
  kw = SETTINGS[name]
  seqs, p = _exact_probs(target, ENC, sd.Sampler(**kw))
  samples, run_stats = _sample(target, draft, ENC, gamma=3, **kw)
  # Rows accepted different numbers of tokens inside the same batches.
  per_row = run_stats[0].row_accepted_histogram
  assert len({tuple(h) for h in per_row}) > 5
  assert 0.05 < run_stats[0].alpha < 0.95
  assert g_test(samples, seqs, p) > FALSE_ALARM


def test_table_draft_samples_the_target_distribution(models):
  target, _ = models
  kw = SETTINGS['temperature_1']
  seqs, p = _exact_probs(target, ENC, sd.Sampler(**kw))
  table = sd.TableLM.random(V, seed=5, scale=2.0)
  samples, _ = _sample(target, table, ENC, gamma=2, **kw)
  assert g_test(samples, seqs, p) > FALSE_ALARM


def test_negative_control_dropping_the_residual_is_detected(models):
  target, draft = models
  kw = SETTINGS['temperature_1']
  seqs, p = _exact_probs(target, ENC, sd.Sampler(**kw))
  samples, _ = _sample(
    target, draft, ENC, gamma=3, verifier=ResidualDroppingVerifier(), **kw
  )
  assert g_test(samples, seqs, p) < FALSE_ALARM


def test_negative_control_wrong_distribution_is_detected(models):
  """The test has power against a mildly different model too."""
  target, _ = models
  kw = SETTINGS['temperature_1']
  seqs, p = _exact_probs(target, ENC, sd.Sampler(temperature=1.15))
  samples, _ = _sample(target, target, ENC, gamma=2, **kw)
  assert g_test(samples, seqs, p) < FALSE_ALARM

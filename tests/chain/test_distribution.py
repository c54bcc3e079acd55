"""Whole-sequence distribution tests: speculative sampling samples the target.

Method, sample size and false-alarm rate: `_distribution_util`.

Negative control: a verifier that, after a rejection, samples the target's p
instead of the residual norm(max(0, p - q)) (a plausible bug) produces a
different distribution; the same test at the same N must reject it.
"""

import pytest
from _distribution_util import ENC
from _distribution_util import FALSE_ALARM
from _distribution_util import ResidualDroppingVerifier
from _distribution_util import V
from _distribution_util import exact_probs
from _distribution_util import g_test
from _distribution_util import sample_sequences
from _distribution_util import target_model
from conftest import tiny_config

import spec_decode as sd


@pytest.fixture(scope='module')
def models():
  target = target_model()
  draft = sd.Model.init(tiny_config(vocab_size=V, num_decoder_layers=1), seed=4)
  return target, draft


SETTINGS = {
  'temperature_1': dict(temperature=1.0),
  'temperature_0.7_top_k_3': dict(temperature=0.7, top_k=3),
  'top_p_0.8': dict(temperature=1.0, top_p=0.8),
}


@pytest.mark.accel
@pytest.mark.parametrize('name', sorted(SETTINGS))
def test_speculative_samples_the_target_distribution(models, name):
  target, draft = models
  kw = SETTINGS[name]
  seqs, p = exact_probs(target, ENC, sd.Sampler(**kw))
  samples, run_stats = sample_sequences(target, draft, ENC, gamma=3, **kw)
  # Rows accepted different numbers of tokens inside the same batches.
  per_row = run_stats[0].row_accepted_histogram
  assert len({tuple(h) for h in per_row}) > 5
  assert 0.05 < run_stats[0].alpha < 0.95
  assert g_test(samples, seqs, p) > FALSE_ALARM


def test_table_draft_samples_the_target_distribution(models):
  target, _ = models
  kw = SETTINGS['temperature_1']
  seqs, p = exact_probs(target, ENC, sd.Sampler(**kw))
  table = sd.TableLM.random(V, seed=5, scale=2.0)
  samples, _ = sample_sequences(target, table, ENC, gamma=2, **kw)
  assert g_test(samples, seqs, p) > FALSE_ALARM


def test_negative_control_dropping_the_residual_is_detected(models):
  target, draft = models
  kw = SETTINGS['temperature_1']
  seqs, p = exact_probs(target, ENC, sd.Sampler(**kw))
  samples, _ = sample_sequences(
    target, draft, ENC, gamma=3, verifier=ResidualDroppingVerifier(), **kw
  )
  assert g_test(samples, seqs, p) < FALSE_ALARM


def test_negative_control_wrong_distribution_is_detected(models):
  """The test has power against a mildly different model too."""
  target, _ = models
  kw = SETTINGS['temperature_1']
  seqs, p = exact_probs(target, ENC, sd.Sampler(temperature=1.15))
  samples, _ = sample_sequences(target, target, ENC, gamma=2, **kw)
  assert g_test(samples, seqs, p) < FALSE_ALARM

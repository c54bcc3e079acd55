"""Whole-sequence distribution test at temperature 1 on T5Gemma targets.

Method (as `_distribution_util`'s, with a T5Gemma pair): a tiny random
T5Gemma target (3 + 3 layers, V = 6, EOS = 1, decoder window 2 so sliding
layers bite within M = 4 tokens) and a 1 + 1 layer draft of another seed
with the same vocabulary, chains of gamma = 3. The sliding layers keep a
ring of 2 + 4 - 1 = 5 entries; `generate` buffers M + gamma + 2 = 9 slots,
so the ring wraps. Every possible output of at most M tokens (781) gets
its exact probability by teacher forcing. Each batch is ragged: rows
alternate two encoder inputs of different lengths (3 tokens padded to 6,
6 tokens), and rows accept different numbers of tokens. N = 12,000
speculative samples per input (24,000 in all, fixed seeds 0..) are
compared with the exact probabilities of their input by a G-test (bins of
expected count >= 5, the rest pooled). Each G-test fails below p = 1e-3,
its false-alarm rate (two inputs: at most 2e-3 per test).

Negative control: the verifier that samples p instead of the residual
norm(max(0, p - q)) after a rejection (`ResidualDroppingVerifier`); at the
same N the same test must reject it on both inputs (measured: p < 1e-150).
"""

import functools

import numpy as np
import pytest
from _distribution_util import FALSE_ALARM
from _distribution_util import M
from _distribution_util import ResidualDroppingVerifier
from _distribution_util import V
from _distribution_util import exact_probs
from _distribution_util import g_test
from _t5gemma_util import tiny_config

import spec_decode as sd

N_PER_INPUT, BATCH = 12_000, 2_000
GAMMA = 3
ENC = np.array([[3, 4, 5, 0, 0, 0], [5, 3, 4, 2, 3, 4]], np.int32)
TEMPERATURE_1 = dict(temperature=1.0)


@functools.cache
def _pair(v):
  target = sd.T5GemmaModel.init(tiny_config(v, 3, V, window=2), seed=3)
  draft = sd.T5GemmaModel.init(tiny_config(v, 1, V, window=2), seed=4)
  return target, draft


@pytest.fixture(params=[1, 2], ids=['t5gemma', 't5gemma2'])
def pair(request):
  return _pair(request.param)


def _samples(target, draft, **kwargs):
  """`[N_PER_INPUT, M]` samples per input row of `ENC` and the stats of
  the first batch; rows alternate the inputs, one seed per row."""
  enc = np.tile(ENC, (BATCH, 1))
  out, first = [], None
  for start in range(0, N_PER_INPUT * len(ENC), len(enc)):
    res = sd.generate(
      target,
      enc,
      draft=draft,
      gamma=GAMMA,
      max_decode_len=M,
      seed=np.arange(start, start + len(enc)),
      **TEMPERATURE_1,
      **kwargs,
    )
    out.append(np.asarray(res.tokens))
    first = first or res.stats
  tokens = np.concatenate(out)
  return [tokens[i :: len(ENC)] for i in range(len(ENC))], first


def _p_values(target, samples):
  sampler = sd.Sampler(**TEMPERATURE_1)
  values = []
  for i, rows in enumerate(samples):
    seqs, p = exact_probs(target, ENC[i : i + 1], sampler)
    values.append(g_test(rows, seqs, p))
  return values


def test_speculative_samples_the_target_distribution(pair):
  target, draft = pair
  samples, stats = _samples(target, draft)
  assert len({tuple(h) for h in stats.row_accepted_histogram}) > 5
  assert 0.05 < stats.alpha < 0.95
  for p_value in _p_values(target, samples):
    assert p_value > FALSE_ALARM


def test_negative_control_dropping_the_residual_is_detected():
  """On T5Gemma only: the verifier does not depend on the family."""
  target, draft = _pair(1)
  samples, _ = _samples(target, draft, verifier=ResidualDroppingVerifier())
  p_values = _p_values(target, samples)
  for p_value in p_values:
    assert p_value < FALSE_ALARM

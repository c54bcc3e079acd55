"""gamma='auto' with an acceptance estimate carried between decodes
(`policy.carried`, `generate(..., acceptance=)`).

The whole-sequence distribution tests (method, sample size N = 24,000 and
false-alarm rate 1e-3: `_distribution_util`) decode their six batches of
4,000 rows carrying the estimate from each batch to the next, from the
prior, under `test_finish_time`'s SAMPLING_SECONDS: the first batch runs the
policy loop from the prior, the carried estimate then runs batches plain
outright (halving its weight each time) until the policy loop runs again
from the carried start; the test checks that both happened. Negative
control: the same carried decodes with the residual dropped
(`ResidualDroppingVerifier`) must fail the same test.
"""

import numpy as np
import pytest
from _distribution_util import ENC
from _distribution_util import FALSE_ALARM
from _distribution_util import ResidualDroppingVerifier
from _distribution_util import V
from _distribution_util import exact_probs
from _distribution_util import g_test
from _distribution_util import sample_sequences
from _distribution_util import target_model
from conftest import encoder_batch
from conftest import perturbed
from conftest import tiny_config
from test_finish_time import SAMPLING_SECONDS
from test_finish_time import SECONDS
from test_finish_time import _fix_costs

import spec_decode as sd
from spec_decode.policy import carried
from spec_decode.policy import finish_time

Estimate = carried.AcceptanceEstimate


@pytest.fixture
def fixed_costs(monkeypatch, tmp_path):
  _fix_costs(monkeypatch, tmp_path, SECONDS)


@pytest.fixture
def sampling_costs(monkeypatch, tmp_path):
  _fix_costs(monkeypatch, tmp_path, SAMPLING_SECONDS)


@pytest.fixture(scope='module')
def pair():
  target = sd.Model.init(tiny_config(vocab_size=32), seed=0)
  return target, perturbed(target, 0.3, seed=1)


# ------------------------------------------------------------ the estimate


def test_the_estimate_pools_decodes_and_forgets():
  prior = Estimate()
  assert (prior.alpha, prior.weight) == (
    finish_time.PRIOR_ALPHA,
    finish_time.PRIOR_WEIGHT,
  )
  # A decode that tested 10 positions with beta summing to 5.
  one = prior.after(5.0, 10)
  assert one.alpha == pytest.approx((0.8 * 2 + 5) / 12)
  assert (one.weight, one.decodes) == (12.0, 1)
  # At most CARRIED_WEIGHT positions: a long decode outweighs the past.
  big = one.after(900.0, 1000)
  assert big.weight == carried.CARRIED_WEIGHT
  assert big.alpha == pytest.approx((one.alpha * 12 + 900) / 1012)
  # A decode run plain outright tests nothing: the weight halves, alpha
  # stays.
  plain = big.after_plain()
  assert (plain.alpha, plain.weight) == (big.alpha, carried.CARRIED_WEIGHT / 2)
  assert plain.upper() > big.upper()
  assert Estimate.from_json(plain.to_json()) == plain
  for bad in (dict(alpha=1.5), dict(alpha=-0.1), dict(weight=0.0)):
    with pytest.raises(ValueError, match='AcceptanceEstimate'):
      Estimate(**bad)


def test_plain_wins_where_no_gamma_pays_at_the_optimistic_bound():
  """Under SECONDS (gamma 0 best below alpha ~0.45 for one row, 64 left):
  a confident low estimate says plain, a high one or the prior does not;
  halving its weight decode after decode lifts its bound until the loop
  runs again (exploration)."""
  low = Estimate(alpha=0.2, weight=64.0)
  assert low.plain_wins(SECONDS, 1, 64)
  assert not Estimate(alpha=0.9, weight=64.0).plain_wins(SECONDS, 1, 64)
  assert not Estimate().plain_wins(SECONDS, 1, 64)
  # Gamma 0 not a candidate: never plain.
  assert not low.plain_wins([np.inf] + SECONDS[1:], 1, 64)
  # The loop's margin over plain: equal finishes go to plain's program.
  flat = [1.0, 2.0, 3.0, 4.0]  # gamma g is g + 1 plain steps' price.
  sure = Estimate(alpha=0.999, weight=64.0)
  assert sure.plain_wins(flat, 1, 64)
  assert not sure.plain_wins(flat, 1, 64, margin=-0.5)
  runs = 0
  while low.plain_wins(SECONDS, 1, 64):
    low, runs = low.after_plain(), runs + 1
  assert 2 <= runs <= 6, runs


def test_the_policy_starts_from_the_carried_estimate():
  """The first choice of a decode (nothing tested yet) follows the start:
  the prior drafts, a carried low estimate does not, a high one drafts the
  most."""

  def first(**prior):
    return int(
      finish_time.choose(
        np.zeros(1, np.float32),
        np.zeros(1, np.float32),
        np.ones(1, bool),
        np.full(1, 64, np.int32),
        finish_time.PolicyInputs.create(SECONDS, **prior),
        np.int32(0),
      )
    )

  assert first() == 3  # The prior: 0.8 over 2 positions.
  assert first(prior_alpha=0.2, prior_weight=64.0) == 0
  assert first(prior_alpha=0.55, prior_weight=64.0) == 2
  # Over 2 positions 0.2 is uncertain: gamma 1 probes instead of gamma 0.
  assert first(prior_alpha=0.2, prior_weight=2.0) == 1


# -------------------------------------------------------------- generate


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_a_carried_estimate_saying_no_gamma_pays_runs_plain(
  pair, fixed_costs, temperature
):
  """A confident low estimate under costs where a good draft would pay:
  plain decoding's own program (its tokens, draws included; no draft
  call) and the estimate's weight halved; from the prior (the negative
  control) the same costs run the policy loop, which drafts."""
  target, draft = pair
  enc = encoder_batch(4, 7, 32, seed=5)
  kw = dict(max_decode_len=12, temperature=temperature, seed=3)
  plain = sd.generate(target, enc, **kw)
  low = Estimate(alpha=0.2, weight=64.0)
  auto = dict(draft=draft, gamma='auto', max_auto_gamma=3, **kw)
  out = sd.generate(target, enc, acceptance=low, **auto)
  choice = out.gamma_choice
  assert choice['can_pay'] and choice['plain_by_estimate']
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  assert out.stats.draft_calls == 0
  assert choice['gamma_iterations'][0] == out.stats.target_calls
  after = choice['acceptance']
  assert (after.alpha, after.weight) == (0.2, 32.0)
  cold = sd.generate(target, enc, **auto).gamma_choice
  assert not cold['plain_by_estimate']
  assert sum(n for g, n in cold['gamma_iterations'].items() if g) > 0
  assert cold['started_from'] == {'alpha': 0.8, 'weight': 2.0}


def test_a_carried_start_moves_the_schedule_and_keeps_greedy_exact(
  pair, fixed_costs
):
  target, draft = pair
  enc = encoder_batch(4, 7, 32, seed=5)
  plain = sd.generate(target, enc, max_decode_len=12).tokens
  kw = dict(draft=draft, gamma='auto', max_auto_gamma=3, max_decode_len=12)
  ran = {}
  for alpha in (0.7, 0.999):
    start = Estimate(alpha=alpha, weight=64.0)
    out = sd.generate(target, enc, acceptance=start, **kw)
    np.testing.assert_array_equal(out.tokens, plain)
    choice = out.gamma_choice
    assert choice['started_from'] == {'alpha': alpha, 'weight': 64.0}
    assert not choice['plain_by_estimate']
    assert choice['acceptance'].decodes == 1
    ran[alpha] = choice['gamma_iterations']
  # The confident high start drafts 3 from its first iteration.
  assert ran[0.999][3] > ran[0.7][3], ran


def test_bad_acceptance_and_reused_keys_are_refused(pair, fixed_costs):
  target, draft = pair
  enc = encoder_batch(2, 7, 32, seed=5)
  kw = dict(draft=draft, gamma='auto', max_auto_gamma=3, max_decode_len=6)
  with pytest.raises(ValueError, match='AcceptanceEstimate'):
    sd.generate(target, enc, acceptance={'alpha': 0.5}, **kw)
  with pytest.raises(ValueError, match="gamma='auto'"):
    sd.generate(
      target, enc, draft=draft, gamma=2, acceptance=Estimate(), max_decode_len=6
    )
  sampled = dict(kw, temperature=1.0)
  first = sd.generate(target, enc, seed=[0, 1], **sampled)
  est = first.gamma_choice['acceptance']
  # A sampled decode reusing a row key the estimate saw: its schedule could
  # depend on its own draws.
  with pytest.raises(ValueError, match='row keys'):
    sd.generate(target, enc, seed=[1, 2], acceptance=est, **sampled)
  sd.generate(target, enc, seed=[2, 3], acceptance=est, **sampled)
  # Greedy decodes draw nothing: any keys.
  greedy = sd.generate(target, enc, seed=0, **kw).gamma_choice['acceptance']
  assert not greedy.keys
  sd.generate(target, enc, seed=0, acceptance=greedy, **kw)


# --------------------------------------------------- distribution tests


@pytest.fixture(scope='module')
def models():
  target = target_model()
  draft = sd.Model.init(tiny_config(vocab_size=V, num_decoder_layers=1), seed=4)
  return target, draft


AUTO = dict(gamma='auto', max_auto_gamma=3, temperature=1.0)


def test_carried_auto_samples_the_target_distribution(models, sampling_costs):
  target, draft = models
  seqs, p = exact_probs(target, ENC, sd.Sampler(temperature=1.0))
  choices = []
  samples, _ = sample_sequences(target, draft, ENC, carry=choices, **AUTO)
  # Batches run plain outright by the carried estimate, and batches after
  # the first whose policy loop started from it (not from the prior).
  assert any(c['plain_by_estimate'] for c in choices)
  assert any(
    not c['plain_by_estimate'] and c['started_from']['weight'] != 2.0
    for c in choices[1:]
  ), [c['started_from'] for c in choices]
  assert g_test(samples, seqs, p) > FALSE_ALARM


def test_negative_control_carried_auto_dropping_the_residual_is_detected(
  models, sampling_costs
):
  target, draft = models
  seqs, p = exact_probs(target, ENC, sd.Sampler(temperature=1.0))
  choices = []
  samples, _ = sample_sequences(
    target,
    draft,
    ENC,
    carry=choices,
    verifier=ResidualDroppingVerifier(),
    **AUTO,
  )
  assert any(c['plain_by_estimate'] for c in choices)
  assert g_test(samples, seqs, p) < FALSE_ALARM

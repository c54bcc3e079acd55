"""Lenience (appendix A.5), dynamic gamma and gamma='auto' through generate.

Statistical tests here state their method, sample size and false-alarm
rate; each has a negative control that must fail.
"""

import numpy as np
import pytest
from _distribution_util import ENC
from _distribution_util import FALSE_ALARM
from _distribution_util import exact_probs
from _distribution_util import g_test
from _distribution_util import sample_sequences
from conftest import encoder_batch
from conftest import perturbed
from conftest import tiny_config
from scipy import stats

import spec_decode as sd
from spec_decode.core import rejection
from spec_decode.models.t5_model import shift_right

# ----------------------------------------------------------- lenient sampling

V_LENIENT = 6
N_FIRST = 40_000


@pytest.fixture(scope='module')
def far_pair():
  """A target and a draft that disagree a lot (q >> p on some tokens)."""
  cfg = tiny_config(vocab_size=V_LENIENT)
  target = sd.Model.init(cfg, seed=3)
  draft = perturbed(target, 3.0, seed=9)
  return target, draft


def _first_token_counts(target, draft, lenience):
  enc = np.repeat(ENC, N_FIRST, 0)
  out = sd.generate(
    target,
    enc,
    draft=draft,
    gamma=2,
    temperature=1.0,
    max_decode_len=1,
    seed=np.arange(N_FIRST),
    lenience=lenience,
  )
  return np.bincount(out.tokens[:, 0], minlength=V_LENIENT), out.stats


def _first_token_probs(model):
  logits = model.logits(ENC, np.zeros((1, 1), np.int32))
  return np.asarray(sd.Sampler(1.0).probs(logits), np.float64)[0, 0]


def _worst_excess_pvalue(counts, bound):
  """Smallest one-sided binomial p-value of count_x under P(x) = bound(x).

  Method: for each token x, P(Binomial(N, min(1, bound_x)) >= count_x);
  the test fails when the smallest is below FALSE_ALARM / V (Bonferroni:
  false-alarm rate <= 1e-3 over the V tokens).
  """
  n = counts.sum()
  pvals = stats.binom.sf(counts - 1, n, np.minimum(bound, 1.0))
  return float(pvals.min())


@pytest.mark.parametrize('lenience', [0.5, 0.2])
def test_lenient_sampling_never_exceeds_p_over_l(far_pair, lenience):
  """No first token is drawn with probability above p(x) / l.

  N = 40,000 first tokens; the bound is tested per token (see
  `_worst_excess_pvalue`). The sample also matches the appendix's law
  min(q, p/l) + (1 - sum min(q, p/l)) * norm(max(0, p - l q)) (G-test at
  1e-3), so the bound is not met by accident.
  """
  target, draft = far_pair
  p = _first_token_probs(target)
  q = _first_token_probs(draft)
  counts, st = _first_token_counts(target, draft, lenience)
  assert _worst_excess_pvalue(counts, p / lenience) > FALSE_ALARM / V_LENIENT
  accept = np.minimum(q, p / lenience)
  residual = np.maximum(p - lenience * q, 0.0)
  law = accept + (1.0 - accept.sum()) * residual / residual.sum()
  expected = law * counts.sum()
  g = 2 * np.sum(counts * np.log(np.maximum(counts, 1) / expected))
  assert stats.chi2.sf(g, V_LENIENT - 1) > FALSE_ALARM
  # Lenience accepts more than exact verification does.
  exact_counts, exact_stats = _first_token_counts(target, draft, 1.0)
  assert st.alpha > exact_stats.alpha
  del exact_counts


def test_negative_control_more_lenient_than_claimed_is_detected(far_pair):
  """Sampling at l/4 while claiming l breaks the p(x)/l bound."""
  target, draft = far_pair
  p = _first_token_probs(target)
  q = _first_token_probs(draft)
  lenience = 0.5
  assert np.any(q > p / lenience * 1.2)  # The control has power.
  counts, _ = _first_token_counts(target, draft, lenience / 4)
  assert _worst_excess_pvalue(counts, p / lenience) < FALSE_ALARM / V_LENIENT


def test_bad_lenience_is_rejected(far_pair):
  target, draft = far_pair
  for bad in (0.0, -0.5, 1.5, 'high'):
    with pytest.raises(ValueError, match='lenience'):
      sd.generate(target, ENC, draft=draft, lenience=bad)
  with pytest.raises(ValueError, match='lenience'):
    sd.generate(
      target,
      ENC,
      draft=draft,
      lenience=0.5,
      verifier=rejection.ExactVerifier(),
    )


# ------------------------------------------------------------- lenient argmax


def test_lenient_argmax_keeps_tokens_close_to_the_max(target):
  """Greedy, l = 0.3: every emitted token has p(x) >= l * max p.

  Checked by teacher forcing the emitted sequences through the target.
  With l = 1 the same call equals plain greedy decoding.
  """
  draft = perturbed(target, 0.8, seed=7)
  enc = encoder_batch(16, 7, target.vocab_size, seed=5)
  kw = dict(draft=draft, gamma=4, max_decode_len=12)
  lenient = sd.generate(target, enc, lenience=0.3, **kw)
  exact = sd.generate(target, enc, **kw)
  plain = sd.generate(target, enc, max_decode_len=12)
  np.testing.assert_array_equal(exact.tokens, plain.tokens)
  assert lenient.stats.alpha > exact.stats.alpha
  assert not np.array_equal(lenient.tokens, plain.tokens)
  tokens = lenient.tokens
  logits = np.asarray(target.logits(enc, shift_right(tokens)), np.float64)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  ratio = np.take_along_axis(probs, tokens[..., None], -1)[..., 0]
  live = np.arange(tokens.shape[1])[None] < lenient.lengths[:, None]
  assert np.all(ratio[live] >= 0.3 - 1e-5)
  assert np.any(ratio[live] < 1.0)  # Some token was not the argmax.


# -------------------------------------------------------------- dynamic gamma


@pytest.mark.parametrize('tau', [0.3, 0.6, True])
@pytest.mark.parametrize('gamma', [2, 5])
def test_dynamic_gamma_greedy_identity(target, tau, gamma):
  draft = perturbed(target, 0.3, seed=1)
  enc = encoder_batch(8, 7, target.vocab_size, seed=3)
  plain = sd.generate(target, enc, max_decode_len=20)
  out = sd.generate(
    target, enc, draft=draft, gamma=gamma, dynamic_gamma=tau, max_decode_len=20
  )
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, plain.lengths)
  assert 1.0 <= out.stats.mean_proposed <= gamma


def test_dynamic_gamma_proposes_fewer_when_the_draft_is_unsure(target):
  draft = perturbed(target, 0.3, seed=1)
  enc = encoder_batch(8, 7, target.vocab_size, seed=3)
  kw = dict(draft=draft, gamma=5, max_decode_len=20)
  fixed = sd.generate(target, enc, **kw)
  low = sd.generate(target, enc, dynamic_gamma=0.05, **kw)
  high = sd.generate(target, enc, dynamic_gamma=0.95, **kw)
  assert fixed.stats.mean_proposed == 5.0
  assert high.stats.mean_proposed < low.stats.mean_proposed
  assert high.stats.mean_proposed < 3.0
  # Fewer proposals, higher acceptance of the ones made.
  assert high.stats.alpha >= fixed.stats.alpha


def test_dynamic_gamma_samples_the_target_distribution():
  """G-test over all 781 sequences (see test_distribution), N = 24,000,
  t = 1, false-alarm 1e-3, with rows proposing different numbers of tokens
  in the same batch. The negative control (residual dropped) is in
  test_distribution and uses the same test."""
  cfg = tiny_config(vocab_size=6)
  target = sd.Model.init(cfg, seed=3)
  draft = sd.Model.init(cfg.replace(num_decoder_layers=1), seed=4)
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  samples, run_stats = sample_sequences(
    target, draft, ENC, gamma=3, temperature=1.0, dynamic_gamma=0.4
  )
  proposed = run_stats[0].row_proposed / np.maximum(
    run_stats[0].row_iterations, 1
  )
  assert len(set(np.round(proposed, 3).tolist())) > 5
  assert 1.0 < run_stats[0].mean_proposed < 3.0
  assert g_test(samples, seqs, p) > FALSE_ALARM


def test_bad_dynamic_gamma_is_rejected(target):
  for bad in (1.5, 0.0, -1, 'yes'):
    with pytest.raises(ValueError, match='dynamic_gamma'):
      sd.generate(target, ENC, draft=target, dynamic_gamma=bad)


# ----------------------------------------------------------------- auto gamma


def test_auto_gamma_decodes_once_and_reports(target, tmp_path, monkeypatch):
  """gamma='auto' is one decode whose iterations pick their gamma; with
  draft == target (alpha 1) the largest gamma pays whenever drafting does."""
  monkeypatch.setenv('SPEC_DECODE_CACHE_DIR', str(tmp_path))
  enc = encoder_batch(4, 7, target.vocab_size, seed=3)
  plain = sd.generate(target, enc, max_decode_len=12)
  out = sd.generate(
    target,
    enc,
    draft=target,
    gamma='auto',
    max_decode_len=12,
    max_auto_gamma=2,
  )
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  choice = out.gamma_choice
  assert out.stats.gamma == choice['max_gamma'] == 2
  seconds = choice['iteration_seconds']
  assert set(seconds) == {0, 1, 2} and all(s > 0 for s in seconds.values())
  assert sum(choice['gamma_iterations'].values()) == out.stats.target_calls
  assert out.stats.per_position_acceptance[
    out.stats.row_position_tries.sum(0) > 0
  ] == pytest.approx(1.0)


def test_bad_gamma_string_is_rejected(target):
  with pytest.raises(ValueError, match='auto'):
    sd.generate(target, ENC, draft=target, gamma='best')

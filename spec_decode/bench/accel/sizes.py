"""One target size against the draft: step time, v(k), c, speedups.

Batch 1, greedy. v(k) is the time of one target call on k tokens over a
call on one (`policy.timing.step_times`, calls inside compiled loops), c the
draft step over the target step. Under controlled acceptance
(`bench.controlled.ControlledDraft`: the real draft runs for its cost, its
proposal is the target's own next token with probability alpha) each alpha
gets the gamma Theorem 3.8 (generalized: E[tokens] / (gamma c + v(gamma +
1))) predicts best from the measured c and v, among the gammas whose
v(gamma + 1) was measured; the measured speedup (walltime of plain over
speculative `generate`, medians) stands next to that prediction.
"""

import time
from typing import Any

import jax
import numpy as np

import spec_decode as sd
from spec_decode import theory
from spec_decode.bench import speed
from spec_decode.bench.accel.plan import Deadline
from spec_decode.bench.accel.plan import Plan
from spec_decode.bench.accel.record import Recorder
from spec_decode.policy import timing

# The paper's Table 2 setting (T5-XXL/T5-small, WMT EnDe, greedy, TPU-v4):
# gamma 7 at alpha 0.75, c 0.02, expected 3.2x, measured 3.4x.
PAPER_ALPHA = 0.75
PAPER_GAMMA = 7
# A step is predicted to take this much longer than the last one measured
# (the next k is wider; compilation varies).
_MARGIN = 1.5


def inputs(batch: int, vocab_size: int, seed: int = 0) -> np.ndarray:
  """`[batch, 24]` encoder tokens (ids 3..min(999, V - 1), no padding)."""
  rng = np.random.default_rng(seed)
  high = min(1000, vocab_size)
  return rng.integers(3, high, (batch, 24)).astype(np.int32)


def timed(fn, repeats: int) -> tuple[float, Any, float]:
  """(median seconds after the first call, the output, first call seconds)."""
  t0 = time.perf_counter()
  out = fn()
  jax.block_until_ready(getattr(out, 'tokens', out))
  first = time.perf_counter() - t0
  seconds = timing.median_time(lambda: fn().tokens, repeats)
  return seconds, out, first


def suppress_eos(model: sd.Model) -> sd.Model:
  """`bench.peer.suppress_eos` on the device (no host copy of the weights):
  EOS is never the argmax, so greedy decodes run to full length."""
  params = dict(model.params)
  decoder = dict(params['decoder'])
  dense = dict(decoder['logits_dense'])
  kernel = dense['kernel']
  dense['kernel'] = kernel.at[:, sd.EOS_ID].set(0.5 * kernel[:, sd.UNK_ID])
  decoder['logits_dense'] = dense
  params['decoder'] = decoder
  return model.with_params(params)


def draft_step_seconds(draft_net, plan: Plan) -> float:
  return timing.step_times(draft_net, (1,), plan.repeats)[1]


def best_gamma(
  alpha: float, c: float, v: dict[int, float]
) -> tuple[int, float]:
  """The gamma (with v(gamma + 1) measured) of the best predicted speedup."""
  options = {
    k - 1: float(theory.walltime_improvement(alpha, k - 1, c, v[k]))
    for k in v
    if k >= 2
  }
  gamma = max(options, key=options.get)
  return gamma, options[gamma]


def measure(
  rec: Recorder,
  name: str,
  target: sd.Model,
  draft_net,
  draft_seconds: float,
  plan: Plan,
  box: Deadline,
) -> None:
  """Fills `sections['sizes'][name]` item by item inside `box`.

  Args:
    rec: where results go.
    name: the size's name (`plan.SIZES`).
    target: the target (EOS suppressed: `suppress_eos`).
    draft_net: the draft network.
    draft_seconds: one draft step (`draft_step_seconds`).
    plan: the run's plan.
    box: this size's time box.
  """
  config = target.config
  out: dict[str, Any] = {'config': config.to_dict(), 'v': {}, 'speedup': {}}

  def save():
    rec.put('sizes', name, out)

  times, last = {}, 0.0
  for k in plan.ks:
    if times and not box.fits(_MARGIN * last):
      rec.skip('sizes', f'{name} v({k})', 'time box')
      continue
    t0 = time.perf_counter()
    times[k] = timing.step_times(target, (k,), plan.repeats)[k]
    last = time.perf_counter() - t0
    rec.event('sizes', f'{name} v({k})', last)
    if k == 1:
      out['target_step_ms'] = times[1] * 1e3
      out['c'] = draft_seconds / times[1]
    out['v'][str(k)] = times[k] / times[1]
    save()
  if 1 not in times or len(times) < 2:
    return
  c = out['c']
  v = {k: t / times[1] for k, t in times.items()}
  if PAPER_GAMMA + 1 in v:
    out['paper_table2'] = {
      'alpha': PAPER_ALPHA,
      'gamma': PAPER_GAMMA,
      'predicted': float(
        theory.walltime_improvement(
          PAPER_ALPHA, PAPER_GAMMA, c, v[PAPER_GAMMA + 1]
        )
      ),
      'paper_expected': 3.2,
      'paper_measured': 3.4,
      'paper_c': 0.02,
    }
    save()
  enc = inputs(1, config.vocab_size)
  m = plan.max_decode_len
  t0 = time.perf_counter()
  plain_s, plain, first = timed(
    lambda: sd.generate(target, enc, max_decode_len=m), plan.repeats
  )
  out['plain_seconds'] = plain_s
  out['plain_compile_seconds'] = first - plain_s
  reference = sd.generate(target, enc, max_decode_len=m + max(v) + 2).tokens
  rec.event('sizes', f'{name} plain', time.perf_counter() - t0)
  save()
  last = time.perf_counter() - t0
  for alpha in plan.alphas:
    if not box.fits(_MARGIN * last):
      rec.skip('sizes', f'{name} alpha {alpha}', 'time box')
      continue
    t0 = time.perf_counter()
    gamma, predicted = best_gamma(alpha, c, v)
    draft = speed.controlled_draft(draft_net, reference, alpha)
    spec_s, spec, _ = timed(
      lambda draft=draft, gamma=gamma: sd.generate(
        target, enc, draft=draft, gamma=gamma, max_decode_len=m
      ),
      plan.repeats,
    )
    a_hat = spec.stats.alpha
    out['speedup'][str(alpha)] = {
      'gamma': gamma,
      'alpha_measured': a_hat,
      'spec_seconds': spec_s,
      'measured': plain_s / spec_s,
      'predicted': float(
        theory.walltime_improvement(a_hat, gamma, c, v[gamma + 1])
      ),
      'predicted_at_alpha': predicted,
      'predicted_v1': float(theory.walltime_improvement(a_hat, gamma, c)),
      'tokens_per_call': spec.stats.tokens_per_call,
      'same_as_plain': bool(np.array_equal(spec.tokens, plain.tokens)),
    }
    last = time.perf_counter() - t0
    rec.event('sizes', f'{name} alpha {alpha}', last)
    save()

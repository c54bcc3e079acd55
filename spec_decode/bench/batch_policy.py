"""Bench section: gamma='auto' against plain and every fixed gamma, by batch.

A grid of batch sizes x controlled acceptance rates (`ControlledDraft`,
greedy, the bench target with EOS suppressed so every row decodes M tokens):
tokens/s of plain decoding, of each fixed gamma in `GAMMAS` and of
`gamma='auto'` (the in-loop finish-time policy, `policy.finish_time`),
cold (each decode from the policy's prior) and carried (each decode from
the acceptance estimate of the one before, `policy.carried`: a caller that
decodes many batches, as the eval run does), timed side by side in rounds
(one repeat of each per round, medians), so that a busy machine slows them
alike. The policy's costs are measured in this run (a
fresh cost cache) before its decodes are timed; the measurement is reported, not
timed. Every speculative output is checked equal to the plain one (in float32;
`check_identity=False` records the share of identical rows instead, for bfloat16
runs, where a wider target call can round differently).

JSON (`batch_policy`): a list of rows `{batch, alpha, plain_tok_s,
auto_tok_s, best_fixed_tok_s, best_fixed_gamma, fixed_tok_s, auto_vs_plain,
auto_vs_best_fixed, auto_gamma_iterations, auto_carried_tok_s,
auto_carried_vs_plain, auto_carried_vs_best_fixed,
auto_carried_gamma_iterations, auto_carried_plain_decodes,
cost_measure_seconds, same_as_plain}` (`auto_*`: cold; `auto_carried_*`:
carried, its iterations those of its last timed decode and
`auto_carried_plain_decodes` the share of its timed decodes run plain
outright by the estimate; `same_as_plain`: per run, the share of rows equal
to plain decoding's).
"""

import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode.bench import controlled

GAMMAS = (1, 2, 4, 8)
MAX_AUTO_GAMMA = 8


def _draft(draft_net, reference, alpha: float):
  return controlled.ControlledDraft(
    inner=draft_net,
    reference=jnp.asarray(reference),
    alpha=jnp.float32(alpha),
    key=jax.random.key(17),
  )


def _inputs(batch: int, vocab_size: int) -> np.ndarray:
  rng = np.random.default_rng(batch)
  return rng.integers(3, min(1000, vocab_size), (batch, 24)).astype(np.int32)


def _timed_rounds(runs: dict[str, Any], repeats: int) -> dict[str, float]:
  """Median seconds of each `runs[name]()`, one call of each per round.

  The order is reversed every other round: in a fixed order a run always
  follows the same neighbour, whose leftover state (caches, allocator)
  it inherits, which moved ratios by several percent at batch 16.
  """
  times = {name: [] for name in runs}
  for r in range(repeats):
    order = list(runs.items())
    for name, fn in order if r % 2 == 0 else order[::-1]:
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(t) for name, t in times.items()}


def run(
  target,
  draft_net,
  max_decode_len: int,
  repeats: int,
  batches: Sequence[int],
  alphas: Sequence[float],
  gammas: Sequence[int] = GAMMAS,
  check_identity: bool = True,
) -> list[dict[str, Any]]:
  """The grid's rows (see the module docstring)."""
  m = max_decode_len
  rows = []
  old = os.environ.get('SPEC_DECODE_CACHE_DIR')
  with tempfile.TemporaryDirectory() as cache:
    os.environ['SPEC_DECODE_CACHE_DIR'] = cache
    try:
      for b in batches:
        enc = _inputs(b, target.vocab_size)
        plain = sd.generate(target, enc, max_decode_len=m)
        reference = sd.generate(
          target, enc, max_decode_len=m + MAX_AUTO_GAMMA + 2
        ).tokens
        for alpha in alphas:
          rows.append(
            _cell(
              target,
              draft_net,
              enc,
              plain,
              reference,
              alpha,
              m,
              repeats,
              gammas,
              check_identity,
            )
          )
          print(
            f'batch_policy: batch {b} alpha {alpha}: '
            f'{rows[-1]["auto_vs_plain"]:.2f}x plain, '
            f'{rows[-1]["auto_vs_best_fixed"]:.2f}x best fixed; carried '
            f'{rows[-1]["auto_carried_vs_plain"]:.2f}x plain, '
            f'{rows[-1]["auto_carried_vs_best_fixed"]:.2f}x best fixed',
            flush=True,
          )
    finally:
      if old is None:
        os.environ.pop('SPEC_DECODE_CACHE_DIR', None)
      else:
        os.environ['SPEC_DECODE_CACHE_DIR'] = old
  return rows


def _cell(
  target, draft_net, enc, plain, reference, alpha, m, repeats, gammas, check
):
  b = enc.shape[0]
  draft = _draft(draft_net, reference, alpha)

  def spec(gamma):
    return lambda: (
      sd.generate(
        target,
        enc,
        draft=draft,
        gamma=gamma,
        max_decode_len=m,
        max_auto_gamma=MAX_AUTO_GAMMA,
      ).tokens
    )

  # Warm-up: compiles, the auto policy's cost measurement, greedy identity.
  t0 = time.perf_counter()
  auto = sd.generate(
    target,
    enc,
    draft=draft,
    gamma='auto',
    max_decode_len=m,
    max_auto_gamma=MAX_AUTO_GAMMA,
  )
  measure_seconds = time.perf_counter() - t0
  # Carried: each decode starts from the estimate of the one before (the
  # cold warm-up's first), as a caller decoding many batches runs it.
  carry = {'acceptance': auto.gamma_choice['acceptance'], 'decodes': []}

  def carried():
    out = sd.generate(
      target,
      enc,
      draft=draft,
      gamma='auto',
      max_decode_len=m,
      max_auto_gamma=MAX_AUTO_GAMMA,
      acceptance=carry['acceptance'],
    )
    carry['acceptance'] = out.gamma_choice['acceptance']
    carry['decodes'].append(out.gamma_choice)
    return out.tokens

  same = {
    'auto': _same_rows(auto.tokens, plain.tokens),
    'auto_carried': _same_rows(carried(), plain.tokens),
  }
  for g in gammas:
    same[str(g)] = _same_rows(spec(g)(), plain.tokens)
  if check:
    broken = [name for name, share in same.items() if share < 1.0]
    assert not broken, f'greedy identity broken ({broken})'
  runs = {
    'plain': lambda: sd.generate(target, enc, max_decode_len=m).tokens,
    'auto': spec('auto'),
    'auto_carried': carried,
    **{str(g): spec(g) for g in gammas},
  }
  carry['decodes'].clear()
  seconds = _timed_rounds(runs, repeats)
  last = carry['decodes'][-1]
  tok_s = {name: b * m / s for name, s in seconds.items()}
  fixed = {int(g): tok_s[str(g)] for g in gammas}
  best = max(fixed, key=fixed.get)
  return dict(
    batch=b,
    alpha=alpha,
    plain_tok_s=tok_s['plain'],
    auto_tok_s=tok_s['auto'],
    best_fixed_tok_s=fixed[best],
    best_fixed_gamma=best,
    fixed_tok_s={str(g): t for g, t in fixed.items()},
    auto_vs_plain=tok_s['auto'] / tok_s['plain'],
    auto_vs_best_fixed=tok_s['auto'] / fixed[best],
    auto_gamma_iterations={
      str(g): n for g, n in auto.gamma_choice['gamma_iterations'].items()
    },
    auto_iteration_ms={
      str(g): (None if s is None else s * 1e3)
      for g, s in auto.gamma_choice['iteration_seconds'].items()
    },
    auto_carried_tok_s=tok_s['auto_carried'],
    auto_carried_vs_plain=tok_s['auto_carried'] / tok_s['plain'],
    auto_carried_vs_best_fixed=tok_s['auto_carried'] / fixed[best],
    auto_carried_gamma_iterations={
      str(g): n for g, n in last['gamma_iterations'].items()
    },
    auto_carried_plain_decodes=float(
      np.mean([c['plain_by_estimate'] for c in carry['decodes']])
    ),
    alpha_measured=auto.stats.alpha,
    cost_measure_seconds=measure_seconds,
    same_as_plain=same,
  )


def _same_rows(tokens, plain) -> float:
  """The share of rows of `tokens` equal to `plain`'s."""
  return float(np.mean(np.all(np.asarray(tokens) == plain, axis=1)))

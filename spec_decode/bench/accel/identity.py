"""Greedy identity in a dtype: speculative output against plain, row by row.

Exactness promises greedy speculative output equal to plain greedy output
token for token in float32. In bfloat16 a target call over gamma + 1 tokens
can round differently from one token at a time (other matrix shapes, other
accumulation orders), so a near-tie of the argmax can flip and the outputs
part. This counts the rows that stay identical over `identity_rows`
random-weight target/draft decodes (the real draft: its proposals are the
draft's own), and where rows part, how far in.
"""

import time
from typing import Any

import jax
import numpy as np

import spec_decode as sd
from spec_decode.bench.accel import sizes
from spec_decode.bench.accel.plan import Deadline
from spec_decode.bench.accel.plan import Plan
from spec_decode.bench.accel.record import Recorder
from spec_decode.policy import timing


def first_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Per row, the first position where `a` and `b` differ (-1: none)."""
  diff = a != b
  return np.where(diff.any(1), diff.argmax(1), -1)


def restore(rec: Recorder, target, draft, plan: Plan, box: Deadline) -> None:
  """Where bfloat16 rows part: the identity check again with float32
  attention logits (`T5Config.float32_attention_logits`), and what it costs
  (target step times at 1 and gamma + 1 tokens, both settings), under
  `sections['identity_bfloat16_f32_attention']`."""
  variant = sd.Model(
    target.config.replace(float32_attention_logits=True), target.params
  )
  section = 'identity_bfloat16_f32_attention'
  got = measure(rec, section, variant, draft, plan, box)
  ks = (1, plan.identity_gamma + 1)
  if box.left() > 0:
    got['step_ms'] = {
      'default': _ms(timing.step_times(target, ks, plan.repeats)),
      'float32_attention_logits': _ms(
        timing.step_times(variant, ks, plan.repeats)
      ),
    }
    rec.put(section, None, got)


def _ms(times: dict[int, float]) -> dict[str, float]:
  return {str(k): t * 1e3 for k, t in times.items()}


def measure(
  rec: Recorder,
  section: str,
  target,
  draft,
  plan: Plan,
  box: Deadline,
) -> dict[str, Any]:
  """Fills `sections[section]` batch by batch inside `box`."""
  m, g = plan.max_decode_len, plan.identity_gamma
  out: dict[str, Any] = {
    'dtype': str(target.config.dtype),
    'float32_attention_logits': bool(target.config.float32_attention_logits),
    'matmul_precision': str(jax.config.jax_default_matmul_precision),
    'gamma': g,
    'max_decode_len': m,
    'rows': 0,
    'identical_rows': 0,
    'first_differences': [],
  }
  last = 0.0
  for start in range(0, plan.identity_rows, plan.identity_batch):
    if out['rows'] and not box.fits(1.2 * last):
      rec.skip(section, f'rows {start}+', 'time box')
      break
    t0 = time.perf_counter()
    enc = sizes.inputs(plan.identity_batch, target.vocab_size, seed=start)
    plain = sd.generate(target, enc, max_decode_len=m).tokens
    spec = sd.generate(target, enc, draft=draft, gamma=g, max_decode_len=m)
    first = first_difference(spec.tokens, plain)
    out['rows'] += len(enc)
    out['identical_rows'] += int((first < 0).sum())
    out['first_differences'] += [int(x) for x in first if x >= 0]
    out['share_identical'] = out['identical_rows'] / out['rows']
    out['alpha'] = spec.stats.alpha
    last = time.perf_counter() - t0
    rec.event(section, f'rows {start}..{start + len(enc) - 1}', last)
    rec.put(section, None, out)
  return out

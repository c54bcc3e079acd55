"""The draft's weights in float32 against bfloat16 (packed for the kernel).

`spec-decode bench draft_dtype [--quick] [--out FILE]`: on the
bench's models, speculative decoding under `ControlledDraft` (greedy,
batch 1) with the draft network's decoder packed in float32 and in
bfloat16, side by side in one process (float32 measured again last, to show
the noise). Reports c timed alone, the model calls of one iteration timed
in context (`timing.iteration_time`) and the speedup over plain decoding.

On a CPU whose cache holds one model's weights, the target's weight stream
evicts the draft's every iteration, so the draft's bytes come from DRAM:
halving them shortens every draft step. Exactness does not depend on the
draft's precision (the target verifies every token).
"""

import argparse
import json

import jax.numpy as jnp

import spec_decode as sd
from spec_decode.bench import peer
from spec_decode.bench import speed
from spec_decode.core import inputs
from spec_decode.policy import timing


def run(cfg: speed.BenchConfig, alpha: float, gamma: int) -> dict:
  m = cfg.max_decode_len
  target = peer.suppress_eos(sd.Model.init(cfg.target, seed=0))
  draft32 = sd.Model.init(cfg.draft, seed=1).pack_for_cpu(jnp.float32)
  variants = (
    ('float32', draft32),
    ('bfloat16', draft32.pack_for_cpu(jnp.bfloat16)),
    ('float32 (again)', draft32),
  )
  enc = speed.inputs(1)
  reference = sd.generate(target, enc, max_decode_len=m + gamma + 2).tokens
  plain_time, plain = speed.timed_generate(
    cfg.repeats, model=target, encoder_tokens=enc, max_decode_len=m
  )
  target_step = timing.step_times(target, [1], cfg.repeats)[1]
  rows = {}
  for name, draft_net in variants:
    draft = speed.controlled_draft(draft_net, reference, alpha)
    spec_time, spec = speed.timed_speculative(
      cfg.repeats, target, enc, draft, gamma, m, plain=plain
    )
    rows[name] = dict(
      c=timing.step_times(draft_net, [1], cfg.repeats)[1] / target_step,
      iteration_in_context_ms=timing.iteration_time(
        target, draft_net, gamma, cfg.repeats
      )
      * 1e3,
      speedup=plain_time / spec_time,
      alpha_measured=spec.stats.alpha,
    )
  return dict(alpha=alpha, gamma=gamma, rows=rows)


def to_markdown(r: dict) -> str:
  lines = [
    f'Draft weights, ControlledDraft alpha {r["alpha"]}, gamma {r["gamma"]}',
    '',
    '| draft weights | c (alone) | model calls in context ms | alpha '
    'measured | speedup |',
    '|---|---|---|---|---|',
  ]
  for name, s in r['rows'].items():
    lines.append(
      f'| {name} | {s["c"]:.3f} | {s["iteration_in_context_ms"]:.1f} | '
      f'{s["alpha_measured"]:.3f} | {s["speedup"]:.2f}x |'
    )
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench draft_dtype', description=__doc__.splitlines()[0]
  )
  parser.add_argument(
    '--quick', action='store_true', help='bench --quick models'
  )
  parser.add_argument('--alpha', type=float, default=0.8)
  parser.add_argument('--gamma', type=inputs.gamma_flag(auto=False), default=4)
  parser.add_argument('--out', default='bench_draft_dtype.json')
  args = parser.parse_args(argv)
  if not 0.0 <= args.alpha <= 1.0:
    parser.error('need 0 <= --alpha <= 1')
  r = run(speed.QUICK if args.quick else speed.FULL, args.alpha, args.gamma)
  with open(args.out, 'w') as f:
    json.dump(r, f, indent=2)
  print(to_markdown(r))
  print(f'\nwrote {args.out}')
  return 0

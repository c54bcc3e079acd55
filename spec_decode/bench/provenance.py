"""What recording each token's provenance costs: the same loop with and
without it, side by side in one process.

  spec-decode bench provenance [--num_examples 20] [--rounds 7] [--gamma 4]
      [--target checkpoints/demo/target] [--draft checkpoints/demo/draft_seqkd]
      [--data_dir data/demo] [--out bench_provenance.json]

The demo pair decodes the first examples of the demo's Debian EnDe slice
one at a time (batch 1, greedy, as `make demo`), in the fixed-γ loop with
`DecodeSettings.provenance` on and off (two compiled programs). Every round
times one pass over the examples with each, in alternating order, so that
a load spike hits both alike; the outputs are fetched to the host each
time, so the provenance's transfer is in the timing. Reported: each
setting's median pass, the ratio of the medians (on / off) and the spread
of the rounds' paired ratios (the noise the ratio must stand out of).
"""

import argparse
import dataclasses
import json
import statistics
import time

import jax
import numpy as np

import spec_decode as sd
from spec_decode.chain import loops
from spec_decode.core import inputs
from spec_decode.data import tasks

TASK = 'debian_ende'


def _pass(target, draft, encs, settings) -> float:
  """Seconds to decode every row of `encs` (one program call each)."""
  t0 = time.perf_counter()
  for i, enc in enumerate(encs):
    keys = inputs.row_keys(i, 1)
    jax.device_get(
      loops.speculative_decode_jit(target, draft, enc, keys, settings=settings)
    )
  return time.perf_counter() - t0


def measure(target, draft, encs, settings, rounds: int) -> dict:
  """Median seconds per pass with provenance on and off, and their ratio."""
  on = dataclasses.replace(settings, provenance=True)
  off = dataclasses.replace(settings, provenance=False)
  for s in (on, off):  # Compile every input shape.
    _pass(target, draft, encs, s)
  times = {'on': [], 'off': []}
  for r in range(rounds):
    order = (('on', on), ('off', off))
    for name, s in order if r % 2 == 0 else order[::-1]:
      times[name].append(_pass(target, draft, encs, s))
  paired = [a / b for a, b in zip(times['on'], times['off'], strict=True)]
  med_on, med_off = (
    statistics.median(times['on']),
    statistics.median(times['off']),
  )
  return {
    'seconds_on': times['on'],
    'seconds_off': times['off'],
    'median_on': med_on,
    'median_off': med_off,
    'ratio': med_on / med_off,
    'paired_ratios': paired,
    'paired_ratio_min': min(paired),
    'paired_ratio_max': max(paired),
  }


def _encoder_rows(vocab, data_dir, n, max_input_len=256) -> list[np.ndarray]:
  """The first n examples' inputs, one `[1, S]` row each (S rounded up to
  a multiple of 16 so that few shapes compile)."""
  exs = tasks.examples(tasks.get_task(TASK, data_dir), 'test', limit=n)
  rows = []
  for ex in exs:
    ids = vocab.encode(ex['inputs'])[: max_input_len - 1] + [sd.EOS_ID]
    width = -(-len(ids) // 16) * 16
    enc = np.zeros((1, width), np.int32)
    enc[0, : len(ids)] = ids
    rows.append(enc)
  return rows


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    prog='spec-decode bench provenance', description=__doc__.split('\n')[0]
  )
  p.add_argument('--target', default='checkpoints/demo/target')
  p.add_argument('--draft', default='checkpoints/demo/draft_seqkd')
  p.add_argument('--data_dir', default='data/demo')
  p.add_argument('--num_examples', type=int, default=20)
  p.add_argument('--rounds', type=int, default=7)
  p.add_argument('--gamma', type=int, default=4)
  p.add_argument('--max_decode_len', type=int, default=128)
  p.add_argument('--out', default='bench_provenance.json')
  args = p.parse_args(argv)
  from spec_decode import paths  # pylint: disable=g-import-not-at-top

  target = sd.Model.load(paths.resolve(args.target))
  draft = sd.Model.load(paths.resolve(args.draft))
  encs = _encoder_rows(target.vocabulary, args.data_dir, args.num_examples)
  settings = sd.DecodeSettings(
    max_decode_len=args.max_decode_len, gamma=args.gamma
  )
  out = measure(target, draft, encs, settings, args.rounds)
  out.update(
    examples=len(encs),
    gamma=args.gamma,
    rounds=args.rounds,
    device=str(jax.devices()[0]),
    command='spec-decode bench provenance '
    + ' '.join(argv if argv is not None else []),
  )
  print(
    '| provenance | median pass (s) |\n|---|---|\n'
    f'| on | {out["median_on"]:.3f} |\n| off | {out["median_off"]:.3f} |\n\n'
    f"on / off: {out['ratio']:.4f} (rounds' paired ratios "
    f'{out["paired_ratio_min"]:.4f}..{out["paired_ratio_max"]:.4f}; '
    f'{len(encs)} examples, gamma {args.gamma}, {args.rounds} rounds, '
    f'{out["device"]})'
  )
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump(out, f, indent=2)
    f.write('\n')
  return 0

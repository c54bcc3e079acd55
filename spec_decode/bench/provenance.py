"""What recording each token's provenance costs: the same loop with and
without it, side by side in one process.

  spec-decode bench provenance [--num_examples 20] [--rounds 5] [--gamma 4]
      [--target checkpoints/demo/target] [--draft checkpoints/demo/draft_seqkd]
      [--data_dir data/demo] [--out bench_provenance.json]

The demo pair decodes the first examples of the demo's Debian EnDe slice
one at a time (batch 1, greedy, as `make demo`), in the fixed-γ loop with
`DecodeSettings.provenance` on and off (two compiled programs). Each
example is decoded with both back to back, in alternating order, in every
round, so that a load spike hits both sides of a pair alike; the outputs
are fetched to the host each time, so the provenance's transfer is in the
timing. Reported: the seconds of all decodes with each setting, their
ratio (on / off), and the median of the pairs' ratios (robust to a load
spike in one decode), each with a 95% bootstrap interval over the pairs.
"""

import argparse
import dataclasses
import json
import statistics
import time

import jax
import numpy as np

import spec_decode as sd
from spec_decode.chain import generation
from spec_decode.chain import loops
from spec_decode.core import inputs
from spec_decode.data import tasks

TASK = 'debian_ende'


def _decode(target, draft, enc, key_seed, settings) -> float:
  """Seconds to decode `enc` (one program call, outputs on the host)."""
  keys = inputs.row_keys(key_seed, enc.shape[0])
  t0 = time.perf_counter()
  jax.device_get(
    loops.speculative_decode_jit(target, draft, enc, keys, settings=settings)
  )
  return time.perf_counter() - t0


def measure(target, draft, encs, settings, rounds: int, seed: int = 0) -> dict:
  """Seconds with provenance on and off, paired decode by decode.

  Every example is decoded with both settings back to back, in alternating
  order, `rounds` times over the examples: a pair shares the machine's
  load, so the pairs' ratios (on / off) hold the cost, and their spread the
  noise. Returns the totals, their ratio and the median pair ratio, each
  ratio with a 95% bootstrap interval over the pairs.
  """
  on = dataclasses.replace(settings, provenance=True)
  off = dataclasses.replace(settings, provenance=False)
  for i, enc in enumerate(encs):  # Compile every input shape.
    for s in (on, off):
      _decode(target, draft, enc, i, s)
  pairs = []
  for r in range(rounds):
    for i, enc in enumerate(encs):
      if (r + i) % 2:
        b, a = (
          _decode(target, draft, enc, i, off),
          _decode(target, draft, enc, i, on),
        )
      else:
        a, b = (
          _decode(target, draft, enc, i, on),
          _decode(target, draft, enc, i, off),
        )
      pairs.append((a, b))
  t = np.asarray(pairs)  # [P, 2]: on, off
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(t), size=(2000, len(t)))
  boot = t[idx, 0].sum(1) / t[idx, 1].sum(1)
  pair = t[:, 0] / t[:, 1]
  boot_median = np.median(pair[idx], axis=1)
  return {
    'seconds_on': float(t[:, 0].sum()),
    'seconds_off': float(t[:, 1].sum()),
    'ratio': float(t[:, 0].sum() / t[:, 1].sum()),
    'ratio_ci95': [
      float(np.quantile(boot, 0.025)),
      float(np.quantile(boot, 0.975)),
    ],
    'median_pair_ratio': float(statistics.median(pair)),
    'median_pair_ratio_ci95': [
      float(np.quantile(boot_median, 0.025)),
      float(np.quantile(boot_median, 0.975)),
    ],
    'pairs': len(t),
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
  p.add_argument('--rounds', type=int, default=5)
  p.add_argument('--gamma', type=inputs.gamma_flag(auto=False), default=4)
  p.add_argument('--max_decode_len', type=int, default=128)
  p.add_argument('--out', default='bench_provenance.json')
  args = p.parse_args(argv)
  from spec_decode import paths  # pylint: disable=g-import-not-at-top

  target = sd.Model.load(paths.resolve(args.target))
  draft = sd.Model.load(paths.resolve(args.draft))
  encs = _encoder_rows(target.vocabulary, args.data_dir, args.num_examples)
  settings = generation.decode_settings(
    speculative=True, gamma=args.gamma, max_decode_len=args.max_decode_len
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
    '| provenance | seconds (all decodes) |\n|---|---|\n'
    f'| on | {out["seconds_on"]:.3f} |\n| off | {out["seconds_off"]:.3f} |\n'
    f'\non / off: {out["ratio"]:.4f} (95% bootstrap interval '
    f'{out["ratio_ci95"][0]:.4f}..{out["ratio_ci95"][1]:.4f}); median pair '
    f'ratio {out["median_pair_ratio"]:.4f} (95% '
    f'{out["median_pair_ratio_ci95"][0]:.4f}..'
    f'{out["median_pair_ratio_ci95"][1]:.4f}); {out["pairs"]} pairs: '
    f'{len(encs)} examples x {args.rounds} rounds, gamma {args.gamma}, '
    f'{out["device"]}'
  )
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump(out, f, indent=2)
    f.write('\n')
  return 0

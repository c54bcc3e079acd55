"""Drafts that live on the target against separate draft models.

The EAGLE-style feature draft (`drafters.FeatureDraft`), the early-exit
self-draft (`drafters.EarlyExit`, the target's first k decoder layers; the
k with the best greedy batch-1 wall time), Medusa heads and the demo's
two-model drafts (the sequence-distilled T5 draft, the demo default, and
the soft-distilled one), on the demo target and the Debian EnDe test split:
greedy and temperature 1, batch 1 and 8, chains (gamma G) and one token
tree. Per cell: alpha, output tokens per target call (pooled over rows), c
(one draft token's time over one target step, `policy.timing.measure`) and
the wall-time speedup over plain decoding of the same inputs (after a
warm-up decode that compiles: the median over `--repeats` interleaved
rounds of a plain and a speculative pass of the ratio of their times).

  JAX_PLATFORMS=cpu spec-decode bench on_target --out bench_on_target.json

Every speculative output is checked against plain decoding at temperature
0 (the rows must be identical) and counted in the JSON.
"""

import argparse
import json
import os
import time

import numpy as np

import spec_decode as sd
from spec_decode import paths
from spec_decode.bench.drafts.table import encoder_tokens
from spec_decode.core import inputs
from spec_decode.core import model_drafter
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.drafters import feature as feature_lib
from spec_decode.drafters import heads as heads_lib
from spec_decode.policy import timing

TARGET = 'checkpoints/demo/target'
DRAFTS = {
  'T5 draft, seq-distilled (0.74M)': 'checkpoints/demo/draft_seqkd',
  'T5 draft, soft-distilled (0.74M)': 'checkpoints/demo/draft',
  'Medusa heads': 'checkpoints/demo/heads',
  'feature draft (EAGLE-style)': 'checkpoints/demo/feature',
}
EARLY_EXIT = 'early exit'


def load_drafts(target, drafts: dict[str, str]) -> dict:
  """Name -> draft: a `Model`, `Heads` or `FeatureDraft` directory."""
  out = {}
  for name, path in drafts.items():
    full = paths.resolve(path)
    if feature_lib.is_feature_draft_dir(full):
      out[name] = sd.drafters.FeatureDraft.load(full, target)
    elif os.path.isfile(os.path.join(full, heads_lib.INFO_FILE)):
      out[name] = sd.drafters.Heads.load(full)
    else:
      out[name] = sd.Model.load(full)
  return out


def _decode_all(target, draft, enc, batch, shape, temperature, max_len):
  """Decodes `enc` in batches of `batch` rows (seeds by row); returns the
  outputs and the pooled (alpha, tokens per call, beta sum, tries)."""
  outs, beta, tries, tokens, iters = [], 0.0, 0, 0, 0
  for start in range(0, enc.shape[0], batch):
    out = sd.generate(
      target,
      enc[start : start + batch],
      draft=draft,
      temperature=temperature,
      max_decode_len=max_len,
      seed=np.arange(start, start + batch),
      **shape,
    )
    outs.append(out.tokens)
    if out.stats is not None:
      s = out.stats
      beta += float(s.row_beta_sum.sum())
      tries += int(s.row_position_tries.sum())
      tokens += int(out.lengths.sum())
      iters += int(s.row_iterations.sum())
  return np.concatenate(outs), {
    'alpha': beta / max(tries, 1),
    'tokens_per_call': tokens / max(iters, 1),
  }


def _c(target, draft, batch, gamma, repeats):
  settings = DecodeSettings(max_decode_len=64, gamma=gamma)
  d = model_drafter.drafting_copy(draft, target)
  return float(timing.measure(target, d, (1,), batch, repeats, settings)['c'])


def run(args) -> dict:
  target = sd.Model.load(paths.resolve(args.target))
  enc = encoder_tokens(
    'debian_ende', target.vocabulary, 'test', args.num_examples, 128
  )
  named = dict(DRAFTS)
  if args.feature:
    named[next(n for n in named if n.startswith('feature'))] = args.feature
  drafts = load_drafts(target, named)
  layers = target.config.num_decoder_layers
  shapes = {f'chain {args.gamma}': dict(gamma=args.gamma)}
  if args.tree:
    tree = tuple(int(b) for b in args.tree.split(','))
    shapes[f'tree {args.tree}'] = dict(tree=tree)
  result = {'cells': [], 'early_exit_sweep': [], 'identity_failures': 0}
  plain_out = {}

  def decode(draft, batch, temperature, shape_name):
    shape = shapes[shape_name] if draft is not None else {}
    return _decode_all(
      target, draft, enc, batch, shape, temperature, args.max_decode_len
    )

  def cell(name, draft, batch, temperature, shape_name):
    key = (batch, temperature)
    if key not in plain_out:
      plain_out[key] = decode(None, batch, temperature, shape_name)[0]
    out, st = decode(draft, batch, temperature, shape_name)  # Compiles.
    # Interleaved rounds (plain, then speculative): on a shared machine the
    # load changes between rounds, not within one.
    plain_s, spec_s = [], []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      decode(None, batch, temperature, shape_name)
      plain_s.append(time.perf_counter() - t0)
      t0 = time.perf_counter()
      decode(draft, batch, temperature, shape_name)
      spec_s.append(time.perf_counter() - t0)
    speedup = float(np.median(np.asarray(plain_s) / np.asarray(spec_s)))
    if temperature == 0.0 and not np.array_equal(out, plain_out[key]):
      result['identity_failures'] += 1
    row = {
      'draft': name,
      'temperature': temperature,
      'batch': batch,
      'shape': shape_name,
      **st,
      'seconds': float(np.median(spec_s)),
      'plain_seconds': float(np.median(plain_s)),
      'speedup': speedup,
    }
    print(
      f'| {name} | {temperature:g} | {batch} | {shape_name} | '
      f'{st["alpha"]:.3f} | {st["tokens_per_call"]:.2f} | {speedup:.2f}x |',
      flush=True,
    )
    return row

  # The self-draft's k: the best greedy batch-1 chain wall time.
  chain = f'chain {args.gamma}'
  for k in range(1, layers):
    ee = sd.drafters.EarlyExit.of(target, k)
    row = cell(f'{EARLY_EXIT} k={k}', ee, 1, 0.0, chain)
    row['c'] = _c(target, ee, 1, args.gamma, args.repeats)
    result['early_exit_sweep'].append(row)
  best = max(result['early_exit_sweep'], key=lambda r: r['speedup'])
  best_k = int(best['draft'].split('k=')[1])
  drafts[f'{EARLY_EXIT} k={best_k}'] = sd.drafters.EarlyExit.of(target, best_k)
  costs = {}
  for name, draft in drafts.items():
    for batch in args.batches:
      costs[(name, batch)] = _c(target, draft, batch, args.gamma, args.repeats)
  for batch in args.batches:
    for temperature in args.temperatures:
      for shape_name in shapes:
        for name, draft in drafts.items():
          row = cell(name, draft, batch, temperature, shape_name)
          row['c'] = costs[(name, batch)]
          result['cells'].append(row)
  result['best_early_exit_k'] = best_k
  return result


def markdown(result: dict) -> str:
  lines = [
    '| draft | t | batch | shape | alpha | tokens / call | c | speedup |',
    '|---|---|---|---|---|---|---|---|',
  ]
  for r in result['cells']:
    lines.append(
      f'| {r["draft"]} | {r["temperature"]:g} | {r["batch"]} | '
      f'{r["shape"]} | {r["alpha"]:.3f} | {r["tokens_per_call"]:.2f} | '
      f'{r["c"]:.3f} | {r["speedup"]:.2f}x |'
    )
  lines += [
    '',
    f'Early exit, greedy, batch 1, chain (best k = '
    f'{result["best_early_exit_k"]}):',
    '',
    '| k | alpha | tokens / call | c | speedup |',
    '|---|---|---|---|---|',
  ]
  for r in result['early_exit_sweep']:
    lines.append(
      f'| {r["draft"].split("k=")[1]} | {r["alpha"]:.3f} | '
      f'{r["tokens_per_call"]:.2f} | {r["c"]:.3f} | {r["speedup"]:.2f}x |'
    )
  lines.append('')
  lines.append(
    f'Greedy outputs differing from plain decoding: '
    f'{result["identity_failures"]}'
  )
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench on_target', description=__doc__.split('\n')[0]
  )
  parser.add_argument('--target', default=TARGET)
  parser.add_argument(
    '--feature', default=None, help='another feature draft directory'
  )
  parser.add_argument('--num_examples', type=int, default=24)
  parser.add_argument('--gamma', type=inputs.gamma_flag(auto=False), default=4)
  parser.add_argument(
    '--tree', default='2,1,1,1', help="branching of the tree rows ('': none)"
  )
  parser.add_argument('--batches', type=int, nargs='+', default=[1, 8])
  parser.add_argument(
    '--temperatures', type=float, nargs='+', default=[0.0, 1.0]
  )
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--out', default='bench_on_target.json')
  args = parser.parse_args(argv)
  if any(args.num_examples % b for b in args.batches):
    parser.error('--num_examples must be a multiple of every batch size')
  print('| draft | t | batch | shape | alpha | tokens / call | speedup |')
  print('|---|---|---|---|---|---|---|')
  result = run(args)
  result['args'] = vars(args)
  print()
  print(markdown(result))
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=2)
  return 0 if result['identity_failures'] == 0 else 1

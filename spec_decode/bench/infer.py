"""The infer job's throughput, plain against speculative, in one process.

  spec-decode bench infer [--num_examples 50] [--rounds 3] [--gamma 4]
      [--target checkpoints/demo/target] [--draft checkpoints/demo/draft_seqkd]
      [--data_dir data/demo] [--out bench_infer.json]

`spec-decode infer`'s library entry point (`eval.infer.run.infer`) runs the
first examples of the shipped Debian EnDe test split through the demo pair,
batch 1, greedy, as `make demo` decodes them: speculatively with the draft
(γ `--gamma`), and plainly (no draft: the same job, the same files, the
target alone). One untimed run of each compiles every input width; then
each of `--rounds` rounds runs both, in alternating order, each into a
fresh output directory. Reported: predictions per second and tokens per
second of each side (the job's decoding seconds, as its summary counts
them; medians over rounds), the rounds' speculative / plain ratios and
their median, and the speculative side's tokens per target call, alpha and
share of outputs without EOS. The predictions of both sides are checked
equal (greedy).
"""

import argparse
import json
import os
import statistics
import tempfile
from typing import Any

import jax

from spec_decode import paths
from spec_decode.core import inputs
from spec_decode.eval.infer import run as infer_lib

TASK = 'debian_ende'


def _run(target, draft, settings, root: str, name: str) -> dict[str, Any]:
  out = os.path.join(root, name)
  summary = infer_lib.infer(
    target, draft, settings, output_dir=out, overwrite=True, progress=False
  )
  path = os.path.join(out, infer_lib.predictions_file(TASK, 'predict'))
  with open(path, encoding='utf-8') as f:
    summary['predictions'] = [json.loads(x)['prediction'] for x in f]
  return summary


def measure(target, draft, settings, rounds: int) -> dict[str, Any]:
  """Both sides, compiled first, then `rounds` alternating rounds."""
  sides = {'speculative': draft, 'plain': None}
  runs = {name: [] for name in sides}
  with tempfile.TemporaryDirectory() as root:
    for name, d in sides.items():  # Compile every input width.
      _run(target, d, settings, root, f'warm_{name}')
    for r in range(rounds):
      order = list(sides.items())
      for name, d in order if r % 2 == 0 else order[::-1]:
        runs[name].append(_run(target, d, settings, root, f'{name}_{r}'))
  spec, plain = runs['speculative'], runs['plain']
  if spec[0]['predictions'] != plain[0]['predictions']:
    raise AssertionError('greedy speculative predictions differ from plain')
  ratios = [
    s['examples_per_second'] / p['examples_per_second']
    for s, p in zip(spec, plain, strict=True)
  ]

  def med(side, key):
    return statistics.median(x[key] for x in side)

  return {
    'examples': spec[0]['examples'],
    'plain_examples_per_second': med(plain, 'examples_per_second'),
    'plain_tokens_per_second': med(plain, 'tokens_per_second'),
    'speculative_examples_per_second': med(spec, 'examples_per_second'),
    'speculative_tokens_per_second': med(spec, 'tokens_per_second'),
    'speedup_rounds': ratios,
    'speedup': statistics.median(ratios),
    'tokens_per_call': spec[0]['tokens_per_call'],
    'alpha': spec[0]['alpha'],
    'no_eos_fraction': spec[0]['no_eos_fraction'],
    'identical_predictions': True,
  }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    prog='spec-decode bench infer', description=__doc__.split('\n')[0]
  )
  p.add_argument('--target', default='checkpoints/demo/target')
  p.add_argument('--draft', default='checkpoints/demo/draft_seqkd')
  p.add_argument('--data_dir', default='data/demo')
  p.add_argument('--num_examples', type=int, default=50)
  p.add_argument('--rounds', type=int, default=3)
  p.add_argument('--gamma', type=inputs.gamma_flag(), default=4)
  p.add_argument('--max_decode_len', type=int, default=128)
  p.add_argument('--out', default='bench_infer.json')
  args = p.parse_args(argv)
  if args.rounds < 1 or args.num_examples < 1:
    p.error('--rounds and --num_examples must be >= 1')
  settings = infer_lib.InferSettings(
    task=TASK,
    data_dir=paths.resolve(args.data_dir),
    num_examples=args.num_examples,
    batch_size=1,
    gamma=args.gamma,
    max_decode_len=args.max_decode_len,
  )
  target = infer_lib.load_model(checkpoint=paths.resolve(args.target))
  draft = infer_lib.load_model(checkpoint=paths.resolve(args.draft))
  out = measure(target, draft, settings, args.rounds)
  out.update(
    gamma=args.gamma,
    rounds=args.rounds,
    device=str(jax.devices()[0]),
    command='spec-decode bench infer '
    + ' '.join(argv if argv is not None else []),
  )
  ratios = ', '.join(f'{x:.2f}x' for x in out['speedup_rounds'])
  print(
    '| infer | predictions/s | tokens/s |\n|---|---|---|\n'
    f'| plain | {out["plain_examples_per_second"]:.2f} | '
    f'{out["plain_tokens_per_second"]:.1f} |\n'
    f'| speculative (γ {args.gamma}) | '
    f'{out["speculative_examples_per_second"]:.2f} | '
    f'{out["speculative_tokens_per_second"]:.1f} |\n'
    f'\nspeculative / plain: {out["speedup"]:.2f}x (median of rounds: '
    f'{ratios}); {out["examples"]} predictions each, identical; '
    f'{out["tokens_per_call"]:.2f} tokens per target call, alpha '
    f'{out["alpha"]:.3f}, {out["no_eos_fraction"]:.0%} without EOS; '
    f'{out["device"]}'
  )
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump(out, f, indent=2)
    f.write('\n')
  return 0

"""`spec-decode bench`: speed measured side by side, and the sub-benchmarks.

  spec-decode bench [--quick] [--out bench.json] [--kernel both|on|off|none]
      [--kernel_only] [--profile on|off] [--profile_only] [--policy_only]
      [--dtype float32|bfloat16]
  spec-decode bench BENCHMARK [its flags]

Without a BENCHMARK: the sections of `bench.speed` (plain decoding
efficiency, v(k), speculative vs plain under controlled acceptance, batch
sizes, the Hugging Face peer, compile counts; `--kernel` and `--profile`
add the kernel on/off and profile sections), printed as Markdown tables
(`bench.report`) and written as JSON to `--out`. `make bench` runs it with
`load`, `draft_dtype`, `trees`, `memory` and `beam`. `spec-decode bench
BENCHMARK --help` gives a sub-benchmark's flags. On a GPU or TPU:
`SPEC_DECODE_KERNEL=0 spec-decode bench --quick --dtype bfloat16` (bf16
weights and activations, float32 logits, as T5X runs them there).
"""

import argparse
import importlib
import json
import sys

from spec_decode.bench import kernel_sections
from spec_decode.bench import report
from spec_decode.bench import speed

# Sub-benchmark -> (module with `main(argv) -> int`, one line of help).
# Imported only when run.
BENCHMARKS = {
  'load': (
    'spec_decode.bench.load',
    'load time and peak host memory of a model in each checkpoint format',
  ),
  'draft_dtype': (
    'spec_decode.bench.drafts.dtype',
    "the draft's weights in float32 against bfloat16 (packed)",
  ),
  'kernel': (
    'spec_decode.bench.kernel',
    "XLA's dot vs the small-K CPU kernel, inside jit",
  ),
  'drafters': (
    'spec_decode.bench.drafts.table',
    'acceptance of the unigram, bigram and Copy drafters on a Debian task',
  ),
  'memory': (
    'spec_decode.bench.memory',
    'bytes per device on the capacity plan meshes, against the plan; a '
    "T5Gemma decode state's sliding and global layers by output length",
  ),
  'hierarchical': (
    'spec_decode.bench.drafts.hierarchical',
    'hierarchical drafting on the demo pair (Debian EnDe, greedy)',
  ),
  'trees': (
    'spec_decode.bench.drafts.trees',
    'token trees vs chains: tokens per target call and wall time',
  ),
  'on_target': (
    'spec_decode.bench.drafts.on_target',
    'feature draft, early exit, Medusa heads and two-model drafts side by '
    'side on the demo pair',
  ),
  'accel': (
    'spec_decode.bench.accel.run',
    'the accelerator bench: T5 small to XXL with the small draft, then '
    'T5Gemma 9B-2B with S-S, bf16, in a time budget (--tiny: the CPU '
    'rehearsal)',
  ),
  'beam': (
    'spec_decode.bench.beam.search',
    'plain vs speculative beam search: wall time and steps per target call',
  ),
  'infer': (
    'spec_decode.bench.infer',
    'the infer job on the demo pair: predictions per second, plain vs '
    'speculative',
  ),
  'provenance': (
    'spec_decode.bench.provenance',
    "the loop with and without each token's provenance, side by side",
  ),
  'sum_blocks': (
    'spec_decode.bench.sum_blocks',
    "float32 sums in blocks (cpu_sum_block) against XLA's: teacher "
    'forcing and training step time, product precision',
  ),
}


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench',
    usage='%(prog)s [-h] [flags] | %(prog)s BENCHMARK [its flags]',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
    '--quick',
    action='store_true',
    help='smaller models and fewer repeats; its gamma=auto grid (batch 1, '
    '8, 32 x alpha 0.5, 0.95) took 15-18 minutes on a shared 2-core CPU',
  )
  parser.add_argument('--out', default='bench.json', help='JSON output path')
  parser.add_argument(
    '--dtype',
    choices=('float32', 'bfloat16'),
    default='float32',
    help="both models' weights and activations (logits stay float32); "
    'bfloat16 is for accelerators (XLA:CPU runs bf16 matmuls slowly)',
  )
  parser.add_argument(
    '--kernel',
    choices=('both', 'on', 'off', 'none'),
    default=None,
    help='sections 1-3 again with the small-K CPU kernel on and/or off '
    '(JSON key "kernel"); none skips them (default: both, none with '
    '--quick)',
  )
  parser.add_argument(
    '--kernel_only', action='store_true', help='only the --kernel sections'
  )
  parser.add_argument(
    '--profile',
    choices=('on', 'off'),
    default='on',
    help='where a speculative iteration\'s time goes (JSON key "profile")',
  )
  parser.add_argument(
    '--profile_only', action='store_true', help='only the --profile section'
  )
  parser.add_argument(
    '--policy_only',
    action='store_true',
    help="only the gamma='auto' batch x alpha grid (JSON key batch_policy)",
  )
  # Listed for --help; `main` runs a sub-benchmark before parsing.
  subcommands = parser.add_subparsers(
    title='sub-benchmarks',
    dest='benchmark',
    metavar='BENCHMARK',
  )
  for name, (_, text) in BENCHMARKS.items():
    subcommands.add_parser(name, help=text, add_help=False)
  return parser


def _run_speed(args: argparse.Namespace) -> int:
  """The sections of `bench.speed` per the flags: JSON out, Markdown shown."""
  cfg = speed.with_dtype(speed.QUICK if args.quick else speed.FULL, args.dtype)
  if args.kernel is None:
    args.kernel = 'none' if args.quick else 'both'
  if args.policy_only:
    results = {
      'batch_policy': speed.policy_section(cfg),
      'quick': args.quick,
      'dtype': args.dtype,
    }
    with open(args.out, 'w') as f:
      json.dump(results, f, indent=2)
    print(report.policy_markdown(results['batch_policy']))
    print(f'\nwrote {args.out}')
    return 0
  only = args.kernel_only or args.profile_only
  results = {} if only else speed.run(cfg)
  if args.kernel != 'none' and not args.profile_only:
    settings = ('off', 'on') if args.kernel == 'both' else (args.kernel,)
    results['kernel'] = kernel_sections.kernel_sections(cfg, settings)
  if (args.profile == 'on' and not args.kernel_only) or args.profile_only:
    results['profile'] = speed.profile_section(cfg)
  results['quick'] = args.quick
  results['dtype'] = args.dtype
  with open(args.out, 'w') as f:
    json.dump(results, f, indent=2)
  if not only:
    print(report.to_markdown(results))
  if 'kernel' in results:
    print('\n' + report.kernel_markdown(results['kernel']))
  if 'profile' in results:
    print('\n' + report.profile_markdown(results['profile']))
  print(f'\nwrote {args.out}')
  return 0


def main(argv: list[str] | None = None) -> int:
  """Runs `spec-decode bench [BENCHMARK] ...`; returns the exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] in BENCHMARKS:
    module = importlib.import_module(BENCHMARKS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)
  parser = _parser()
  args = parser.parse_args(argv)
  if args.benchmark is not None:
    parser.error(
      f'name the sub-benchmark first: spec-decode bench {args.benchmark} '
      '[its flags]'
    )
  return _run_speed(args)

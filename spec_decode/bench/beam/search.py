"""Plain against speculative beam search: wall time and steps per call.

Two sections, printed as one table and written as JSON (`--out`, key
`beam`, one row per setting with `source`, `num_beams`, `gamma`,
`plain_s`, `spec_s`, `speedup`, `steps_per_call` and `exact`):

1. The demo pair (target `checkpoints/demo/target`, draft
   `checkpoints/demo/draft_seqkd`) on the first `--num_examples` Debian
   EnDe test inputs (`--data_dir`; fixed English sentences with T5's
   translation prefix when it does not exist), one at a time (batch 1, as
   `make demo`), at every `--num_beams` and `--gammas`, and with a random
   bigram table as the draft at the first gamma (nearly free, it covers
   almost nothing: its ms per call against plain's ms per step is what a
   call costs beyond the draft). Every configuration
   compiles first (inputs padded to one width), then `--repeats` rounds
   decode every example plainly and speculatively, interleaved (a load
   spike on a shared machine hits both alike); an example's time is its
   median over the rounds, a row's time the sum over examples.
2. Controlled acceptance (one batch of `--controlled_batch` of the same
   inputs, at each `--controlled_beams`, gamma and `--alphas`): the draft
   is `ControlledBeamDraft`, the demo draft run for its cost with its
   logits biased by plain beam search's own trajectory.
   Acceptance alpha means: at each (batch row, step s), with probability
   alpha (a coin fixed per row and step), the draft's next-token
   distribution after any input at position s - 1 whose token is the last
   token of one of the target's live beams at step s - 1 puts its mass on
   exactly the tokens that extend such a beam into a live beam of step s
   (logit + 1e4); otherwise it puts none there (logit - 1e4). The key is
   (row, position, last token), so a draft scores a node without knowing
   its whole prefix, as an n-gram table does (the draft's own network still
   runs on the real prefix, for its cost). A call from step n then commits
   1 + a steps, a the run of agreeing steps n + 1, n + 2, ... (at most
   gamma): E[steps per call] = (1 - alpha^(gamma + 1)) / (1 - alpha), as
   E[tokens] for a greedy chain, when every beam's tree can hold its
   target children (this section's trees: `draft_beams` = `draft_children`
   = num_beams unless the flags say otherwise) and no
   two live beams of a step share their last token. Where they do, the
   union of their children is proposed after both and can crowd a right
   node out of a tree; the table reports the fraction of such steps
   ('shared last') next to the measured steps per call, which is the
   measured quantity. alpha = 0 commits exactly one step per call.

3. Coverage (`bench/beam/coverage.py`, JSON key `beam_coverage`): along plain
   beam search's path on the demo inputs, how often all K new live beams'
   tokens rank among their parents' c best non-EOS tokens, ranked by the
   target (a perfect draft's ceiling) and by the draft: why a K-beam step
   is or is not covered.

Exact: every row's beams (tokens and lengths) equal plain beam search's
and every score is within 1e-5 of plain's (the eval's rule).

  JAX_PLATFORMS=cpu spec-decode bench beam --out bench_beam.json
  JAX_PLATFORMS=cpu spec-decode bench beam --quick   # ~2 minutes
"""

import argparse
import functools
import json
import os
import platform
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode.bench.beam import controlled as controlled_beam
from spec_decode.bench.beam import coverage as beam_coverage
from spec_decode.core import inputs
from spec_decode.data import tasks

TASK = 'debian_ende'
# Inputs when the Debian data is not built (`make demo` builds it).
SENTENCES = (
  'The package could not be installed.',
  'Please select the language for the installation.',
  'Do you want to continue?',
  'The configuration file has been changed.',
  'An error occurred while reading the file.',
  'This program is free software.',
  'Unable to connect to the server.',
  'The system will restart now.',
)


def same_beams(a: sd.BeamSearchOutput, b: sd.BeamSearchOutput) -> np.ndarray:
  """`[B] bool`: equal tokens and lengths, scores within 1e-5."""
  return (
    (a.tokens == b.tokens).all((1, 2))
    & (a.lengths == b.lengths).all(1)
    & np.isclose(a.scores, b.scores, rtol=1e-5, atol=1e-5).all(1)
  )


def demo_inputs(vocab, data_dir: str, n: int) -> tuple[np.ndarray, str]:
  """`[n, S]` encoder tokens padded to one width, and where they are from."""
  if os.path.exists(os.path.join(data_dir, 'manifest.json')):
    exs = tasks.examples(tasks.get_task(TASK, data_dir), 'test', n)
    texts = [ex['inputs'] for ex in exs]
    source = f'{TASK} test'
  else:
    texts = [tasks.TRANSLATE_EN_DE_PREFIX + s for s in SENTENCES[:n]]
    source = 'fixed English sentences'
  rows = [vocab.encode(t)[:127] + [sd.EOS_ID] for t in texts]
  enc = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
  for i, r in enumerate(rows):
    enc[i, : len(r)] = r
  return enc, source


def _timed(calls, repeats: int) -> tuple[list[Any], np.ndarray]:
  """Runs every callable of `calls [config][example]` once (compiled
  before), then `repeats` interleaved rounds; per config the sum over
  examples of each example's median seconds, and the last outputs."""
  secs = np.zeros((len(calls), len(calls[0]), repeats))
  outs = [[None] * len(calls[0]) for _ in calls]
  for r in range(repeats):
    for i in range(len(calls[0])):
      for c, config in enumerate(calls):
        t0 = time.perf_counter()
        outs[c][i] = config[i]()
        secs[c, i, r] = time.perf_counter() - t0
  return outs, np.median(secs, axis=2).sum(1)


def _concat(outs: list[sd.BeamSearchOutput]) -> sd.BeamSearchOutput:
  return sd.BeamSearchOutput(
    *[
      None if getattr(outs[0], f) is None else
      np.concatenate([getattr(o, f) for o in outs])
      for f in ('tokens', 'scores', 'lengths', 'steps', 'calls', 'histogram',
                'depth_tries')
    ]
  )  # fmt: skip


def result_row(
  source, k, gamma, plain, spec, plain_s, spec_s
) -> dict[str, Any]:
  same = same_beams(plain, spec)
  return {
    'source': source,
    'num_beams': k,
    'gamma': gamma,
    'plain_s': float(plain_s),
    'spec_s': float(spec_s),
    'speedup': float(plain_s / spec_s),
    'steps_per_call': spec.steps_per_call,
    'exact': bool(same.all()),
    'exact_rows': f'{int(same.sum())}/{len(same)}',
    'target_calls': int(spec.calls.sum()),
    'plain_target_calls': int(plain.steps.sum()),
    'plain_ms_per_step': float(plain_s / max(plain.steps.sum(), 1) * 1e3),
    'spec_ms_per_call': float(spec_s / max(spec.calls.sum(), 1) * 1e3),
    # gamma='auto' takes plain steps too: its speculative calls.
    'speculative_calls': int(
      0 if spec.histogram is None else spec.histogram.sum()
    ),
  }


def demo_section(args, target, draft, enc, source) -> list[dict[str, Any]]:
  """Batch 1, every example: plain and speculative at each K and gamma."""
  rows = []
  tree_kw = args.tree_kw
  for k in args.num_beams:
    kw = dict(num_beams=k, alpha=args.beam_alpha,
              max_decode_len=args.max_decode_len)  # fmt: skip
    # Last: a random bigram table as the draft (nearly free, covers
    # almost nothing): the cost of a call beyond the draft's.
    bigram = sd.TableLM.random(target.vocab_size, seed=0)
    drafts = [(draft, g) for g in args.gammas] + [(bigram, args.gammas[0])]
    # gamma='auto' (plain steps where calls do not pay), trees of the
    # first gamma; its costs are measured (or read) in the compile call.
    drafts.append((draft, 'auto'))
    configs = [kw] + [
      dict(kw, draft=d, gamma=g, **tree_kw)
      | ({'max_auto_gamma': args.gammas[0]} if g == 'auto' else {})
      for d, g in drafts
    ]
    calls = [
      [functools.partial(sd.beam_search, target, enc[i : i + 1], **c)
       for i in range(len(enc))]
      for c in configs
    ]  # fmt: skip
    for c in calls:
      c[0]()  # Compile (one width for every example).
    outs, secs = _timed(calls, args.repeats)
    plain = _concat(outs[0])
    names = [f'demo pair ({source})'] * len(args.gammas)
    names.append(f'bigram draft ({source})')
    names.append(f'demo pair, auto at γ {args.gammas[0]} ({source})')
    for (_, g), name, out, s in zip(
      drafts, names, outs[1:], secs[1:], strict=True
    ):
      row = result_row(name, k, g, plain, _concat(out), secs[0], s)
      rows.append(dict(row, batch=1, examples=len(enc)))
      _progress(rows[-1])
  return rows


def controlled_section(args, target, draft, enc) -> list[dict[str, Any]]:
  """One batch; the controlled draft at each K, gamma and alpha."""
  rows = []
  m = args.max_decode_len
  for k in args.controlled_beams:
    kw = dict(num_beams=k, alpha=args.beam_alpha, max_decode_len=m)
    traj, tokens = controlled_beam.trajectory(
      target, enc, k, args.beam_alpha, m
    )
    plain = sd.beam_search(target, enc, **kw)  # Compile.
    if not (
      np.array_equal(tokens, plain.tokens)
      and np.array_equal(np.asarray(traj.steps), plain.steps)
    ):
      raise AssertionError('the recorded trajectory is not beam_search')
    shared = controlled_beam.shared_last_fraction(traj)
    for g in args.gammas:
      for a in args.alphas:
        cd = controlled_beam.ControlledBeamDraft(
          inner=draft, traj=traj, alpha=jnp.float32(a), key=jax.random.key(1)
        )
        # Trees that can hold every beam's children (W = c = K), so that
        # the coins, not the tree size, decide the steps per call (unless
        # the tree flags are given).
        tree_kw = args.tree_kw or dict(draft_beams=k, draft_children=k)
        spec_kw = dict(kw, draft=cd, gamma=g, **tree_kw)
        sd.beam_search(target, enc, **spec_kw)  # Compile (alpha is traced).
        calls = [
          [functools.partial(sd.beam_search, target, enc, **kw)],
          [functools.partial(sd.beam_search, target, enc, **spec_kw)],
        ]
        (plain_out, spec_out), secs = _timed(calls, args.repeats)
        row = result_row(
          f'controlled alpha={a:g}', k, g, plain_out[0], spec_out[0], *secs
        )
        rows.append(
          dict(
            row,
            alpha=a,
            expected_steps_per_call=controlled_beam.expected_steps_per_call(
              a, g
            ),
            shared_last=shared,
            batch=len(enc),
          )
        )
        _progress(rows[-1])
  return rows


def coverage_section(args, target, draft, enc) -> list[dict[str, Any]]:
  """Per K: how often the K new live beams all rank among their parents'
  c best non-EOS tokens, by the target and by the draft."""
  rows = []
  for k in args.num_beams:
    seqs, live, steps, _ = jax.device_get(
      controlled_beam.live_sequences(
        target, jnp.asarray(enc), k, args.beam_alpha, args.max_decode_len
      )
    )
    rows += beam_coverage.coverage_rows(target, draft, enc, (seqs, live, steps))
  print(beam_coverage.markdown(rows))
  print(
    "covered at c: steps s >= 2 of plain beam search whose live beams' "
    "newest tokens all rank among their parents' c best non-EOS tokens "
    '(the steps a tree of c children per node could cover).'
  )
  return rows


def _progress(r: dict[str, Any]) -> None:
  print(
    f'  {r["source"]}: K={r["num_beams"]} gamma={r["gamma"]} '
    f'{r["steps_per_call"]:.2f} steps/call, {r["speedup"]:.2f}x',
    flush=True,
  )


def markdown(rows: list[dict[str, Any]]) -> str:
  """The rows as one Markdown table."""

  def f(r, key, spec):
    return format(r[key], spec) if key in r else '-'

  lines = [
    '| source | batch | beams | γ | plain s | spec s | speedup | '
    'steps/call | speculative calls / calls | plain ms/step | spec ms/call '
    '| E (iid coins) | shared last | exact |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    lines.append(
      f'| {r["source"]} | {r["batch"]} | {r["num_beams"]} | {r["gamma"]} | '
      f'{r["plain_s"]:.2f} | {r["spec_s"]:.2f} | {r["speedup"]:.2f}x | '
      f'{r["steps_per_call"]:.2f} | '
      f'{r["speculative_calls"]}/{r["target_calls"]} | '
      f'{r["plain_ms_per_step"]:.2f} | '
      f'{r["spec_ms_per_call"]:.2f} | '
      f'{f(r, "expected_steps_per_call", ".2f")} '
      f'| {f(r, "shared_last", ".2f")} | {r["exact_rows"]} |'
    )
  return '\n'.join(lines)


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(',')]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench beam',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument('--target', default='checkpoints/demo/target')
  parser.add_argument('--draft', default='checkpoints/demo/draft_seqkd')
  parser.add_argument('--data_dir', default='data/debian')
  parser.add_argument(
    '--quick',
    action='store_true',
    help='6 examples, gamma 2, controlled: 4 beams, alphas 0.5,0.9; 3 '
    'repeats (about 2 minutes on a 2-core CPU); flags given explicitly '
    'still apply',
  )
  parser.add_argument('--num_examples', type=int, default=None)
  parser.add_argument('--num_beams', default='1,2,4')
  parser.add_argument(
    '--controlled_beams', default=None, help='default --num_beams'
  )
  parser.add_argument(
    '--gammas',
    type=inputs.gamma_flag('gammas', auto=False, many=True),
    default=None,
    help='default 2,4',
  )
  parser.add_argument('--alphas', default=None, help='default 0.5,0.8,0.95,1')
  parser.add_argument('--beam_alpha', type=float, default=0.6)
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=None, help='default 5')
  parser.add_argument('--controlled_batch', type=int, default=8)
  parser.add_argument('--draft_beams', type=int, default=None)
  parser.add_argument('--draft_children', type=int, default=None)
  parser.add_argument('--skip_demo', action='store_true')
  parser.add_argument('--skip_controlled', action='store_true')
  parser.add_argument(
    '--skip_coverage',
    action='store_true',
    help='skip the table of how the target and the draft rank the tokens '
    'of plain beam search (bench/beam/coverage.py)',
  )
  parser.add_argument('--out', default=None, help='JSON output path')
  args = parser.parse_args(argv)
  quick = dict(
    num_examples=6,
    gammas=(2,),
    alphas='0.5,0.9',
    repeats=3,
    controlled_beams='4',
  )
  full = dict(num_examples=20, gammas=(2, 4), alphas='0.5,0.8,0.95,1',
              repeats=5, controlled_beams=args.num_beams)  # fmt: skip
  for name, value in (quick if args.quick else full).items():
    if getattr(args, name) is None:
      setattr(args, name, value)
  args.num_beams = _ints(args.num_beams)
  args.controlled_beams = _ints(args.controlled_beams)
  args.gammas = list(args.gammas)
  args.alphas = [float(x) for x in args.alphas.split(',')]
  # Only the tree flags given: the library's defaults otherwise.
  args.tree_kw = {
    name: getattr(args, name)
    for name in ('draft_beams', 'draft_children')
    if getattr(args, name) is not None
  }

  target = sd.Model.load(args.target)
  draft = sd.Model.load(args.draft)
  n = max(args.num_examples, args.controlled_batch)
  enc, source = demo_inputs(target.vocabulary, args.data_dir, n)
  print(
    f'{source}; target {args.target}, draft {args.draft}; beam alpha '
    f'{args.beam_alpha}; max_decode_len {args.max_decode_len}; JAX backend '
    f'{jax.default_backend()}',
    flush=True,
  )
  rows = []
  if not args.skip_demo:
    rows += demo_section(args, target, draft, enc[: args.num_examples], source)
  if not args.skip_controlled:
    rows += controlled_section(
      args, target, draft, enc[: args.controlled_batch]
    )
  print(markdown(rows))
  coverage = []
  if not args.skip_coverage:
    coverage = coverage_section(args, target, draft, enc[: args.num_examples])
  print(
    'Times: compile excluded, median of the rounds (demo: summed over '
    'examples). steps/call: beam-search steps per target call (plain: 1); '
    'E: (1 - a^(g+1)) / (1 - a); shared last: steps whose parent beams '
    'share a last token; exact: rows whose beams and scores equal plain '
    "beam search's."
  )
  if args.out:
    results = {
      'beam': rows,
      'beam_coverage': coverage,
      'settings': {
        k: v for k, v in vars(args).items() if k not in ('tree_kw',)
      },
      'inputs': source,
      'backend': jax.default_backend(),
      'machine': platform.machine(),
    }
    with open(args.out, 'w', encoding='utf-8') as f:
      json.dump(results, f, indent=2)
    print(f'wrote {args.out}')
  return 0

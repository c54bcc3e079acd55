"""Measures hierarchical drafting on the demo pair (Debian EnDe, greedy).

Runs, on the first `--num_examples` test examples one at a time (batch 1, as
the paper and `make demo`): plain decoding with the demo target; the target
with the demo draft; with a bigram n-gram table (fit on the train targets);
and with `Hierarchical(demo draft, bigram, gamma=k)` for each inner gamma k.
Every speculative output is checked equal to the plain one. Prints one
table: outer alpha, inner alpha (the bigram drafting for the demo draft),
draft-model calls per outer iteration, tokens per target call, wall time and
speedups against plain and against the plain demo draft. Times: each
configuration compiles first (inputs are padded to one width), then
`--repeats` interleaved rounds decode every example under every
configuration; the time is the sum over examples of the fastest round.

  JAX_PLATFORMS=cpu spec-decode bench hierarchical \\
      --num_examples 30 --gamma 4 --inner_gammas 1,2,3 --repeats 3
"""

import argparse
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import spec_decode as sd
from spec_decode import checkpoints
from spec_decode.bench.drafts import interleaved
from spec_decode.core import drafter as drafter_lib
from spec_decode.core import inputs
from spec_decode.core import model_drafter
from spec_decode.core import sampling
from spec_decode.data import tasks
from spec_decode.drafters import hierarchical
from spec_decode.policy import timing

TASK = 'debian_ende'


def _encode(vocab, texts, max_input_len):
  rows = [vocab.encode(t)[: max_input_len - 1] + [sd.EOS_ID] for t in texts]
  width = max(len(r) for r in rows)
  enc = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    enc[i, : len(r)] = r
  return enc


def _bigram(vocab, vocab_size, data_dir, max_target_len):
  exs = tasks.examples(tasks.get_task(TASK, data_dir), 'train')
  seqs = [
    vocab.encode(ex['targets'])[: max_target_len - 1] + [sd.EOS_ID]
    for ex in exs
  ]
  return sd.drafters.NGram.fit(
    seqs, n=2, vocab_size=vocab_size, vocabulary=vocab
  ), len(seqs)


def _timed_runs(target, enc, configs, max_decode_len, repeats):
  """Outputs per `(draft, gamma)` config (draft None: plain decoding) and
  the summed per-example fastest wall time (`interleaved.fastest_runs`)."""
  kws = []
  for draft, gamma in configs:
    kw = dict(max_decode_len=max_decode_len)
    if draft is not None:
      kw.update(draft=draft, gamma=gamma)
    kws.append(kw)
  return interleaved.fastest_runs(target, enc, kws, repeats)


@functools.partial(jax.jit, static_argnames=('settings', 'calls'))
def _repeated_propose(drafter, state, context, settings, calls):
  def body(_, carry):
    st, acc = carry
    proposal, st = drafter.propose(st, context, settings)
    return st, acc + proposal.tokens[0, 0]

  return lax.fori_loop(0, calls, body, (state, jnp.int32(0)))[1]


def _draft_cost(target, drafter, enc, plain, lengths, gamma, repeats):
  """c: propose time per proposed token over a target step (batch 1).

  Timed on real contexts: the first examples whose plain output is longer
  than 24 tokens, at n = 16 output tokens (median over them), inside a
  compiled loop like `timing.measure`.
  """
  settings = sd.DecodeSettings(max_decode_len=plain.shape[1], gamma=gamma)
  drafter = model_drafter.as_drafter(drafter)
  propose = jax.jit(lambda st, ctx: drafter.propose(st, ctx, settings))
  n, calls, times = 16, 16, []
  for i in np.flatnonzero(lengths > 24)[:5]:
    inputs = np.zeros((1, plain.shape[1] + gamma + 2), np.int32)
    inputs[0, 1 : n + 1] = plain[i, :n]
    length = jnp.full((1,), n, jnp.int32)
    keys = sampling.position_keys(
      jax.random.key(0)[None], length[:, None] + 1 + jnp.arange(gamma), 0
    )
    context = drafter_lib.DraftContext(
      inputs=jnp.asarray(inputs),
      length=length,
      encoder_tokens=jnp.asarray(enc[i : i + 1]),
      keys=keys,
    )
    state = drafter.init_draft(context.encoder_tokens, inputs.shape[1])
    # Bring the state to n as a decode would: a proposal at 0, 1, ..., n-1.
    for j in range(n):
      _, state = propose(state, context.replace(length=jnp.full((1,), j)))
    times.append(
      timing.median_time(
        lambda st=state, ctx=context: _repeated_propose(
          drafter, st, ctx, settings, calls
        ),
        repeats,
      )
      / calls
    )
  step = timing.step_times(target, (1,), repeats)[1]
  return float(np.median(times)) / gamma / step


def _row(name, outs, seconds, plain_tokens, inner=None):
  tokens = np.concatenate([o.tokens for o in outs])
  lengths = np.concatenate([o.lengths for o in outs])
  row = {'drafter': name, 'seconds': seconds, 'tokens': int(lengths.sum())}
  if plain_tokens is not None:
    row['exact'] = bool(np.array_equal(tokens, plain_tokens))
  stats = [o.stats for o in outs if o.stats is not None]
  if stats:
    tried = sum(s.row_position_tries.sum() for s in stats)
    row['alpha'] = float(sum(s.row_beta_sum.sum() for s in stats) / tried)
    calls = sum(int(s.row_iterations.sum()) for s in stats)
    row['target_calls'] = calls
    row['tokens_per_call'] = row['tokens'] / calls
  if inner is not None:
    summary = hierarchical.summarize(inner)
    row['inner_alpha'] = summary['alpha']
    row['draft_calls_per_iteration'] = summary['calls_per_proposal']
    row['inner_tokens_per_call'] = summary['tokens_per_iteration']
  return row, tokens


def _fmt(x, spec):
  return '-' if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench hierarchical',
    description=__doc__.split('\n')[0],
  )
  parser.add_argument('--target', default='checkpoints/demo/target')
  parser.add_argument('--draft', default='checkpoints/demo/draft')
  parser.add_argument('--data_dir', default='data/debian')
  parser.add_argument('--num_examples', type=int, default=30)
  parser.add_argument('--gamma', type=inputs.gamma_flag(auto=False), default=4)
  parser.add_argument(
    '--inner_gammas',
    type=inputs.gamma_flag('inner_gammas', auto=False, many=True),
    default='1,2,3',
  )
  parser.add_argument('--max_decode_len', type=int, default=128)
  parser.add_argument('--max_input_len', type=int, default=512)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--out', default=None, help='JSON file for the rows')
  args = parser.parse_args(argv)

  target = sd.Model.load(args.target)
  draft = sd.Model.load(args.draft)
  vocab = target.vocabulary or checkpoints.read_vocabulary(args.target)
  exs = list(
    tasks.examples(
      tasks.get_task(TASK, args.data_dir), 'test', limit=args.num_examples
    )
  )
  enc = _encode(vocab, [ex['inputs'] for ex in exs], args.max_input_len)
  bigram, num_train = _bigram(
    vocab, target.vocab_size, args.data_dir, args.max_decode_len
  )
  g, m = args.gamma, args.max_decode_len

  inner_gammas = list(args.inner_gammas)
  configs = [(None, g), (draft, g), (bigram, g)]
  configs += [
    (hierarchical.Hierarchical(draft, bigram, gamma=k), g) for k in inner_gammas
  ]
  outs, secs = _timed_runs(target, enc, configs, m, args.repeats)
  row, plain = _row('plain (target only)', outs[0], secs[0], None)
  rows = [row]
  rows.append(_row('demo draft', outs[1], secs[1], plain)[0])
  rows.append(_row('bigram', outs[2], secs[2], plain)[0])
  plain_lengths = np.concatenate([o.lengths for o in outs[0]])
  for j, k in enumerate(inner_gammas):
    parts = []
    counted = hierarchical.Hierarchical(
      draft, bigram, gamma=k, stats_callback=parts.append
    )
    for i in range(len(enc)):  # Greedy: the same decodes, with inner counts.
      sd.generate(
        target, enc[i : i + 1], draft=counted, gamma=g, max_decode_len=m
      )
    inner = jax.tree.map(lambda *x: np.sum(np.stack(x), 0), *parts)
    name = f'hierarchical (demo draft <- bigram, k={k})'
    rows.append(_row(name, outs[3 + j], secs[3 + j], plain, inner)[0])
  for r, (d, _) in zip(rows[1:], configs[1:], strict=True):
    r['c'] = _draft_cost(
      target, d, enc, plain, plain_lengths, g, max(args.repeats, 5)
    )

  plain_s = rows[0]['seconds']
  draft_s = rows[1]['seconds']
  print(
    f'{TASK} test, first {len(enc)} examples, greedy, batch 1, gamma {g}, '
    f'max_decode_len {m}; bigram fit on {num_train} train targets; '
    f'JAX backend {jax.default_backend()}'
  )
  header = (
    f'{"drafter":44s} {"exact":>5s} {"alpha":>6s} {"inner a":>7s} '
    f'{"dm/it":>5s} {"c":>5s} {"tok/call":>8s} {"time s":>7s} {"vs plain":>8s} '
    f'{"vs draft":>8s}'
  )
  print(header)
  print('-' * len(header))
  for r in rows:
    print(
      f'{r["drafter"]:44s} {str(r.get("exact", "-")):>5s} '
      f'{_fmt(r.get("alpha"), ".3f"):>6s} '
      f'{_fmt(r.get("inner_alpha"), ".3f"):>7s} '
      f'{_fmt(r.get("draft_calls_per_iteration"), ".2f"):>5s} '
      f'{_fmt(r.get("c"), ".3f"):>5s} '
      f'{_fmt(r.get("tokens_per_call"), ".2f"):>8s} '
      f'{r["seconds"]:7.2f} {plain_s / r["seconds"]:7.2f}x '
      f'{draft_s / r["seconds"]:7.2f}x'
    )
  print(
    'alpha: outer acceptance (mean beta); inner a: the bigram drafting for '
    'the demo draft; dm/it: demo-draft calls per target call; c: draft '
    'time per proposed token / target step (real contexts, n = 16); '
    'tok/call: output tokens per target call.'
  )
  if args.out:
    with open(args.out, 'w', encoding='utf-8') as f:
      json.dump(rows, f, indent=2)
  return 0

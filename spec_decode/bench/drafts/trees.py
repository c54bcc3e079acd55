"""Token trees against chains: tokens per target call and wall time.

Two sections, printed as tables and written as JSON (`--out`):

1. The demo pair (Debian EnDe test examples, one at a time: batch 1, as
   `make demo`), greedy and at t = 1: plain decoding, chains of gamma in
   `--gammas`, and for every node budget in `--budgets` the tree with the
   most expected tokens for that budget (`tree_auto.best_trees`) under the
   per-depth, per-rank acceptance measured by a calibration decode of
   other test examples (the wide `tree_auto.CALIBRATION` tree), plus the
   budget `tree_auto.choose` picks from that acceptance and the measured
   v(n) ('auto'), and for each of those budgets the dynamic tree with its
   nodes per depth (`DynamicTree.like`, EAGLE-2 style: parents chosen per
   row by the draft's confidence; 'dynamic budget=auto': the 'auto' tree's
   nodes per depth, as tree='dynamic' takes them). Each tree is set
   against the chain with the same number of verified positions (gamma =
   budget) and against the fastest chain.
   Times: every configuration compiles first (inputs padded to one width),
   then `--repeats` interleaved rounds decode every example under every
   configuration; an example counts with its fastest round.
2. Controlled acceptance (greedy, batch 8): the demo draft runs for its
   cost, but at every node of the target's own path the target's next
   token is the rank-r child with probability alpha (1 - alpha)^r (as if
   each child were an independent guess right with probability alpha), so
   a chain accepts with probability alpha; tokens per call for chains and
   trees at the same budgets.

  JAX_PLATFORMS=cpu spec-decode bench trees --num_examples 12 --repeats 2
"""

import argparse
import json

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode.bench.drafts import interleaved
from spec_decode.core import inputs
from spec_decode.core import model_drafter
from spec_decode.core import tree_shape as tree_lib
from spec_decode.data import tasks
from spec_decode.tree import auto as tree_auto

TASK = 'debian_ende'


@flax.struct.dataclass(kw_only=True)
class ControlledTreeDraft:
  """A model draft whose trees contain the target's path at set ranks.

  Attributes:
    inner: the draft model (its tree proposal is computed, for the cost).
    reference: `[B, K] int32` the target's greedy output (output token k at
      column k - 1), longer than any position asked about.
    alpha: scalar, each child's chance to be the right guess.
    key: PRNG key of the coins (fixed per row, position and rank).
  """

  inner: object
  reference: jax.Array
  alpha: jax.Array
  key: jax.Array
  uses_target_features = False

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  @property
  def vocabulary(self):
    return getattr(self.inner, 'vocabulary', None)

  def init_draft(self, encoder_tokens, length):
    return model_drafter.ModelDrafter(model=self.inner).init_draft(
      encoder_tokens, length
    )

  def propose(self, state, context, settings):
    raise ValueError('ControlledTreeDraft proposes trees only')

  def propose_tree(self, state, context, settings, shape):
    inner = model_drafter.ModelDrafter(model=self.inner)
    proposal, state = inner.propose_tree(state, context, settings, shape)
    batch = context.length.shape[0]
    depth = jnp.asarray(shape.depths[1:])
    if tree_lib.is_dynamic(shape):
      # Ranks per row: the siblings the inner draft's confidence chose.
      tables = tree_lib.TreeTables.from_parents(shape, proposal.parents)
      rank = tables.ranks[:, 1:]
    else:
      rank = jnp.asarray(shape.ranks[1:])[None]
    cols = jnp.clip(
      context.length[:, None] + depth[None] - 1, 0, self.reference.shape[1] - 1
    )  # Output token n + d sits in column n + d - 1.
    ref = jnp.take_along_axis(self.reference, cols, axis=1)
    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], cols.shape)

    def coin(r, c, k):
      key = jax.random.fold_in(jax.random.fold_in(self.key, r), c)
      return jax.random.uniform(jax.random.fold_in(key, k))

    # The right rank at (row, position): the first of the W coins < alpha.
    width = shape.width
    coins = jnp.stack(
      [jax.vmap(jax.vmap(coin))(rows, cols, jnp.full_like(cols, k))
       for k in range(width)], -1,
    )  # fmt: skip
    hit = coins < self.alpha
    right = jnp.where(jnp.any(hit, -1), jnp.argmax(hit, -1), width)
    # Wrong guesses: distinct per rank, never the reference, never EOS.
    v = self.vocab_size - 2
    wrong = jnp.where(ref >= 2, 2 + (ref - 2 + 1 + rank) % v, 2 + rank)
    tokens = jnp.where(rank == right, ref, wrong).astype(jnp.int32)
    return proposal.replace(tokens=tokens, q=None), state


def _encode(vocab, texts, width=None):
  rows = [vocab.encode(t)[:255] + [sd.EOS_ID] for t in texts]
  width = width or max(len(r) for r in rows)
  enc = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    enc[i, : min(len(r), width)] = r[:width]
  return enc


def _summary(name, outs, seconds, plain):
  tokens = np.concatenate([o.tokens for o in outs])
  lengths = np.concatenate([o.lengths for o in outs])
  calls = sum(
    int(o.stats.row_iterations.sum()) if o.stats else int(o.lengths.sum())
    for o in outs
  )
  row = {
    'config': name,
    'tokens': int(lengths.sum()),
    'target_calls': calls,
    'tokens_per_call': float(lengths.sum() / max(calls, 1)),
    'seconds': float(seconds),
  }
  if plain is not None:
    row['same_as_plain'] = bool(np.array_equal(tokens, plain))
  return row, tokens


def _designed(target, draft, enc, temperature, budgets, cost):
  """Calibration on `enc` (one batch) -> trees per budget and 'auto'."""
  cal = sd.generate(
    target,
    enc,
    draft=draft,
    tree=tree_auto.CALIBRATION,
    temperature=temperature,
    max_decode_len=64,
  )
  acc = cal.tree['rank_acceptance']
  trees = tree_auto.best_trees(tree_auto.extend(acc), max(budgets))
  shapes = {n: [list(p) for p in trees[n - 1][0]] for n in budgets}
  expected = {n: 1.0 + trees[n - 1][1] for n in budgets}
  auto = tree_auto.choose(acc, cost)
  return acc, shapes, expected, auto


def demo_section(args, target, draft, vocab) -> list[dict]:
  exs = list(
    tasks.examples(
      tasks.get_task(TASK, args.data_dir), 'test', 2 * args.num_examples
    )
  )
  texts = [ex['inputs'] for ex in exs]
  enc_all = _encode(vocab, texts)
  enc, cal_enc = enc_all[: args.num_examples], enc_all[args.num_examples :]
  rows = []
  for t in (0.0, 1.0):
    settings = sd.DecodeSettings(
      max_decode_len=8, sampler=sd.Sampler(temperature=t)
    )
    cost = tree_auto.fit_costs(
      tree_auto.iteration_seconds(target, draft, jnp.asarray(enc[:1]), settings)
    )
    acc, shapes, expected, auto = _designed(
      target, draft, cal_enc, t, args.budgets, cost
    )
    base = dict(max_decode_len=args.max_decode_len, temperature=t, seed=0)
    configs = [('plain', dict(base))]
    configs += [
      (f'chain gamma={g}', dict(base, draft=draft, gamma=g))
      for g in args.gammas
    ]
    configs += [
      (f'tree budget={n}', dict(base, draft=draft, tree=shapes[n]))
      for n in args.budgets
    ]
    configs.append(
      (f'tree auto ({auto["num_nodes"]} nodes)',
       dict(base, draft=draft, tree=[list(p) for p in auto['paths']]))
    )  # fmt: skip
    configs += [
      (f'tree dynamic budget={n}',
       dict(base, draft=draft, tree=tree_lib.DynamicTree.like(
         tree_lib.from_paths(auto['paths'] if n == 'auto' else shapes[n]))))
      for n in args.budgets + ['auto']
    ]  # fmt: skip
    outs, secs = interleaved.fastest_runs(
      target, enc, [kw for _, kw in configs], args.repeats
    )
    plain_row, plain = _summary('plain', outs[0], secs[0], None)
    section = [plain_row]
    for (name, kw), o, s in zip(configs[1:], outs[1:], secs[1:], strict=True):
      row, _ = _summary(name, o, s, plain if t == 0.0 else None)
      dynamic = tree_lib.is_dynamic(kw.get('tree'))
      if 'gamma' in kw:
        row['verified'] = kw['gamma'] + 1
      else:
        tree = kw['tree']
        row['verified'] = (tree.num_nodes if dynamic else len(tree)) + 1
      if dynamic:
        row['levels'] = list(kw['tree'].levels)
      elif 'tree' in kw:
        row['paths'] = kw['tree']
        n = len(kw['tree'])
        row['expected_tokens_per_call'] = expected.get(n) or auto.get(
          'expected_tokens_per_call'
        )
      row['speedup'] = plain_row['seconds'] / row['seconds']
      section.append(row)
    chains = [r for r in section if r['config'].startswith('chain')]
    fastest = min(chains, key=lambda r: r['seconds'])
    for r in section:
      if not r['config'].startswith('tree'):
        continue
      same = [c for c in chains if c['verified'] == r['verified']]
      if same:
        r['tokens_per_call_vs_chain'] = (
          r['tokens_per_call'] / same[0]['tokens_per_call']
        )
      r['time_vs_fastest_chain'] = fastest['seconds'] / r['seconds']
      r['fastest_chain'] = fastest['config']
    for r in section:
      r['setting'] = f'demo pair, t={t:g}'
    rows += section
    rows.append({
      'setting': f'demo pair, t={t:g}',
      'config': 'calibration rank acceptance and cost fit',
      'rank_acceptance': np.asarray(acc).tolist(),
      'cost_fit_seconds': list(cost),
      'auto_expected_tokens_per_call': auto['expected_tokens_per_call'],
      'auto_predicted_seconds_per_call': auto['seconds_per_call'],
    })  # fmt: skip
  return rows


def controlled_section(args, target, draft, vocab) -> list[dict]:
  exs = list(tasks.examples(tasks.get_task(TASK, args.data_dir), 'test', 8))
  enc = _encode(vocab, [ex['inputs'] for ex in exs])
  m = args.max_decode_len
  reference = sd.generate(target, enc, max_decode_len=m + 64).tokens
  rows = []
  for alpha in args.alphas:
    cd = ControlledTreeDraft(
      inner=draft,
      reference=jnp.asarray(reference),
      alpha=jnp.float32(alpha),
      key=jax.random.key(1),
    )
    acc = np.full((tree_auto.MAX_DEPTH, 4), alpha)
    for n in args.budgets:
      paths = tree_auto.best_trees(acc, n)[n - 1][0]
      for name, tree in (
        (f'chain gamma={n}', tree_lib.chain(n)),
        (f'tree budget={n}', tree_lib.from_paths(paths)),
      ):
        out = sd.generate(target, enc, draft=cd, tree=tree, max_decode_len=m)
        rows.append({
          'setting': f'controlled alpha={alpha:g}',
          'config': name,
          'verified': n + 1,
          'tokens_per_call': out.stats.tokens_per_call,
          'same_as_plain': bool(np.array_equal(out.tokens, reference[:, :m])),
          'paths': [list(p) for p in tree.paths],
        })  # fmt: skip
  return rows


def _print(rows):
  print(
    '| setting | config | verified | tokens/call | vs chain (same n) | '
    'time s | speedup | vs fastest chain |'
  )
  print('|---|---|---|---|---|---|---|---|')
  for r in rows:
    if 'tokens_per_call' not in r:
      continue

    def f(key, spec, r=r):
      return format(r[key], spec) if key in r else '-'

    print(
      f'| {r["setting"]} | {r["config"]} | {f("verified", "d")} | '
      f'{r["tokens_per_call"]:.2f} | {f("tokens_per_call_vs_chain", ".2f")} | '
      f'{f("seconds", ".2f")} | {f("speedup", ".2f")} | '
      f'{f("time_vs_fastest_chain", ".2f")} |'
    )


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench trees', description=__doc__.split('\n')[0]
  )
  parser.add_argument('--target', default='checkpoints/demo/target')
  parser.add_argument('--draft', default='checkpoints/demo/draft')
  parser.add_argument('--data_dir', default='data/debian')
  parser.add_argument('--num_examples', type=int, default=12)
  parser.add_argument(
    '--gammas',
    type=inputs.gamma_flag('gammas', auto=False, many=True),
    default='1,2,3,4,6,8',
  )
  parser.add_argument('--budgets', default='4,8,16')
  parser.add_argument('--alphas', default='0.5,0.8')
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--skip_demo', action='store_true')
  parser.add_argument('--out', default=None, help='JSON file for the rows')
  args = parser.parse_args(argv)
  args.gammas = list(args.gammas)
  args.budgets = [int(x) for x in args.budgets.split(',')]
  args.alphas = [float(x) for x in args.alphas.split(',')]

  target = sd.Model.load(args.target)
  draft = sd.Model.load(args.draft)
  vocab = target.vocabulary
  print(
    f'{TASK} test; batch 1 (demo pair), batch 8 (controlled); '
    f'max_decode_len {args.max_decode_len}; JAX backend '
    f'{jax.default_backend()}',
    flush=True,
  )
  rows = []
  if not args.skip_demo:
    rows += demo_section(args, target, draft, vocab)
  rows += controlled_section(args, target, draft, vocab)
  _print(rows)
  print(
    'verified: positions per target call (nodes + 1); vs chain: tokens per '
    'call over the chain with as many positions; speedup: plain time over '
    "this config's; vs fastest chain: the fastest chain's time over this "
    "config's."
  )
  if args.out:
    with open(args.out, 'w', encoding='utf-8') as f:
      json.dump(rows, f, indent=2, default=float)
  return 0

"""The XXL target with the small draft: batching, trees, beam search.

Batching: plain vs gamma='auto' vs every fixed gamma of the plan at each
batch size, under controlled acceptance (`bench.batch_policy`, which times
them side by side in rounds). Trees: the cost of scoring a tree of n nodes
in one call, v_tree(n) (flat trees: the root and n children), against the
chain's v(n + 1), both by one harness (`policy.timing`: the same compiled
loop, calls and rollback), and trees against chains at the same verified
positions under controlled acceptance
(`bench.drafts.trees.ControlledTreeDraft`): the chain, the best static tree
of the budget and the dynamic tree with its nodes per depth (EAGLE-2 style;
what its per-row tables cost). Beam search: speculative
against plain at `plan.beams` beams under the beam bench's controlled draft
(`bench.beam.controlled`).

Each function returns the section's items (`runner.Item`).
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode.bench import batch_policy
from spec_decode.bench.accel import cost
from spec_decode.bench.accel import sizes
from spec_decode.bench.accel.plan import Plan
from spec_decode.bench.accel.runner import Item
from spec_decode.bench.accel.runner import Skip
from spec_decode.bench.beam import controlled as controlled_beam
from spec_decode.bench.beam import search as beam_bench
from spec_decode.bench.drafts import trees as trees_bench
from spec_decode.core import tree_shape
from spec_decode.policy import timing
from spec_decode.tree import auto as tree_auto


def batching(rec, plan: Plan, p, get_target, draft) -> list[Item]:
  """`sections['batching']`: one row per batch size."""
  target_cfg = plan.targets['xxl']
  m = plan.max_decode_len

  def predict(b):
    # Plain, the reference, the policy's cost measurement (its target calls
    # at every gamma up to 8) and each decode, compiled at this batch.
    units = 2 * cost.decode_units(target_cfg)
    units += cost.decode_units(
      target_cfg, plan.draft, batch_policy.MAX_AUTO_GAMMA, calls=9
    )
    units += sum(
      cost.decode_units(target_cfg, plan.draft, g) for g in plan.fixed_gammas
    )
    steps = (3 + len(plan.fixed_gammas)) * (1 + plan.repeats) * m
    return p.predict(units, steps * max(b / 8, 1), target_cfg)

  def run(b, box):
    rows = batch_policy.run(
      get_target(),
      draft()[0],
      m,
      plan.repeats,
      [b],
      [plan.batch_alpha],
      gammas=plan.fixed_gammas,
      check_identity=False,
    )
    rec.append('batching', rows[0])

  return [
    Item('batching', f'batch {b}', lambda b=b: predict(b),
         lambda box, b=b: run(b, box))
    for b in plan.batches
  ]  # fmt: skip


def trees(rec, plan: Plan, p, get_target, draft) -> list[Item]:
  """`sections['trees']`: v_tree(n) and v_chain(n + 1), then trees vs
  chains under controlled acceptance."""
  target_cfg = plan.targets['xxl']
  out: dict[str, Any] = {'v_tree': {}, 'v_chain': {}, 'controlled': []}
  length = 16 + max(plan.tree_nodes) + 3
  state: dict[str, Any] = {}
  calls = 16

  def one():
    if 'one' not in state:
      state['one'] = timing.step_times(
        get_target(), (1,), plan.repeats, length=length, calls=calls
      )[1]
    return state['one']

  def predict_v(n):
    # The tree's and the chain's programs (and, first, the primed state's
    # and the one-token call's).
    programs = 2 if 'one' in state else 4
    steps = 2 * (1 + plan.repeats) * calls * (1 + 0.05 * n)
    return p.predict(programs * cost.score_units(target_cfg), steps, target_cfg)

  def run_v(n, box):
    target = get_target()
    shape = tree_shape.from_branching((n,))
    t_tree = timing.tree_step_time(
      target, shape.target_attention(), n + 1, plan.repeats,
      length=length, calls=calls,
    )  # fmt: skip
    t_chain = timing.step_times(
      target, (n + 1,), plan.repeats, length=length, calls=calls
    )[n + 1]
    out['v_tree'][str(n)] = t_tree / one()
    out['v_chain'][str(n + 1)] = t_chain / one()
    rec.put('trees', None, out)

  def controlled():
    if 'draft' not in state:
      target = get_target()
      enc = sizes.inputs(8, target.vocab_size)
      m = plan.max_decode_len
      reference = sd.generate(target, enc, max_decode_len=m + 64).tokens
      state['enc'], state['reference'] = enc, reference
      state['draft'] = trees_bench.ControlledTreeDraft(
        inner=draft()[0],
        reference=jnp.asarray(reference),
        alpha=jnp.float32(plan.tree_alpha),
        key=jax.random.key(1),
      )
    return state['enc'], state['reference'], state['draft']

  def predict_tree(n):
    units = cost.decode_units(target_cfg, plan.draft, n)
    if 'draft' not in state:
      units += cost.decode_units(target_cfg)
    steps = (1 + plan.repeats) * plan.max_decode_len * 2
    return p.predict(units, steps, target_cfg)

  def run_tree(name, tree, n, box):
    target = get_target()
    enc, reference, tdraft = controlled()
    m = plan.max_decode_len
    seconds, res, _ = sizes.timed(
      lambda: sd.generate(target, enc, draft=tdraft, tree=tree,
                          max_decode_len=m),
      plan.repeats,
    )  # fmt: skip
    out['controlled'].append({
      'alpha': plan.tree_alpha,
      'batch': len(enc),
      'config': name,
      'verified': n + 1,
      'seconds': seconds,
      'tokens_per_call': res.stats.tokens_per_call,
      'tokens_per_second': float(res.lengths.sum() / seconds),
      'same_as_plain': float(
        np.mean(np.all(res.tokens == reference[:, :m], axis=1))
      ),
    })  # fmt: skip
    rec.put('trees', None, out)

  items = [
    Item('trees', f'v({n})', lambda n=n: predict_v(n),
         lambda box, n=n: run_v(n, box))
    for n in plan.tree_nodes
  ]  # fmt: skip
  acc = np.full((tree_auto.MAX_DEPTH, 4), plan.tree_alpha)
  for n in plan.tree_budgets:
    paths = tree_auto.best_trees(acc, n)[n - 1][0]
    static = tree_shape.from_paths(paths)
    for name, tree in (
      (f'chain gamma={n}', tree_shape.chain(n)),
      (f'tree budget={n}', static),
      # EAGLE-2's shape: the static tree's nodes per depth, parents chosen
      # per row by the draft's confidence. Under controlled acceptance that
      # confidence says nothing about the coins, so this row measures what
      # a dynamic tree costs on the device (per-row masks and tables), not
      # what it gains.
      (f'tree dynamic budget={n}', tree_shape.DynamicTree.like(static)),
    ):
      items.append(Item(
        'trees', name, lambda n=n: predict_tree(n),
        lambda box, name=name, tree=tree, n=n: run_tree(name, tree, n, box),
      ))  # fmt: skip
  return items


def beam(rec, plan: Plan, p, get_target, draft) -> list[Item]:
  """`sections['beam']`: plain beam search, then speculative per alpha."""
  k, g, m = plan.beams, plan.beam_gamma, plan.max_decode_len
  target_cfg = plan.targets['xxl']
  kw = dict(num_beams=k, alpha=0.6, max_decode_len=m)
  state: dict[str, Any] = {}

  def run_plain(box):
    target = get_target()
    enc = sizes.inputs(1, target.vocab_size)
    traj, _ = controlled_beam.trajectory(target, enc, k, 0.6, m)
    seconds, out, _ = sizes.timed(
      lambda: sd.beam_search(target, enc, **kw), plan.repeats
    )
    state.update(enc=enc, traj=traj, plain=out, plain_s=seconds)
    rec.put('beam_plain', None, {'num_beams': k, 'seconds': seconds})

  def run_spec(a, box):
    if 'plain' not in state:
      raise Skip('needs plain beam search, not measured')
    target = get_target()
    bdraft = controlled_beam.ControlledBeamDraft(
      inner=draft()[0], traj=state['traj'], alpha=jnp.float32(a),
      key=jax.random.key(1),
    )  # fmt: skip
    spec_kw = dict(kw, draft=bdraft, gamma=g, draft_beams=k, draft_children=k)
    spec_s, spec, _ = sizes.timed(
      lambda: sd.beam_search(target, state['enc'], **spec_kw), plan.repeats
    )
    row = beam_bench.result_row(
      f'controlled alpha={a:g}', k, g, state['plain'], spec,
      state['plain_s'], spec_s,
    )  # fmt: skip
    row['expected_steps_per_call'] = controlled_beam.expected_steps_per_call(
      a, g
    )
    rec.append('beam', row)

  def predict(spec: bool):
    units = 2 * cost.decode_units(target_cfg)
    if spec:
      units = cost.decode_units(target_cfg, plan.draft, g * k)
    return p.predict(units, (1 + plan.repeats) * m * 2, target_cfg)

  items = [Item('beam', 'plain', lambda: predict(False), run_plain)]
  for a in plan.beam_alphas:
    items.append(Item('beam', f'alpha {a}', lambda: predict(True),
                      lambda box, a=a: run_spec(a, box)))  # fmt: skip
  return items

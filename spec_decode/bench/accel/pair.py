"""The XXL target with the small draft: batching, trees, beam search.

Batching: plain vs gamma='auto' vs every fixed gamma of the plan at each
batch size, under controlled acceptance (`bench.batch_policy`, which times
them side by side in rounds). Trees: the cost of scoring a tree of n nodes
in one call, v_tree(n) (flat trees: the root and n children), against the
chain's v(n + 1), and trees against chains at the same verified positions
under controlled acceptance (`bench.drafts.trees.ControlledTreeDraft`).
Beam search: speculative against plain at `plan.beams` beams under the
beam bench's controlled draft (`bench.beam.controlled`).
"""

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import spec_decode as sd
from spec_decode.bench import batch_policy
from spec_decode.bench.accel import sizes
from spec_decode.bench.accel.plan import Deadline
from spec_decode.bench.accel.plan import Plan
from spec_decode.bench.beam import controlled as controlled_beam
from spec_decode.bench.beam import search as beam_bench
from spec_decode.bench.drafts import trees as trees_bench
from spec_decode.core import tree_shape
from spec_decode.policy import timing
from spec_decode.tree import auto as tree_auto

_MARGIN = 1.5


def batching(rec, target, draft_net, plan: Plan, box: Deadline) -> None:
  """`sections['batching']`: one row per batch size inside `box`."""
  last = 0.0
  for b in plan.batches:
    if last and not box.fits(_MARGIN * last * max(b / 8, 1)):
      rec.skip('batching', f'batch {b}', 'time box')
      continue
    t0 = time.perf_counter()
    rows = batch_policy.run(
      target,
      draft_net,
      plan.max_decode_len,
      plan.repeats,
      [b],
      [plan.batch_alpha],
      gammas=plan.fixed_gammas,
      check_identity=False,
    )
    last = time.perf_counter() - t0
    rec.append('batching', rows[0])
    rec.event('batching', f'batch {b}', last)


@functools.partial(jax.jit, static_argnames=('attention', 'calls'))
def _repeated_tree_score(model, state, tokens, attention, calls: int):
  """`calls` tree-scoring calls inside one compiled loop."""

  def body(_, carry):
    st, acc = carry
    logits, st = model.score_tree(st, tokens, attention)
    return st, acc + logits[0, 0, 0]

  return lax.fori_loop(0, calls, body, (state, jnp.float32(0)))[1]


def tree_score_seconds(target, nodes: int, repeats: int, calls: int = 8):
  """Seconds of one target call scoring a flat tree: root + `nodes`."""
  shape = tree_shape.from_branching((nodes,))
  prefix = 16
  state = target.init_state(jnp.full((1, 16), 5, jnp.int32), prefix + nodes + 4)
  state = target.score(state, jnp.zeros((1, prefix), jnp.int32))[1]
  tokens = jnp.full((1, nodes + 1), 5, jnp.int32)
  attention = shape.target_attention()
  return (
    timing.median_time(
      lambda: _repeated_tree_score(target, state, tokens, attention, calls),
      repeats,
    )
    / calls
  )


def trees(rec, target, draft_net, plan: Plan, box: Deadline) -> None:
  """`sections['trees']`: v_tree(n), then trees vs chains."""
  out: dict[str, Any] = {'v_tree': {}, 'v_chain': {}, 'controlled': []}
  one = timing.step_times(target, (1,), plan.repeats)[1]
  last = 0.0
  for n in plan.tree_nodes:
    if last and not box.fits(_MARGIN * last):
      rec.skip('trees', f'v_tree({n})', 'time box')
      continue
    t0 = time.perf_counter()
    out['v_tree'][str(n)] = tree_score_seconds(target, n, plan.repeats) / one
    out['v_chain'][str(n + 1)] = (
      timing.step_times(target, (n + 1,), plan.repeats)[n + 1] / one
    )
    last = time.perf_counter() - t0
    rec.event('trees', f'v({n})', last)
    rec.put('trees', None, out)
  enc = sizes.inputs(8, target.vocab_size)
  m = plan.max_decode_len
  reference = sd.generate(target, enc, max_decode_len=m + 64).tokens
  draft = trees_bench.ControlledTreeDraft(
    inner=draft_net,
    reference=jnp.asarray(reference),
    alpha=jnp.float32(plan.tree_alpha),
    key=jax.random.key(1),
  )
  acc = np.full((tree_auto.MAX_DEPTH, 4), plan.tree_alpha)
  for n in plan.tree_budgets:
    paths = tree_auto.best_trees(acc, n)[n - 1][0]
    for name, tree in (
      (f'chain gamma={n}', tree_shape.chain(n)),
      (f'tree budget={n}', tree_shape.from_paths(paths)),
    ):
      if last and not box.fits(_MARGIN * last):
        rec.skip('trees', name, 'time box')
        continue
      t0 = time.perf_counter()
      seconds, res, _ = sizes.timed(
        lambda tree=tree: sd.generate(
          target, enc, draft=draft, tree=tree, max_decode_len=m
        ),
        plan.repeats,
      )
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
      last = time.perf_counter() - t0
      rec.event('trees', name, last)
      rec.put('trees', None, out)


def beam(rec, target, draft_net, plan: Plan, box: Deadline) -> None:
  """`sections['beam']`: plain vs speculative beam search per alpha."""
  k, g, m = plan.beams, plan.beam_gamma, plan.max_decode_len
  enc = sizes.inputs(1, target.vocab_size)
  kw = dict(num_beams=k, alpha=0.6, max_decode_len=m)
  t0 = time.perf_counter()
  traj, _ = controlled_beam.trajectory(target, enc, k, 0.6, m)
  plain_s, plain, _ = sizes.timed(
    lambda: sd.beam_search(target, enc, **kw), plan.repeats
  )
  last = time.perf_counter() - t0
  rec.event('beam', 'plain', last)
  for a in plan.alphas:
    if not box.fits(_MARGIN * last):
      rec.skip('beam', f'alpha {a}', 'time box')
      continue
    t0 = time.perf_counter()
    draft = controlled_beam.ControlledBeamDraft(
      inner=draft_net, traj=traj, alpha=jnp.float32(a), key=jax.random.key(1)
    )
    spec_kw = dict(kw, draft=draft, gamma=g, draft_beams=k, draft_children=k)
    spec_s, spec, _ = sizes.timed(
      lambda spec_kw=spec_kw: sd.beam_search(target, enc, **spec_kw),
      plan.repeats,
    )
    row = beam_bench.result_row(
      f'controlled alpha={a:g}', k, g, plain, spec, plain_s, spec_s
    )
    row['expected_steps_per_call'] = controlled_beam.expected_steps_per_call(
      a, g
    )
    last = time.perf_counter() - t0
    rec.append('beam', row)
    rec.event('beam', f'alpha {a}', last)

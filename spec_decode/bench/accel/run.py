"""`spec-decode bench accel`: the accelerator bench, one command in a budget.

  spec-decode bench accel --out_dir DIR [--budget SECONDS] [--tiny]
      [--only SECTION,...]

On one GPU (or TPU): random-weight T5 v1.1 targets small to XXL (bfloat16
weights and activations, float32 logits, the CPU kernel off) with the T5
v1.1 small draft. Sections, in this order (`plan.FULL_BOXES` gives each its
share of the budget; time a section leaves unused goes to the later ones):

  identity_bfloat16  greedy speculative == plain, row by row (XXL/small)
  xxl                step time, v(k), c, speedups vs Theorem 3.8
  batching           plain vs gamma='auto' vs best fixed gamma by batch
  trees              v_tree(n) against v(n + 1); trees vs chains
  beam               speculative vs plain beam search at 4 beams
  identity_float32   the identity check in float32
  small, base, large, xl   as xxl

Results go to DIR/accel.json and DIR/accel.md, rewritten after every
measurement (`record.Recorder`): a run cut off keeps what it measured and
says what it skipped. `--tiny` runs every section at toy sizes on the CPU
(the rehearsal `make test` runs); the real sizes are refused on a CPU.
"""

import argparse
import os
import platform
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

import spec_decode as sd
from spec_decode.bench.accel import identity
from spec_decode.bench.accel import pair
from spec_decode.bench.accel import plan as plan_lib
from spec_decode.bench.accel import report
from spec_decode.bench.accel import sizes
from spec_decode.bench.accel.record import Recorder

SECTIONS = (
  'identity_bfloat16',
  'xxl',
  'batching',
  'trees',
  'beam',
  'identity_float32',
  'small',
  'base',
  'large',
  'xl',
)
_PAIR = {'batching': pair.batching, 'trees': pair.trees, 'beam': pair.beam}


def as_float32(model: sd.Model, free: bool = False) -> sd.Model:
  """`model` with float32 weights and activations (same weight values).

  With `free`, each bfloat16 weight is deleted as soon as its float32 copy
  exists (XXL: 22 GB + 44 GB would not fit one GPU's memory at once);
  `model` is unusable afterwards.
  """
  leaves, treedef = jax.tree.flatten(model.params)
  out = []
  for i, leaf in enumerate(leaves):
    out.append(leaf.astype(jnp.float32))
    if free and isinstance(leaf, jax.Array):
      jax.block_until_ready(out[-1])
      leaf.delete()
      leaves[i] = None
  config = model.config.replace(dtype='float32', param_dtype='float32')
  return sd.Model(config, jax.tree.unflatten(treedef, out))


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog='spec-decode bench accel',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument('--out_dir', required=True, help='where the results go')
  p.add_argument(
    '--budget',
    type=float,
    default=None,
    help='seconds for the whole run (default 420; --tiny: 600)',
  )
  p.add_argument('--tiny', action='store_true', help='toy sizes (CPU)')
  p.add_argument(
    '--only',
    default='',
    help=f'comma-separated sections (default all: {",".join(SECTIONS)})',
  )
  return p


def _meta(args, plan) -> dict[str, Any]:
  devices = jax.devices()
  return {
    'command': 'spec-decode bench accel ' + ' '.join(sys.argv[1:]),
    'device': f'{devices[0].platform}: {devices[0].device_kind}',
    'num_devices': len(devices),
    'jax': jax.__version__,
    'python': platform.python_version(),
    'host': platform.node(),
    'tiny': bool(args.tiny),
    'budget': plan.budget,
    'max_decode_len': plan.max_decode_len,
    'started': time.strftime('%Y-%m-%d %H:%M:%S %Z'),
  }


def main(argv: list[str] | None = None) -> int:
  parser = _parser()
  args = parser.parse_args(argv)
  only = [s for s in args.only.split(',') if s]
  unknown = sorted(set(only) - set(SECTIONS))
  if unknown:
    parser.error(f'unknown sections {unknown}; known: {list(SECTIONS)}')
  if args.budget is not None and args.budget <= 0:
    parser.error('--budget must be > 0')
  if not args.tiny and jax.default_backend() == 'cpu':
    parser.error(
      'the real sizes (T5-XXL: 22 GB in bfloat16) need an accelerator; '
      'on a CPU run --tiny'
    )
  try:
    os.makedirs(args.out_dir, exist_ok=True)
  except OSError as e:
    parser.error(f'--out_dir {args.out_dir!r}: {e}')
  if args.tiny:
    plan = plan_lib.tiny(args.budget or 600.0)
  else:
    plan = plan_lib.full(args.budget or 420.0)
  sections = [
    s for s in SECTIONS if s in plan.boxes and (not only or s in only)
  ]
  rec = Recorder(args.out_dir, _meta(args, plan), render=report.markdown)
  run(rec, plan, sections)
  print(report.markdown(rec.data), flush=True)
  print(f'results: {os.path.join(args.out_dir, "accel.json")}', flush=True)
  return 1 if rec.data['errors'] else 0


def run(rec: Recorder, plan: plan_lib.Plan, sections: list[str]) -> None:
  """The sections in order, each in its share of what budget is left."""
  total = plan_lib.Deadline(plan.budget)
  models: dict[str, Any] = {}

  def box(name: str) -> plan_lib.Deadline:
    shares = [plan.boxes[s] for s in sections[sections.index(name) :]]
    return total.box(total.left() * plan.boxes[name] / sum(shares))

  def xxl():
    if 'xxl' not in models:
      t0 = time.perf_counter()
      target = sd.Model.init(plan.targets['xxl'], seed=0)
      models['xxl'] = sizes.suppress_eos(target)
      jax.block_until_ready(models['xxl'].params)
      rec.event('setup', 'xxl init', time.perf_counter() - t0)
    return models['xxl']

  t0 = time.perf_counter()
  draft = sd.Model.init(plan.draft, seed=1)
  draft_seconds = sizes.draft_step_seconds(draft, plan)
  rec.put('draft', None, {
    'config': plan.draft.to_dict(),
    'step_ms': draft_seconds * 1e3,
  })  # fmt: skip
  rec.event('setup', 'draft init and step', time.perf_counter() - t0)
  for name in sections:
    t0 = time.perf_counter()
    b = box(name)
    print(f'accel: {name} ({b.left():.0f} s)', flush=True)
    try:
      if name == 'identity_bfloat16':
        got = identity.measure(rec, name, xxl(), draft, plan, b)
        if got['share_identical'] < 1.0:
          identity.restore(rec, xxl(), draft, plan, b)
      elif name == 'identity_float32':
        target = as_float32(xxl(), free=True)
        models.pop('xxl')
        # True float32 products: JAX's default on GPUs is TF32 (bfloat16
        # passes on TPUs), which rounds inputs as bfloat16 does.
        with jax.default_matmul_precision('float32'):
          identity.measure(rec, name, target, as_float32(draft), plan, b)
        del target
      elif name in _PAIR:
        _PAIR[name](rec, xxl(), draft, plan, b)
      elif name == 'xxl':
        sizes.measure(rec, name, xxl(), draft, draft_seconds, plan, b)
      else:
        models.pop('xxl', None)  # Only one large target at a time.
        target = sizes.suppress_eos(sd.Model.init(plan.targets[name], seed=0))
        sizes.measure(rec, name, target, draft, draft_seconds, plan, b)
        del target
    except Exception as e:  # noqa: BLE001  A section's failure is recorded.
      rec.error(name, e)
      print(f'accel: {name} failed: {e}', flush=True)
    rec.event(name, 'section', time.perf_counter() - t0)
    if name in ('identity_float32', 'small', 'base', 'large', 'xl'):
      jax.clear_caches()  # Programs of a model that is gone.

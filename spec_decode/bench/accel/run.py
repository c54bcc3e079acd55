"""`spec-decode bench accel`: the accelerator bench, one command in a budget.

  spec-decode bench accel --out_dir DIR [--budget SECONDS] [--tiny]
      [--only NAME,...] [--skip NAME,...]

On one GPU (or TPU): random-weight T5 v1.1 targets small to XXL (bfloat16
weights and activations, float32 logits, the CPU kernel off) with the T5
v1.1 small draft. Items, in this order (`items`); NAME is a section or one
item, `section/item` as the JSON's timeline writes it:

  smoke              versions, the JAX APIs we use, bandwidth, toy decodes
                     (fails fast: the run stops, exit status 3)
  setup              the draft
  xxl                the core: init, the plain step v(1), v(8), v(2), v(4),
                     v(16) (each next to its memory-bandwidth bound), c,
                     the controlled speedup at alpha 0.75, gamma 7 (the
                     paper's Table 2) next to Theorem 3.8
  identity_bfloat16  greedy speculative == plain, row by row (XXL/small)
  xxl_more           further v(k), alphas 0.5 and 0.9 at the best gamma
  f32_attention      where bfloat16 rows part: float32 attention logits
  batching           plain vs gamma='auto' vs best fixed gamma by batch
  trees              v_tree(n) against v_chain(n + 1); trees vs chains
  beam               speculative vs plain beam search at 4 beams
  identity_float32   the identity check in float32 (true float32 products)
  small, base, large, xl   the core of each size
  t5gemma            a T5Gemma pair (`plan.full`: the 9B-2B target, the
                     S-S draft): its draft, its init, the core, alphas 0.5
                     and 0.9 (last: the T5 sections come first)

Every item predicts its cost (compilation included) from the sizes and
what earlier items measured, and is skipped, with the reason recorded,
where it would not fit: the core against the whole budget, the rest in
their shares of what the core left (`plan.FULL_BOXES`). Results go to
DIR/accel.json and DIR/accel.md, rewritten after every measurement
(`record.Recorder`): a run cut off keeps what it measured and says where it
stopped (`running`). `--tiny` runs every item at toy sizes on the CPU (the
rehearsal `make test` runs); the real sizes are refused on a CPU.
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
from spec_decode.bench.accel import cost
from spec_decode.bench.accel import identity
from spec_decode.bench.accel import pair
from spec_decode.bench.accel import plan as plan_lib
from spec_decode.bench.accel import report
from spec_decode.bench.accel import sizes
from spec_decode.bench.accel import smoke
from spec_decode.bench.accel import weights
from spec_decode.bench.accel.record import Recorder
from spec_decode.bench.accel.runner import Item
from spec_decode.bench.accel.runner import Runner
from spec_decode.bench.accel.runner import Skip
from spec_decode.policy import timing

SECTIONS = (
  'smoke',
  'setup',
  'xxl',
  'identity_bfloat16',
  'xxl_more',
  'f32_attention',
  'batching',
  'trees',
  'beam',
  'identity_float32',
  'small',
  'base',
  'large',
  'xl',
  't5gemma',
)


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
    help='seconds for the whole run (default 360; --tiny: 1200)',
  )
  p.add_argument('--tiny', action='store_true', help='toy sizes (CPU)')
  p.add_argument(
    '--only',
    default='',
    help='comma-separated sections or section/item names to run (default '
    f'all: {",".join(SECTIONS)}); smoke always runs unless skipped',
  )
  p.add_argument(
    '--skip',
    default='',
    help='comma-separated sections or section/item names to leave out',
  )
  return p


def _meta(args, argv, plan) -> dict[str, Any]:
  devices = jax.devices()
  return {
    'command': 'spec-decode bench accel ' + ' '.join(argv),
    'device': f'{devices[0].platform}: {devices[0].device_kind}',
    'num_devices': len(devices),
    'jax': jax.__version__,
    'xla_flags': os.environ.get('XLA_FLAGS', ''),
    'python': platform.python_version(),
    'host': platform.node(),
    'tiny': bool(args.tiny),
    'budget': plan.budget,
    'only': args.only,
    'skip': args.skip,
    'max_decode_len': plan.max_decode_len,
    'started': time.strftime('%Y-%m-%d %H:%M:%S %Z'),
  }


def _names(text: str) -> list[str]:
  return [s for s in text.split(',') if s]


def main(argv: list[str] | None = None) -> int:
  parser = _parser()
  argv = sys.argv[1:] if argv is None else argv
  args = parser.parse_args(argv)
  only, skip = _names(args.only), _names(args.skip)
  unknown = sorted(
    {n for n in only + skip if n.split('/', 1)[0] not in SECTIONS}
  )
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
    plan = plan_lib.tiny(args.budget or 1200.0)
  else:
    plan = plan_lib.full(args.budget or 360.0)
  if only:
    only.append('smoke')
  rec = Recorder(args.out_dir, _meta(args, argv, plan), render=report.markdown)
  runner = Runner(rec, plan.budget, plan.boxes)
  runner.run(items(rec, plan), only, skip, fatal_sections=('smoke',))
  rec.finish()
  print(report.markdown(rec.data), flush=True)
  print(f'results: {os.path.join(args.out_dir, "accel.json")}', flush=True)
  if runner.fatal is not None:
    print(f'accel: the smoke step failed, nothing else ran: {runner.fatal}',
          flush=True)  # fmt: skip
    return 3
  return 1 if rec.data['errors'] else 0


class Models:
  """The models, made on first use (each made by an item where it can be,
  so its cost is predicted and recorded), one large target at a time.

  `draft_key` is where the draft's figures are recorded; `targets`, when
  given, is another `Models`' table of targets, so that one large target
  at a time holds across both (the T5Gemma section's and the T5 sizes').
  """

  def __init__(
    self,
    rec: Recorder,
    plan: plan_lib.Plan,
    p: cost.Predictor,
    draft_key: str = 'draft',
    targets: dict[str, Any] | None = None,
  ):
    self.rec, self.plan, self.p = rec, plan, p
    self.draft_key = draft_key
    self.targets: dict[str, Any] = {} if targets is None else targets
    self._draft: tuple[Any, float] | None = None
    self.init_seconds: dict[str, float] = {}

  def draft(self) -> tuple[sd.Model, float]:
    """The draft and its step seconds."""
    if self._draft is None:
      t0 = time.perf_counter()
      net = weights.random_model(self.plan.draft, seed=1)
      jax.block_until_ready(net.params)
      self.init_seconds['draft'] = time.perf_counter() - t0
      seconds = timing.step_times(
        net, (1,), self.plan.repeats, length=self.plan.step_length
      )[1]
      self.p.step[self.plan.draft] = seconds
      self._draft = (net, seconds)
      self.rec.put(self.draft_key, None, {
        'config': self.plan.draft.to_dict(),
        'step_ms': seconds * 1e3,
        'init_seconds': self.init_seconds['draft'],
      })  # fmt: skip
    return self._draft

  def made_draft(self) -> tuple[Any, float]:
    """`draft()` once an item has made it; raises `Skip` before (an item
    that needs it then costs no unpredicted init)."""
    if self._draft is None:
      raise Skip(f'needs the draft ({self.draft_key}), not made')
    return self._draft

  def target(self, name: str) -> sd.Model:
    if name not in self.targets:
      for other in list(self.targets):  # Only one large target at a time.
        del self.targets[other]
      t0 = time.perf_counter()
      model = weights.random_model(self.plan.targets[name], seed=0)
      self.targets[name] = sizes.suppress_eos(model)
      jax.block_until_ready(self.targets[name].params)
      self.init_seconds[name] = time.perf_counter() - t0
    return self.targets[name]

  def predict_init(self, name: str) -> float:
    """A target's init from the draft's (tracing grows with the layers,
    filling the weights with their bytes)."""
    cfg, d = self.plan.targets[name], self.plan.draft
    base = (
      self.init_seconds.get('draft', 10.0)
      * sum(cost.layers(cfg))
      / sum(cost.layers(d))
    )
    nbytes = cost.step_bytes(cfg, 1, 0, 0) * 2  # ~ encoder + decoder
    return self.p.margin * (base + 10 * nbytes / (self.p.bandwidth or 1e11))

  def init_item(self, name: str) -> Item:
    def run(box):
      self.target(name)
      self.rec.put('init_seconds', name, self.init_seconds[name])

    return Item(name, 'init', lambda: self.predict_init(name), run)


def _identity_items(rec, plan, p, models) -> list[Item]:
  xxl_cfg = plan.targets['xxl']
  state: dict[str, Any] = {}

  def predict(gamma_units: int, dtype_factor: float = 1.0):
    units = cost.decode_units(xxl_cfg) + cost.decode_units(
      xxl_cfg, plan.draft, gamma_units
    )
    steps = 2 * plan.identity_rows * plan.max_decode_len / 8
    return dtype_factor * p.predict(units, steps, xxl_cfg)

  def bf16(box):
    state['bf16'] = identity.measure(
      rec, 'identity_bfloat16', models.target('xxl'), models.draft()[0],
      plan, box,
    )  # fmt: skip

  def f32_attention_needed() -> float:
    got = state.get('bf16')
    if got is None:
      raise Skip('needs identity_bfloat16, not measured')
    if got['share_identical'] >= 1.0:
      raise Skip('every bfloat16 row was identical')
    return predict(plan.identity_gamma)

  def f32_attention(box):
    identity.restore(rec, models.target('xxl'), models.draft()[0], plan, box)

  def f32(box):
    target = as_float32(models.target('xxl'), free=True)
    models.targets.pop('xxl')
    # True float32 products: JAX's default on GPUs is TF32 (bfloat16
    # passes on TPUs), which rounds inputs as bfloat16 does.
    with jax.default_matmul_precision('float32'):
      identity.measure(
        rec, 'identity_float32', target, as_float32(models.draft()[0]),
        plan, box,
      )  # fmt: skip
    del target
    jax.clear_caches()  # Programs of a model that is gone.

  g = plan.identity_gamma
  return [
    Item('identity_bfloat16', 'rows', lambda: predict(g), bf16),
    Item('f32_attention', 'rows', f32_attention_needed, f32_attention),
    Item('identity_float32', 'rows', lambda: predict(g, 3.0), f32),
  ]


def _t5gemma_items(rec, plan, p, models) -> list[Item]:
  """The T5Gemma section: its draft, its target's init, then what
  `sizes.SizeBench` measures for a T5 size (v(k) at the core's k, c, the
  Table 2 setting) and the further alphas; recorded as
  `sections['sizes']['t5gemma']` and its draft as `t5gemma_draft`."""
  if plan.t5gemma_target is None:
    return []
  pair_plan = plan_lib.t5gemma_pair(plan)
  gemma = Models(
    rec, pair_plan, p, draft_key='t5gemma_draft', targets=models.targets
  )
  draft_cfg = pair_plan.draft
  target_name, draft_name = plan.t5gemma_names
  # The draft is its own item's (first, predicted); later items only read
  # it, and skip where that item did not fit.
  bench = sizes.SizeBench(
    rec, pair_plan, p, 't5gemma', lambda: gemma.target('t5gemma'),
    gemma.made_draft, target_name=target_name, draft_name=draft_name,
  )  # fmt: skip
  draft = Item(
    't5gemma',
    'draft',
    lambda: p.predict(2 * cost.score_units(draft_cfg) + 8, 64, draft_cfg),
    lambda box: gemma.draft(),
  )
  return [draft, gemma.init_item('t5gemma')] + bench.items(
    plan.core_ks, plan.alphas, core=True
  )


def items(rec: Recorder, plan: plan_lib.Plan) -> list[Item]:
  """Every item of the run, in order (the module doc)."""
  p = cost.Predictor(rate=plan.compile_rate)
  models = Models(rec, plan, p)
  draft_cfg = plan.draft

  def setup(box):
    models.draft()

  out = [
    Item('smoke', 'checks', lambda: 0.0, lambda box: smoke.run(rec, plan, p)),
    Item(
      'setup',
      'draft',
      lambda: p.predict(2 * cost.score_units(draft_cfg) + 8, 64, draft_cfg),
      setup,
    ),
  ]
  benches = {
    name: sizes.SizeBench(
      rec, plan, p, name, lambda name=name: models.target(name), models.draft
    )
    for name in plan.targets
  }
  xxl = benches['xxl']
  ident = _identity_items(rec, plan, p, models)
  more = xxl.items(plan.more_ks, plan.alphas, core=False)
  out += [models.init_item('xxl')] + xxl.items(plan.core_ks, (), core=True)
  out += [ident[0]]
  out += [Item('xxl_more', i.name, i.predict, i.run) for i in more]
  out += [ident[1]]
  get_xxl = lambda: models.target('xxl')  # noqa: E731
  for make in (pair.batching, pair.trees, pair.beam):
    out += make(rec, plan, p, get_xxl, models.draft)
  out += [ident[2]]
  for name in plan.targets:
    if name != 'xxl':
      out += [models.init_item(name)]
      out += benches[name].items(plan.core_ks, (), core=True)
  return out + _t5gemma_items(rec, plan, p, models)

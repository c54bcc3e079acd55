"""`spec-decode bench memory`: bytes per device, measured against the plan;
a T5Gemma decode state's sliding layers, flat in output length.

    spec-decode bench memory [--devices 8] [--scale 16] [--out memory.json]
        [--only plan|t5gemma] [--window 32] [--ring_margin 8]

docs/capacity_plan.md computes memory per chip on paper for T5-XXL sharded
`model` ways next to a replicated T5-small. This benchmark builds the same
pair scaled down (every width divided by `--scale`: d_model, d_ff, d_kv,
vocabulary; layer and head counts kept, so the shardings are the plan's)
on host devices, places it on each of the plan's meshes (`Partitioner`),
and reads the bytes per device from the arrays themselves
(`parallel.memory.decode_bytes`: parameter shards as placed, the decode
state's shards as the model constrains them). Next to each figure it puts
the plan's formula applied to the scaled shapes:

    target params / M + target cache per row x rows per replica / M
    + draft params + draft cache per row x rows per replica

(params and per-row cache bytes counted from the configs), so a layout the
plan gets wrong shows as a ratio away from 1. The float32 parameters of the
scaled models stand in for the plan's bfloat16: ratios do not depend on the
dtype.

The T5Gemma part (`t5gemma_run`) builds the decode state of a small random
T5Gemma and T5Gemma 2 (`--window` W, `--ring_margin` G) for outputs of
`T5GEMMA_LENGTHS` tokens and sums its arrays' bytes by layer type: a
sliding layer's ring keeps `min(L, W + G - 1)` entries, so its bytes stay
the same from L = W + G - 1 on, while a global layer's grow with L. The
encoder's keys and values (cross) depend on the input, not the output.
"""

import argparse
import json
import os
import sys

# The plan's meshes: (name, data, model, batch).
MESHES = (
  ('v4-8 b1', 1, 4, 1),
  ('v4-8 b32', 1, 4, 32),
  ('v5e-16 b1 (8 of 16 chips)', 1, 8, 1),
  ('v5e-16 b32 (data 2 of 4)', 2, 4, 16),
)
INPUT_LEN = 512
MAX_DECODE_LEN = 249  # + gamma 5 + 2 = 256 slots, the plan's L.
GAMMA = 5
# The T5Gemma part: decoder slots per row, and the input's tokens.
T5GEMMA_LENGTHS = (64, 256, 1024, 4096)
T5GEMMA_INPUT_LEN = 32


def _scaled(name: str, scale: int):
  import spec_decode as sd  # pylint: disable=g-import-not-at-top

  full = sd.T5Config.from_gin(name, vocab_size=32128)
  return sd.T5Config.from_gin(
    name,
    vocab_size=full.vocab_size // scale,
    emb_dim=full.emb_dim // scale,
    mlp_dim=full.mlp_dim // scale,
    head_dim=max(full.head_dim // scale, 1),
  )


def _plan(target, draft, data: int, model: int, batch: int) -> int:
  """The plan's formula on the models' own shapes (bytes per device)."""
  import jax  # pylint: disable=g-import-not-at-top

  from spec_decode.parallel import memory  # pylint: disable=g-import-not-at-top

  def params(m):
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(m.params))

  def cache_per_row(m):
    return memory.cache_bytes_per_device(
      _plain(m),
      1,
      INPUT_LEN,
      MAX_DECODE_LEN + GAMMA + 2,
    )

  rows = -(-batch // data)
  return int(
    params(target) / model
    + cache_per_row(target) * rows / model
    + params(draft)
    + cache_per_row(draft) * rows
  )


def _plain(m):
  """`m` without a partitioner (whole arrays: the plan's per-row sizes)."""
  return type(m)(m.config, m.params, m.vocabulary)


def run(scale: int) -> list[dict]:
  import jax  # pylint: disable=g-import-not-at-top

  import spec_decode as sd  # pylint: disable=g-import-not-at-top
  from spec_decode.parallel import memory  # pylint: disable=g-import-not-at-top

  target_cfg = _scaled('t5_1_1_xxl', scale)
  draft_cfg = _scaled('t5_1_1_small', scale)
  rows = []
  for name, data, model, batch in MESHES:
    if data * model > jax.device_count():
      print(f'{name}: needs {data * model} devices; skipped', file=sys.stderr)
      continue
    p = sd.Partitioner(data=data, model=model)
    target = sd.Model.init(target_cfg, seed=0, partitioner=p)
    draft = sd.Model.init(draft_cfg, seed=1, partitioner=p.replicated())
    measured = memory.decode_bytes(
      target, draft, batch, INPUT_LEN, MAX_DECODE_LEN, GAMMA
    )
    plan = _plan(target, draft, data, model, batch)
    rows.append(
      dict(
        mesh=name,
        data=data,
        model=model,
        batch=batch,
        measured=measured,
        plan_total=plan,
        ratio=measured['total'] / plan,
      )
    )
  return rows


def markdown(rows: list[dict], scale: int) -> str:
  mib = 2**20
  lines = [
    f'T5-XXL + T5-small, widths / {scale}; bytes per device (MiB), '
    f'S = {INPUT_LEN}, L = {MAX_DECODE_LEN + GAMMA + 2}',
    '',
    '| mesh | D x M | batch | target params | target cache | draft params '
    '| draft cache | measured total | plan formula | measured / plan |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r in rows:
    m = r['measured']
    lines.append(
      f'| {r["mesh"]} | {r["data"]} x {r["model"]} | {r["batch"]} | '
      f'{m["target_params"] / mib:.2f} | {m["target_cache"] / mib:.2f} | '
      f'{m["draft_params"] / mib:.2f} | {m["draft_cache"] / mib:.2f} | '
      f'{m["total"] / mib:.2f} | {r["plan_total"] / mib:.2f} | '
      f'{r["ratio"]:.4f} |'
    )
  return '\n'.join(lines)


def t5gemma_config(
  version: int, window: int, ring_margin: int, layers: int = 12
):
  """A small T5Gemma (version 1: every other layer global) or T5Gemma 2
  (five of six layers sliding), `layers` layers of width 64 with
  grouped-query attention (4 query heads on 2 key/value heads of 16)."""
  from spec_decode.t5gemma import config as config_lib  # pylint: disable=g-import-not-at-top

  stack = config_lib.pattern_stack(
    2 if version == 1 else 6,
    num_layers=layers,
    emb_dim=64,
    mlp_dim=128,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    sliding_window=window,
    query_pre_attn_scalar=16.0,
  )
  return config_lib.T5GemmaConfig(
    version=version,
    vocab_size=256,
    encoder=stack,
    decoder=stack,
    ring_margin=ring_margin,
  )


def t5gemma_state_bytes(model, length: int, batch: int = 1) -> dict:
  """Bytes of `model`'s decode state for `length` decoder slots, by part.

  Returns:
    `{length, sliding, global, cross, index, total}`: the self-attention
    keys, values and slot tables of the sliding and of the global layers,
    the encoder's keys and values with their mask, the per-row index, and
    every array of the state (their sum), each from the arrays' `nbytes`.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from spec_decode.t5gemma.config import GLOBAL  # pylint: disable=g-import-not-at-top
  from spec_decode.t5gemma.config import SLIDING  # pylint: disable=g-import-not-at-top

  enc = np.full((batch, T5GEMMA_INPUT_LEN), 5, np.int32)
  state = jax.block_until_ready(model.init_state(enc, length))
  cache = state.cache
  by_type = {SLIDING: 0, GLOBAL: 0}
  types = model.config.decoder.layer_types
  for t, k, v in zip(types, cache.keys, cache.values, strict=True):
    by_type[t] += k.nbytes + v.nbytes
  for t, slots in cache.slots.items():
    by_type[t] += slots.nbytes
  return {
    'length': length,
    'sliding': by_type[SLIDING],
    'global': by_type[GLOBAL],
    'cross': sum(x.nbytes for x in jax.tree.leaves(state.cross)),
    'index': cache.index.nbytes,
    'total': sum(x.nbytes for x in jax.tree.leaves(state)),
  }


def t5gemma_run(
  window: int, ring_margin: int, lengths=T5GEMMA_LENGTHS, layers: int = 12
) -> list[dict]:
  """Both versions' decode-state bytes at each length (one row per
  version: its config's shape and `t5gemma_state_bytes` per length)."""
  from spec_decode.models.t5gemma_model import T5GemmaModel  # pylint: disable=g-import-not-at-top
  from spec_decode.t5gemma.config import SLIDING  # pylint: disable=g-import-not-at-top

  out = []
  for version in (1, 2):
    cfg = t5gemma_config(version, window, ring_margin, layers)
    model = T5GemmaModel.init(cfg, seed=0)
    types = cfg.decoder.layer_types
    out.append({
      'version': version,
      'window': window,
      'ring_margin': ring_margin,
      'sliding_layers': types.count(SLIDING),
      'global_layers': len(types) - types.count(SLIDING),
      'ring_entries': window + ring_margin - 1,
      'lengths': [t5gemma_state_bytes(model, n) for n in lengths],
    })  # fmt: skip
  return out


def t5gemma_markdown(rows: list[dict]) -> str:
  kib = 2**10
  lines = []
  for r in rows:
    name = 'T5Gemma' if r['version'] == 1 else 'T5Gemma 2'
    first = r['lengths'][0]
    lines += [
      f'{name}: {r["sliding_layers"]} sliding and {r["global_layers"]} '
      f'global decoder layers, window {r["window"]}, ring margin '
      f'{r["ring_margin"]} (a sliding ring of {r["ring_entries"]} '
      'entries); decode-state bytes per row (KiB)',
      '',
      '| output slots L | sliding layers | global layers | cross (encoder) '
      '| total | sliding / at first L | global / at first L |',
      '|---|---|---|---|---|---|---|',
    ]
    for x in r['lengths']:
      lines.append(
        f'| {x["length"]} | {x["sliding"] / kib:.1f} | '
        f'{x["global"] / kib:.1f} | {x["cross"] / kib:.1f} | '
        f'{x["total"] / kib:.1f} | {x["sliding"] / first["sliding"]:.2f} | '
        f'{x["global"] / first["global"]:.2f} |'
      )
    lines.append('')
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench memory', description=__doc__
  )
  parser.add_argument(
    '--devices',
    type=int,
    default=8,
    help='host devices on CPU (set before JAX starts)',
  )
  parser.add_argument('--scale', type=int, default=16)
  parser.add_argument('--out', default='bench_memory.json')
  parser.add_argument(
    '--only',
    choices=('plan', 't5gemma'),
    default=None,
    help='one part: the capacity plan, or the T5Gemma state (default both)',
  )
  parser.add_argument(
    '--window', type=int, default=32, help="T5Gemma's sliding window W"
  )
  parser.add_argument(
    '--ring_margin',
    type=int,
    default=8,
    help="T5Gemma's ring margin G (8: chains up to gamma 7)",
  )
  args = parser.parse_args(argv)
  if args.window < 1 or args.ring_margin < 1:
    parser.error('--window and --ring_margin must be >= 1')
  flag = f'--xla_force_host_platform_device_count={args.devices}'
  if flag not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = os.environ.get('XLA_FLAGS', '') + ' ' + flag
  results = {}
  if args.only in (None, 'plan'):
    results['scale'] = args.scale
    results['rows'] = run(args.scale)
    print(markdown(results['rows'], args.scale) + '\n')
  if args.only in (None, 't5gemma'):
    results['t5gemma'] = t5gemma_run(args.window, args.ring_margin)
    print(t5gemma_markdown(results['t5gemma']))
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump(results, f, indent=2)
  print(f'wrote {args.out}')
  return 0

"""`spec-decode bench memory`: bytes per device, measured against the plan.

    spec-decode bench memory [--devices 8] [--scale 16] [--out memory.json]

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
  args = parser.parse_args(argv)
  flag = f'--xla_force_host_platform_device_count={args.devices}'
  if flag not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = os.environ.get('XLA_FLAGS', '') + ' ' + flag
  rows = run(args.scale)
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump({'scale': args.scale, 'rows': rows}, f, indent=2)
  print(markdown(rows, args.scale))
  print(f'\nwrote {args.out}')
  return 0

"""Benchmark: XLA's dot vs the small-K kernel, inside jit, on this CPU.

  spec-decode bench kernel [--repeats 15] [--json out.json]

For each case and k in {1, 2, 4, 8, 16} it times one jitted call (median over
repeats after warm-up; the machine is shared, so medians, not means) of
  * `jnp.dot(x, w)` with w: [D, N] float32 (XLA:CPU, as the network does now),
  * `ops.matmul(x, pack(w))` (the kernel, float32 weights),
  * `ops.matmul(x, pack(w, bfloat16))` (the kernel, bfloat16 weights),
and prints v(k) = time(k) / time(1) and the weight-read rate in GB/s.

Cases: one 4096 x 16384 float32 matrix (256 MB), and a T5-base-like decoder
stack (12 layers of self-attention q/k/v/o, cross-attention q/o, gated MLP
wi_0/wi_1/wo at d_model 768, d_ff 2048, plus the 768 x 32128 logits matrix:
about 490 MB) run as one chain of matmuls inside one jit, so the weights
stream from memory as in a decode step rather than sit in cache.

All variants and k are timed round-robin (one call each per round), so the
load of other processes on this shared machine hits them alike; the table
shows medians over rounds.

Reference bandwidths over 256 MB, measured in the same run: memcpy (numpy's
copy, and a copy split over the kernel's threads; the better one counts),
reported as bytes copied per second, and a pure read on the kernel's threads
(`pool_read`), the true ceiling for a kernel that only streams weights.
`%copy` and `%read` give the kernel's k = 1 weight-read rate against each.
"""

import argparse
import ctypes
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.kernels import build as kernel_build
from spec_decode.kernels import ops

KS = (1, 2, 4, 8, 16)


def _time_round_robin(calls: dict, repeats: int) -> dict:
  """Median seconds per call of each `name -> (fn, args)`.

  Calls are interleaved (every call once per round), so load from other
  processes on this shared machine hits all variants alike.
  """
  for fn, args in calls.values():
    jax.block_until_ready(fn(*args))  # compile
    jax.block_until_ready(fn(*args))  # warm caches, wake threads
  times = {name: [] for name in calls}
  for _ in range(repeats):
    for name, (fn, args) in calls.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(t) for name, t in times.items()}


def _library() -> ctypes.CDLL | None:
  """The kernel library (built if missing or stale), for its thread pool's
  copy and read loops; None when it cannot be built or loaded."""
  try:
    return ctypes.CDLL(str(kernel_build.build()))
  except (kernel_build.BuildError, OSError):
    return None


def _bandwidth(nbytes: int, repeats: int) -> dict:
  """Copy and read rates (GB/s) over `nbytes`, medians over `repeats`."""

  def median_rate(fn):
    fn()
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      fn()
      times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9

  src = np.ones(nbytes // 4, np.float32)
  dst = np.empty_like(src)
  out = {'numpy_copy': median_rate(lambda: np.copyto(dst, src))}
  lib = _library()
  if lib is not None:
    copy = lib.smallm_parallel_copy
    copy.argtypes = [
      ctypes.c_void_p,
      ctypes.c_void_p,
      ctypes.c_int64,
      ctypes.c_int,
    ]
    read = lib.smallm_parallel_read
    read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    read.restype = ctypes.c_float
    out['pool_copy'] = median_rate(
      lambda: copy(dst.ctypes.data, src.ctypes.data, nbytes, 1)
    )
    out['pool_read'] = median_rate(lambda: read(src.ctypes.data, nbytes, 1))
  # The memcpy reference: bytes copied per second, best of the two copies.
  out['copy'] = max(out['numpy_copy'], out.get('pool_copy', 0.0))
  return out


def _base_stack_shapes() -> list[tuple[int, int]]:
  d, ff, vocab = 768, 2048, 32128
  layer = [(d, d)] * 6 + [(d, ff), (d, ff), (ff, d)]
  return layer * 12 + [(d, vocab)]


def _chain(apply):
  """A jitted chain of matmuls; each input depends on the previous output."""

  def run(xs, ws):
    y = None
    total = 0.0
    for w in ws:
      d = _rows(w)
      x = xs[d]
      if y is not None:
        # A data dependency, so XLA runs the matmuls one after the other as
        # a decode step does (and cannot overlap or reorder them).
        x = x + 0.0 * y[..., :1]
      y = apply(x, w)
      total = total + y[..., 0]
    return total

  return jax.jit(run)


def _rows(w) -> int:
  return w.d if isinstance(w, ops.Packed) else w.shape[0]


def _bench_case(name, shapes, repeats, rng) -> list[dict]:
  ws = [rng.standard_normal(s, np.float32) / np.sqrt(s[0]) for s in shapes]
  nbytes = sum(int(np.prod(s)) * 4 for s in shapes)
  variants = {
    'xla_dot': ([jnp.asarray(w) for w in ws], lambda x, w: jnp.dot(x, w))
  }
  if ops.available():
    variants['kernel_f32'] = ([ops.pack(w) for w in ws], ops.matmul)
    variants['kernel_bf16'] = (
      [ops.pack(w, jnp.bfloat16) for w in ws],
      ops.matmul,
    )
  del ws
  calls = {}
  for k in KS:
    xs = {
      d: jnp.asarray(rng.standard_normal((k, d), np.float32))
      for d in {s[0] for s in shapes}
    }
    for variant, (weights, apply) in variants.items():
      calls[variant, k] = (_chain(apply), (xs, weights))
  times = _time_round_robin(calls, repeats)
  rows = []
  for (variant, k), t in times.items():
    read = nbytes // 2 if variant.endswith('bf16') else nbytes
    rows.append(
      {
        'case': name,
        'variant': variant,
        'k': k,
        'ms': 1e3 * t,
        'v': t / times[variant, 1],
        'gbs': read / t / 1e9,
        'weight_mb': read / 2**20,
      }
    )
  return rows


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench kernel', description=__doc__.splitlines()[0]
  )
  parser.add_argument('--repeats', type=int, default=15)
  parser.add_argument('--json', default=None, help='write results here')
  parser.add_argument(
    '--cases',
    default='big,base',
    help='comma list of: big (4096x16384), base (T5-base '
    'decoder stack), small (single 768x2048)',
  )
  args = parser.parse_args(argv)
  rng = np.random.default_rng(0)
  info = ops.info()
  print(f'kernel: {info}')
  print(
    f'jax {jax.__version__}, backend {jax.default_backend()}, '
    f'{args.repeats} repeats, medians'
  )
  bw = _bandwidth(256 << 20, args.repeats)
  print('256 MB: ' + ', '.join(f'{k} {v:.1f}' for k, v in bw.items()) + ' GB/s')
  read_ref = bw.get('pool_read', bw['copy'])
  cases = {
    'big': [(4096, 16384)],
    'base': _base_stack_shapes(),
    'small': [(768, 2048)],
  }
  rows = []
  for name in args.cases.split(','):
    rows += _bench_case(name, cases[name], args.repeats, rng)
  print()
  header = (
    f'{"case":6} {"variant":12} '
    + ' '.join(f'{"v(" + str(k) + ")":>6}' for k in KS)
    + f' {"ms(1)":>7} {"GB/s(1)":>7} {"%copy":>6} {"%read":>6}'
  )
  print(header)
  for name in args.cases.split(','):
    for variant in ('xla_dot', 'kernel_f32', 'kernel_bf16'):
      sel = sorted(
        (r for r in rows if r['case'] == name and r['variant'] == variant),
        key=lambda r: r['k'],
      )
      if not sel:
        continue
      r1 = sel[0]
      print(
        f'{name:6} {variant:12} '
        + ' '.join(f'{r["v"]:6.2f}' for r in sel)
        + f' {r1["ms"]:7.2f} {r1["gbs"]:7.1f} '
        f'{100 * r1["gbs"] / bw["copy"]:5.0f}% '
        f'{100 * r1["gbs"] / read_ref:5.0f}%'
      )
  print('\nms per call, k = ' + ', '.join(map(str, KS)) + ':')
  for name in args.cases.split(','):
    for variant in ('xla_dot', 'kernel_f32', 'kernel_bf16'):
      sel = sorted(
        (r for r in rows if r['case'] == name and r['variant'] == variant),
        key=lambda r: r['k'],
      )
      if sel:
        print(
          f'{name:6} {variant:12} ' + ' '.join(f'{r["ms"]:8.2f}' for r in sel)
        )
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(
        {'kernel': info, 'bandwidth_gbs': bw, 'rows': rows}, f, indent=2
      )
  return 0

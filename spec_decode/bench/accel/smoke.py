"""The smoke step: seconds on the device before anything large compiles.

The device's JAX is newer than the one the suite runs on, and a lent GPU
gives one try; this step fails fast if an API moved. It records the
versions, runs every JAX API the decode, bench and tests depend on
(`api_check`), measures the memory bandwidth with one large copy (what the
step-time bounds use where the device kind's data sheet is unknown), and
decodes a toy model plainly and speculatively (chain and tree) in float32
with true float32 products, where every speculative output must equal the
plain one. Any failure stops the run (`run.py` exits 3) with the failing
call named.
"""

import time
from typing import Any

import jax
import numpy as np

import spec_decode as sd
from spec_decode.bench.accel import api_check
from spec_decode.bench.accel import cost
from spec_decode.bench.accel import plan as plan_lib
from spec_decode.bench.accel import weights
from spec_decode.core import tree_shape


def _toy_config(config):
  return config.replace(dtype='float32', param_dtype='float32')


def decodes(config) -> dict[str, Any]:
  """A toy float32 pair decoded by chain and by tree; raises if either
  output differs from plain decoding's (true float32 products). Beam search
  is left to its section and the tests: its programs are the smoke step's
  largest compile."""
  target = weights.random_model(_toy_config(config), seed=0)
  draft = weights.random_model(_toy_config(config), seed=1)
  enc = np.arange(3, 3 + 2 * 12, dtype=np.int32).reshape(2, 12)
  m = 6
  got: dict[str, Any] = {}
  with jax.default_matmul_precision('float32'):
    plain = sd.generate(target, enc, max_decode_len=m).tokens
    runs = {
      'chain': lambda: sd.generate(
        target, enc, draft=draft, gamma=2, max_decode_len=m
      ),
      'tree': lambda: sd.generate(
        target,
        enc,
        draft=draft,
        tree=tree_shape.from_branching((2, 1)),
        max_decode_len=m,
      ),
    }
    for name, fn in runs.items():
      out = fn().tokens
      if not np.array_equal(np.asarray(out), np.asarray(plain)):
        raise AssertionError(f'smoke: greedy {name} output differs from plain')
      got[name] = 'identical'
  return got


def run(rec, plan, predictor) -> None:
  """`sections['smoke']`; raises on the first failure."""
  t0 = time.perf_counter()
  out: dict[str, Any] = {'versions': api_check.versions()}
  print(f'accel: versions {out["versions"]}', flush=True)
  rec.put('smoke', None, out)
  checks = api_check.check()
  out['api'] = checks
  rec.put('smoke', None, out)
  bad = [c for c in checks if not c['ok']]
  if bad:
    names = ', '.join(f'{c["api"]} ({c["error"]})' for c in bad)
    raise RuntimeError(f'JAX APIs failed on this device: {names}')
  kind = jax.devices()[0].device_kind
  out['bandwidth_measured'] = cost.copy_bandwidth(plan.smoke_copy_bytes)
  out['bandwidth_nominal'] = cost.nominal_bandwidth(kind)
  predictor.bandwidth = out['bandwidth_nominal'] or out['bandwidth_measured']
  out['bandwidth_used'] = predictor.bandwidth
  rec.put('smoke', None, out)
  # A toy pair (one layer each): the real draft's programs take minutes to
  # compile on a GPU, and compiling them is the next items' work.
  out['decodes'] = decodes(plan_lib.toy(1, 32))
  out['seconds'] = time.perf_counter() - t0
  rec.put('smoke', None, out)
  print(
    f'accel: smoke passed in {out["seconds"]:.1f} s; bandwidth '
    f'{out["bandwidth_measured"] / 1e9:.0f} GB/s measured, '
    f'{(out["bandwidth_nominal"] or 0) / 1e9:.0f} GB/s nominal ({kind})',
    flush=True,
  )

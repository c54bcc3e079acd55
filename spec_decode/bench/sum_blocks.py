"""What float32 sums in blocks cost and buy: `cpu_sum_block` on and off.

  spec-decode bench sum_blocks [--sizes demo_target,t5_small] [--batch 8]
      [--length 64] [--rounds 7] [--block 128] [--out bench_sum_blocks.json]

On the CPU backend float32 products sum their inner dimension in blocks
(`T5Config.cpu_sum_block`, `layers/dot.py`) to keep transformers' precision.
For each size this times, side by side in one process, the two settings
(`--block` and 0, XLA's own sums) on teacher forcing (a forward pass over
`[batch, length]` tokens) and on a training step (the loss's value and
gradients), in interleaved rounds, reporting medians and the ratio
blocks / XLA. It also reports what the blocks buy on single products at
the size's widths: the RMS relative error against float64 in units of
u = 2**-24, both settings. Decoding with the small-K kernel is not timed
here (the kernel sums in the same blocks at no measurable cost: `make
demo`'s figures did not move).
"""

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode.layers import dot

# Widths: the demo target's, T5 v1.1 small's; `tiny` for the rehearsal.
SIZES = {
  'demo_target': dict(
    emb_dim=256,
    mlp_dim=1024,
    num_heads=4,
    head_dim=64,
    num_encoder_layers=3,
    num_decoder_layers=3,
    vocab_size=4096,
  ),
  't5_small': dict(
    emb_dim=512,
    mlp_dim=1024,
    num_heads=6,
    head_dim=64,
    num_encoder_layers=8,
    num_decoder_layers=8,
    vocab_size=32128,
  ),
  'tiny': dict(
    emb_dim=256,
    mlp_dim=512,
    num_heads=2,
    head_dim=32,
    num_encoder_layers=1,
    num_decoder_layers=1,
    vocab_size=128,
  ),
}
_U = 2.0**-24


def _programs(config: sd.T5Config):
  """Jitted forward and training step of a model of `config`, its params."""
  model = sd.Model.init(config, seed=0)
  module = model.module

  def forward(params, enc, dec):
    return module.apply({'params': params}, enc, dec)

  def loss(params, enc, dec):
    logits = module.apply({'params': params}, enc, dec)
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), dec[..., None], -1)
    return -jnp.mean(picked)

  return model.params, jax.jit(forward), jax.jit(jax.value_and_grad(loss))


def time_size(name: str, block: int, batch: int, length: int, rounds: int):
  """Medians (seconds) of both settings and their ratios, for one size."""
  base = sd.T5Config(
    mlp_activations=('gelu', 'linear'), dropout_rate=0.0, **SIZES[name]
  )
  rng = np.random.default_rng(0)
  vocab = base.vocab_size
  enc = rng.integers(2, vocab, (batch, length)).astype(np.int32)
  dec = rng.integers(2, vocab, (batch, length)).astype(np.int32)
  settings = {'blocks': block, 'xla': 0}
  programs = {
    k: _programs(base.replace(cpu_sum_block=b)) for k, b in settings.items()
  }
  for params, fwd, step in programs.values():  # Compile.
    jax.block_until_ready((fwd(params, enc, dec), step(params, enc, dec)))
  times = {(k, w): [] for k in settings for w in ('forward', 'train_step')}
  for r in range(rounds):
    order = list(settings) if r % 2 == 0 else list(settings)[::-1]
    for k in order:
      params, fwd, step = programs[k]
      for what, fn in (('forward', fwd), ('train_step', step)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, enc, dec))
        times[(k, what)].append(time.perf_counter() - t0)
  out = {'config': SIZES[name], 'batch': batch, 'length': length}
  for what in ('forward', 'train_step'):
    med = {k: statistics.median(times[(k, what)]) for k in settings}
    out[what] = {
      'blocks_ms': med['blocks'] * 1e3,
      'xla_ms': med['xla'] * 1e3,
      'ratio': med['blocks'] / med['xla'],
    }
  out['product_error_u'] = product_errors(base, block)
  jax.clear_caches()
  return out


def product_errors(config: sd.T5Config, block: int) -> dict[str, dict]:
  """RMS relative error (units of u) of one product per inner width K of
  `config` (emb_dim, heads x head_dim, mlp_dim), 64 rows, both settings."""
  widths = sorted(
    {config.emb_dim, config.num_heads * config.head_dim, config.mlp_dim}
  )
  rng = np.random.default_rng(1)
  out = {}
  for k in widths:
    x = rng.standard_normal((64, k)).astype(np.float32)
    w = rng.standard_normal((k, 256)).astype(np.float32)
    ref = x.astype(np.float64) @ w.astype(np.float64)
    scale = np.sqrt(np.mean(ref**2))
    row = {}
    for label, b in (('blocks', block), ('xla', 0)):
      y = np.asarray(jax.jit(lambda a, c, b=b: dot.dot(a, c, b))(x, w))
      rms = np.sqrt(np.mean((y.astype(np.float64) - ref) ** 2)) / scale
      row[label] = float(rms / _U)
    out[str(k)] = row
  return out


def table(results: dict) -> str:
  """The Markdown table of `results['sizes']`."""
  lines = [
    '| size | batch x length | forward blocks / XLA (ms) | ratio | '
    'train step blocks / XLA (ms) | ratio | product error u '
    '(K: blocks / XLA) |',
    '|---|---|---|---|---|---|---|',
  ]
  for name, s in results['sizes'].items():
    f, t = s['forward'], s['train_step']
    err = ', '.join(
      f'{k}: {e["blocks"]:.1f} / {e["xla"]:.1f}'
      for k, e in s['product_error_u'].items()
    )
    lines.append(
      f'| {name} | {s["batch"]} x {s["length"]} | {f["blocks_ms"]:.1f} / '
      f'{f["xla_ms"]:.1f} | {f["ratio"]:.2f} | {t["blocks_ms"]:.1f} / '
      f'{t["xla_ms"]:.1f} | {t["ratio"]:.2f} | {err} |'
    )
  return '\n'.join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    prog='spec-decode bench sum_blocks', description=__doc__.split('\n')[0]
  )
  p.add_argument('--sizes', default='demo_target,t5_small')
  p.add_argument('--batch', type=int, default=8)
  p.add_argument('--length', type=int, default=64)
  p.add_argument('--rounds', type=int, default=7)
  p.add_argument('--block', type=int, default=128)
  p.add_argument('--out', default='bench_sum_blocks.json')
  args = p.parse_args(argv)
  names = [n for n in args.sizes.split(',') if n]
  unknown = sorted(set(names) - set(SIZES))
  if unknown or args.block < 1 or args.rounds < 1:
    p.error(
      f'--sizes: unknown {unknown} (known: {sorted(SIZES)})'
      if unknown
      else '--block and --rounds must be >= 1'
    )
  results = {
    'block': args.block,
    'rounds': args.rounds,
    'device': str(jax.devices()[0]),
    'command': 'spec-decode bench sum_blocks '
    + ' '.join(argv if argv is not None else []),
    'sizes': {},
  }
  for name in names:
    print(f'sum_blocks: {name}', flush=True)
    results['sizes'][name] = time_size(
      name, args.block, args.batch, args.length, args.rounds
    )
    with open(args.out, 'w', encoding='utf-8') as f:  # After every size.
      json.dump(results, f, indent=2)
      f.write('\n')
  print(table(results))
  return 0

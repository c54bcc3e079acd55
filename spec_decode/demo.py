"""`make demo`: a short end-to-end speculative decode on random tiny models.

It shows the mechanics (tokens, exactness, acceptance statistics) until the
trained demo pair and the eval run land; random weights give no speedup.
"""

import argparse
import time

import jax
import numpy as np

import spec_decode as sd
from spec_decode.core import inputs


def _sharpen(model: sd.Model, scale: float) -> sd.Model:
  # Random T5 weights give near-uniform next-token distributions; a larger
  # output kernel makes them peaked enough for a draft to agree with.
  params = jax.tree.map(np.array, model.params)
  params['decoder']['logits_dense']['kernel'] *= scale
  params['decoder']['logits_dense']['kernel'][:, sd.EOS_ID] *= 1.5
  return model.with_params(params)


def _perturbed(model: sd.Model, scale: float, seed: int) -> sd.Model:
  rng = np.random.default_rng(seed)
  return model.with_params(
    jax.tree.map(
      lambda x: (
        np.asarray(x)
        + scale * np.std(x) * rng.standard_normal(x.shape).astype(np.float32)
      ),
      model.params,
    )
  )


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog='spec-decode demo', description=__doc__)
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument(
    '--gamma', type=inputs.gamma_flag(), default=4, help="an int >= 1 or 'auto'"
  )
  parser.add_argument('--max_decode_len', type=int, default=32)
  return parser


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)

  cfg = sd.T5Config(
    vocab_size=256,
    emb_dim=128,
    num_heads=4,
    head_dim=32,
    mlp_dim=256,
    num_encoder_layers=2,
    num_decoder_layers=4,
    mlp_activations=('gelu', 'linear'),
    dropout_rate=0.0,
  )
  target = _sharpen(sd.Model.init(cfg, seed=0), 4.0)
  draft = _perturbed(target, 0.05, seed=1)
  rng = np.random.default_rng(0)
  enc = rng.integers(3, cfg.vocab_size, (args.batch, 12)).astype(np.int32)
  print(
    f'target: {target}\ndraft:  target + 5% weight noise (random '
    f'weights: this demo shows exactness and statistics, not speed)'
  )
  for temperature in (0.0, 1.0):
    kw = dict(
      temperature=temperature,
      max_decode_len=args.max_decode_len,
      seed=np.arange(args.batch),
    )
    t0 = time.perf_counter()
    plain = sd.generate(target, enc, **kw)
    t1 = time.perf_counter()
    spec = sd.generate(target, enc, draft=draft, gamma=args.gamma, **kw)
    t2 = time.perf_counter()
    s = spec.stats
    print(f'\n== temperature {temperature} (gamma {args.gamma}) ==')
    for b in range(min(args.batch, 2)):
      print(f'row {b} plain:       {plain.tokens[b, : plain.lengths[b]]}')
      print(f'row {b} speculative: {spec.tokens[b, : spec.lengths[b]]}')
    same = (plain.tokens == spec.tokens).all(axis=1).mean()
    print(
      f'rows identical to plain decoding: {same:.0%}'
      + (
        ' (expected 100% at temperature 0)'
        if temperature == 0
        else ' (sampling: same distribution, not the same draws)'
      )
    )
    print(
      f'alpha {s.alpha:.3f}  tokens/target call {s.tokens_per_call:.2f}'
      f'  target calls {s.target_calls}  draft calls {s.draft_calls}'
    )
    print(
      f'accepted-per-iteration histogram '
      f'(0..{len(s.accepted_histogram) - 1}): '
      f'{s.accepted_histogram.tolist()}'
    )
    print(
      'per-position acceptance: '
      + ' '.join(f'{a:.2f}' for a in s.per_position_acceptance)
    )
    print(
      f'walltime incl. compile: plain {t1 - t0:.2f}s, speculative '
      f'{t2 - t1:.2f}s'
    )
  return 0

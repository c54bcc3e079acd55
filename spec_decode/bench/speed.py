"""`spec-decode bench` / `make bench`: speed measured side by side, one run.

Sections (all medians over repeats, after warm-up, in one process):
  1. plain decoding efficiency: decoder weight bytes read per step / step
     time, against a memory-copy bandwidth measured in the same run;
  2. v(k) = target time for k tokens / time for 1 token, k = 2..16;
  3. speculative vs plain walltime under controlled acceptance
     (`drafters.ControlledDraft`) at alpha in {0.5, 0.7, 0.8, 0.9}, with the
     generalized prediction E[tokens] / (gamma c + v) from measured c and v,
     end to end and for the decode loops alone (setup subtracted);
  4. tokens/s of plain and speculative decoding at batch 1, 4, 8, 16;
  5. peer: Hugging Face transformers greedy and assisted generation against
     ours on the same weights and inputs (`bench_peer`);
  6. first-call compile time, and the number of recompilations after warm-up.
  7. (`--kernel`) sections 1-3 again with the small-K CPU kernel on and off
     (`spec_decode.kernels`), same run, under the JSON key `kernel`;
  8. (`--profile`, on by default) where a speculative iteration's time goes
     at gamma 4 and 8 (alpha 0.8): decodes traced with the JAX profiler,
     its XLA thunks split by scope (target call, draft calls, the rest of
     the draft block, the loop's verify/commit, idle) and by kind (kernel,
     dot, copy, cache write, reduce, elementwise), next to the same calls
     timed alone, and the bytes the loop body copies per iteration from the
     optimized HLO (`spec_decode.bench.profile`), under the JSON key
     `profile`.
Prints a Markdown table and writes JSON (`--out`).
"""

import argparse
import dataclasses
import functools
import json
import platform
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode import drafters
from spec_decode import theory
from spec_decode.bench import peer
from spec_decode.bench import profile
from spec_decode.core import costs
from spec_decode.core import loops
from spec_decode.kernels import ops as kernel_ops

ALPHAS = (0.5, 0.7, 0.8, 0.9)
PROFILE_GAMMAS = (4, 8)
PROFILE_ALPHA = 0.8


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """Sizes of one benchmark run (`--quick` shrinks them)."""

  target: sd.T5Config
  draft: sd.T5Config
  max_decode_len: int
  repeats: int
  ks: tuple[int, ...]
  batches: tuple[int, ...]
  copy_mb: int
  peer_pairs: tuple[str, ...] = ('deep decoder', 'base')


def _v1_1(vocab, emb, heads, mlp, layers) -> sd.T5Config:
  return sd.T5Config(
    vocab_size=vocab,
    emb_dim=emb,
    num_heads=heads,
    head_dim=64,
    mlp_dim=mlp,
    num_encoder_layers=layers,
    num_decoder_layers=layers,
    mlp_activations=('gelu', 'linear'),
    dropout_rate=0.0,
  )


FULL = BenchConfig(
  target=_v1_1(32128, 768, 12, 2048, 12),  # T5 v1.1 base
  draft=_v1_1(32128, 512, 6, 1024, 8).replace(num_decoder_layers=2),
  max_decode_len=64,
  repeats=5,
  ks=tuple(range(1, 17)),
  batches=(1, 4, 8, 16),
  copy_mb=512,
)
QUICK = BenchConfig(
  target=_v1_1(32128, 512, 8, 1024, 6),
  draft=_v1_1(32128, 256, 4, 512, 2),
  max_decode_len=32,
  repeats=3,
  ks=(1, 2, 4, 8, 16),
  batches=(1, 8),
  copy_mb=256,
  peer_pairs=('deep decoder',),
)


# Peer pairs (section 5): name -> (target decoder layers, draft decoder
# layers, residual scale). "deep decoder" doubles the target's decoder so a
# one-layer draft reads 0.14 of the target's weight bytes per step, the
# regime speculation is meant for (the paper's T5-small drafts for T5-XXL);
# "base" is the bench target itself, whose two-layer draft reads 0.3 of them
# (it shares the 32128-wide logits). `--quick` runs the first pair only.
PRIMARY_PAIR = 'deep decoder'


def peer_pairs(cfg: BenchConfig) -> dict[str, tuple[int, int, float]]:
  layers = cfg.target.num_decoder_layers
  pairs = {PRIMARY_PAIR: (2 * layers, 1, 0.05), 'base': (layers, 2, 0.1)}
  return {name: pairs[name] for name in cfg.peer_pairs}


_median_time = costs.median_time
step_times = costs.step_times


def copy_bandwidth(megabytes: int, repeats: int) -> float:
  """Bytes copied per second by numpy (one read and one write per byte)."""
  src = np.ones(megabytes * 2**20 // 4, np.float32)
  dst = np.empty_like(src)
  return src.nbytes / _median_time(lambda: np.copyto(dst, src), repeats)


def decoder_step_bytes(model: sd.Model) -> int:
  """Weight bytes one decoder step reads (cross K/V are precomputed)."""
  total = 0
  dec = model.params['decoder']
  for name, sub in dec.items():
    for path, leaf in jax.tree_util.tree_leaves_with_path(sub):
      keys = [getattr(p, 'key', '') for p in path]
      if (
        name.startswith('layers_')
        and keys[0] == 'encoder_decoder_attention'
        and keys[1] in ('key', 'value')
      ):
        continue
      total += leaf.nbytes
  if model.config.logits_via_embedding:
    total += model.params['token_embedder']['embedding'].nbytes
  return total


@functools.partial(jax.jit, static_argnames=('length',))
def _init_states(models, encoder_tokens, length: int):
  return tuple(m.init_state(encoder_tokens, length) for m in models)


def setup_seconds(models, encoder_tokens, length: int, repeats: int) -> float:
  """Time to set up decoding states (encoders, cross-attention keys and
  values, caches) of `models` for `encoder_tokens`, as a decode does once
  before its loop."""
  enc = jnp.asarray(encoder_tokens, jnp.int32)
  return _median_time(lambda: _init_states(tuple(models), enc, length), repeats)


def controlled_draft(draft_net, reference, alpha: float, seed: int = 17):
  """`draft_net`'s cost with the target's own `reference` tokens proposed at
  rate `alpha` (synthetic acceptance)."""
  return drafters.ControlledDraft(
    inner=draft_net,
    reference=jnp.asarray(reference),
    alpha=jnp.float32(alpha),
    key=jax.random.key(seed),
  )


def timed_generate(repeats, **kwargs) -> tuple[float, sd.GenerateOutput]:
  out = sd.generate(**kwargs)
  return _median_time(lambda: sd.generate(**kwargs).tokens, repeats), out


def inputs(batch: int, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.integers(3, 1000, (batch, 24)).astype(np.int32)


def controlled_speedups(
  cfg,
  target,
  draft_net,
  enc,
  plain,
  plain_time,
  reference,
  t_times,
  d_times,
  v_of_k,
) -> dict:
  """Speculative vs plain under `ControlledDraft` at each alpha in ALPHAS.

  γ comes from `theory.choose_gamma` with the measured c and v(k); each
  speculative output is checked equal to the plain one. Also reports where
  an iteration's time goes: the model calls it makes (γ draft steps and one
  target call over γ + 1 tokens, timed inside compiled loops) and the rest;
  and the speedup of the decode loops alone (`measured_loop`: the setup
  before the loop, target and draft encoders, subtracted from both
  walltimes), which is what E/(γc+v) predicts.
  """
  c = d_times[1] / t_times[1]
  m = cfg.max_decode_len
  setup_plain = setup_seconds([target], enc, m + 2, cfg.repeats)
  setup_spec = setup_seconds([target, draft_net], enc, m + 2, cfg.repeats)
  speedups = {}
  for alpha in ALPHAS:
    gamma, _ = theory.choose_gamma(alpha, c, v_of_k, max_gamma=max(cfg.ks) - 1)
    gamma = int(gamma)
    draft = controlled_draft(draft_net, reference, alpha)
    spec_time, spec = timed_generate(
      cfg.repeats,
      model=target,
      encoder_tokens=enc,
      draft=draft,
      gamma=gamma,
      max_decode_len=cfg.max_decode_len,
    )
    assert (spec.tokens == plain.tokens).all(), 'greedy identity broken'
    a_hat = spec.stats.alpha
    predicted = float(
      theory.walltime_improvement(a_hat, gamma, c, v_of_k[gamma + 1])
    )
    measured = plain_time / spec_time
    measured_loop = (plain_time - setup_plain) / (spec_time - setup_spec)
    iteration = (spec_time - setup_spec) / max(spec.stats.target_calls, 1)
    model_calls = gamma * d_times[1] + t_times[1] * v_of_k[gamma + 1]
    in_context = costs.iteration_time(target, draft_net, gamma, cfg.repeats)
    predicted_in_context = float(
      theory.expected_tokens(a_hat, gamma) * t_times[1] / in_context
    )
    speedups[str(alpha)] = dict(
      gamma=gamma,
      alpha_measured=a_hat,
      measured=measured,
      predicted=predicted,
      ratio=measured / predicted,
      measured_loop=measured_loop,
      ratio_loop=measured_loop / predicted,
      predicted_v1=float(theory.walltime_improvement(a_hat, gamma, c)),
      tokens_per_call=spec.stats.tokens_per_call,
      spec_seconds=spec_time,
      setup_plain_ms=setup_plain * 1e3,
      setup_spec_ms=setup_spec * 1e3,
      iteration_ms=iteration * 1e3,
      model_calls_ms=model_calls * 1e3,
      model_calls_in_context_ms=in_context * 1e3,
      predicted_in_context=predicted_in_context,
      ratio_loop_in_context=measured_loop / predicted_in_context,
      overhead_ms=(iteration - model_calls) * 1e3,
    )
  return speedups


def profile_section(
  cfg: BenchConfig, target=None, draft_net=None, reference=None
) -> dict[str, Any]:
  """Section 8: `profile.profile_iteration` at each of PROFILE_GAMMAS.

  Under `ControlledDraft` at PROFILE_ALPHA (batch 1, greedy), with the
  target call over gamma + 1 tokens and one draft step timed alone inside
  compiled loops (`step_times`) for comparison with their in-loop times.
  """
  m = cfg.max_decode_len
  if target is None:
    target = peer.suppress_eos(sd.Model.init(cfg.target, seed=0))
    draft_net = sd.Model.init(cfg.draft, seed=1)
  enc = inputs(1)
  if reference is None:
    reference = sd.generate(
      target, enc, max_decode_len=m + max(PROFILE_GAMMAS) + 2
    ).tokens
  draft = controlled_draft(draft_net, reference, PROFILE_ALPHA)
  alone_t = step_times(target, [g + 1 for g in PROFILE_GAMMAS], cfg.repeats)
  alone_d = step_times(draft_net, (1,), cfg.repeats)[1]
  out = {'alpha': PROFILE_ALPHA}
  for g in PROFILE_GAMMAS:
    prof = profile.profile_iteration(
      target, draft, enc, g, m, repeats=cfg.repeats
    )
    prof['target_alone_ms'] = alone_t[g + 1] * 1e3
    prof['draft_model_alone_ms'] = g * alone_d * 1e3
    out[str(g)] = prof
  return out


def run(cfg: BenchConfig) -> dict[str, Any]:
  results: dict[str, Any] = {
    'machine': {
      'platform': platform.platform(),
      'processor': platform.processor(),
      'devices': [str(d) for d in jax.devices()],
      'jax': jax.__version__,
    },
    'target_config': cfg.target.to_dict(),
    'draft_config': cfg.draft.to_dict(),
    'max_decode_len': cfg.max_decode_len,
  }
  m = cfg.max_decode_len
  target = peer.suppress_eos(sd.Model.init(cfg.target, seed=0))
  draft_net = sd.Model.init(cfg.draft, seed=1)

  # 6a. compile time of the first call.
  enc1 = inputs(1)
  t0 = time.perf_counter()
  sd.generate(target, enc1, max_decode_len=m)
  results['compile_seconds_plain'] = time.perf_counter() - t0

  # 1. plain decoding efficiency.
  bandwidth = copy_bandwidth(cfg.copy_mb, cfg.repeats)
  plain_time, plain = timed_generate(
    cfg.repeats, model=target, encoder_tokens=enc1, max_decode_len=m
  )
  steps = int(plain.lengths.max())
  step_time = plain_time / steps
  step_bytes = decoder_step_bytes(target)
  results.update(
    copy_bandwidth_gb_s=bandwidth / 1e9,
    decoder_weight_bytes_per_step=step_bytes,
    plain_step_seconds=step_time,
    plain_weight_read_gb_s=step_bytes / step_time / 1e9,
    copy_bandwidth_fraction=step_bytes / step_time / bandwidth,
  )

  # 2. v(k) on the target, and c from one draft step.
  t_times = step_times(target, cfg.ks, cfg.repeats)
  d_times = step_times(draft_net, (1,), cfg.repeats)
  v = {k: t_times[k] / t_times[1] for k in cfg.ks if k > 1}
  c = d_times[1] / t_times[1]
  results.update(
    v={str(k): r for k, r in v.items()},
    c=c,
    target_step_seconds=t_times[1],
    draft_step_seconds=d_times[1],
  )

  # 3. controlled acceptance.
  v_of_k = {1: 1.0, **v}
  reference = sd.generate(target, enc1, max_decode_len=m + max(cfg.ks) + 2)
  speedups = controlled_speedups(
    cfg,
    target,
    draft_net,
    enc1,
    plain,
    plain_time,
    reference.tokens,
    t_times,
    d_times,
    v_of_k,
  )
  results['speedup'] = speedups

  # 4. batch sizes, at alpha = 0.8.
  gamma = speedups['0.8']['gamma']
  batch_rows = {}
  for b in cfg.batches:
    enc = inputs(b, seed=b)
    ref = sd.generate(target, enc, max_decode_len=m + gamma + 2)
    draft = controlled_draft(draft_net, ref.tokens, 0.8)
    pt, _ = timed_generate(
      cfg.repeats, model=target, encoder_tokens=enc, max_decode_len=m
    )
    st, _ = timed_generate(
      cfg.repeats,
      model=target,
      encoder_tokens=enc,
      draft=draft,
      gamma=gamma,
      max_decode_len=m,
    )
    batch_rows[str(b)] = dict(
      plain_tokens_per_s=b * m / pt,
      speculative_tokens_per_s=b * m / st,
      speedup=pt / st,
    )
  results['batch'] = batch_rows

  # 5. peer runs, each pair a target and an agreeing truncated copy of it.
  pairs = {
    name: peer.run(
      cfg.target.replace(num_decoder_layers=layers),
      draft_layers=draft_layers,
      gamma=4,
      max_len=m,
      repeats=cfg.repeats,
      residual_scale=scale,
    )
    for name, (layers, draft_layers, scale) in peer_pairs(cfg).items()
  }
  results['hf_pairs'] = pairs
  results['hf'] = pairs[PRIMARY_PAIR]

  # 6. recompilations after warm-up: new inputs of the same shapes.
  before = (
    loops.plain_decode_jit._cache_size(),
    loops.speculative_decode_jit._cache_size(),
  )
  sd.generate(target, inputs(1, seed=99), max_decode_len=m, seed=3)
  draft = controlled_draft(draft_net, reference.tokens, 0.6, seed=3)
  sd.generate(
    target,
    inputs(1, seed=98),
    draft=draft,
    gamma=speedups['0.8']['gamma'],
    max_decode_len=m,
  )
  after = (
    loops.plain_decode_jit._cache_size(),
    loops.speculative_decode_jit._cache_size(),
  )
  results['recompilations'] = int(sum(after) - sum(before))
  return results


def _kernel_setting(model: sd.Model, on: bool) -> sd.Model:
  if not on:
    return model.unpacked()
  return model if model.packed is not None else model.pack_for_cpu()


def kernel_sections(
  cfg: BenchConfig, settings: tuple[str, ...]
) -> dict[str, Any]:
  """Sections 1-3 (plain efficiency, v(k), controlled acceptance) per kernel
  setting ('on': packed weights and the small-K kernel, 'off': jnp.dot), on
  the same models, inputs and reference in one process."""
  m = cfg.max_decode_len
  base = peer.suppress_eos(sd.Model.init(cfg.target, seed=0))
  draft_base = sd.Model.init(cfg.draft, seed=1)
  enc1 = inputs(1)
  bandwidth = copy_bandwidth(cfg.copy_mb, cfg.repeats)
  step_bytes = decoder_step_bytes(base)
  out: dict[str, Any] = {
    'info': kernel_ops.info(),
    'copy_bandwidth_gb_s': bandwidth / 1e9,
    'decoder_weight_bytes_per_step': step_bytes,
  }
  reference = None
  for name in settings:
    on = name == 'on'
    if on and not kernel_ops.available():
      out[name] = {'skipped': 'kernel unavailable'}
      continue
    target = _kernel_setting(base, on)
    draft_net = _kernel_setting(draft_base, on)
    plain_time, plain = timed_generate(
      cfg.repeats, model=target, encoder_tokens=enc1, max_decode_len=m
    )
    step_time = plain_time / int(plain.lengths.max())
    t_times = step_times(target, cfg.ks, cfg.repeats)
    d_times = step_times(draft_net, (1,), cfg.repeats)
    v = {k: t_times[k] / t_times[1] for k in cfg.ks if k > 1}
    c = d_times[1] / t_times[1]
    if reference is None:
      reference = sd.generate(
        target, enc1, max_decode_len=m + max(cfg.ks) + 2
      ).tokens
    speedups = controlled_speedups(
      cfg,
      target,
      draft_net,
      enc1,
      plain,
      plain_time,
      reference,
      t_times,
      d_times,
      {1: 1.0, **v},
    )
    out[name] = dict(
      plain_seconds=plain_time,
      plain_step_seconds=step_time,
      plain_weight_read_gb_s=step_bytes / step_time / 1e9,
      copy_bandwidth_fraction=step_bytes / step_time / bandwidth,
      v={str(k): r for k, r in v.items()},
      c=c,
      target_step_seconds=t_times[1],
      draft_step_seconds=d_times[1],
      speedup=speedups,
    )
  return out


def kernel_markdown(r: dict[str, Any]) -> str:
  """Sections 1-3 side by side for the kernel settings in `r`."""
  runs = {
    n: s for n, s in r.items() if n in ('on', 'off') and 'skipped' not in s
  }
  lines = [
    '## Small-K CPU kernel on vs off',
    '',
    f'kernel: {r["info"]}; copy bandwidth '
    f'{r["copy_bandwidth_gb_s"]:.1f} GB/s; decoder weights '
    f'{r["decoder_weight_bytes_per_step"] / 1e9:.3f} GB/step',
    '',
  ]
  if not runs:
    return '\n'.join(lines + ['(no setting measured)'])
  ks = list(next(iter(runs.values()))['v'])
  lines += [
    '| kernel | step ms | weights GB/s | copy fraction | c | '
    + ' | '.join(f'v({k})' for k in ks)
    + ' |',
    '|---|---|---|---|---|' + '---|' * len(ks),
  ]
  for n, s in runs.items():
    lines.append(
      f'| {n} | {s["plain_step_seconds"] * 1e3:.1f} | '
      f'{s["plain_weight_read_gb_s"]:.1f} | '
      f'{s["copy_bandwidth_fraction"]:.0%} | {s["c"]:.3f} | '
      + ' | '.join(f'{x:.2f}' for x in s['v'].values())
      + ' |'
    )
  lines += [
    '',
    '| kernel | alpha | gamma | alpha measured | measured | '
    'measured (loop) | predicted E/(γc+v) |',
    '|---|---|---|---|---|---|---|',
  ]
  for n, s in runs.items():
    for a, x in s['speedup'].items():
      lines.append(
        f'| {n} | {a} | {x["gamma"]} | '
        f'{x["alpha_measured"]:.3f} | {x["measured"]:.2f}x | '
        f'{x.get("measured_loop", 0):.2f}x | {x["predicted"]:.2f}x |'
      )
  return '\n'.join(lines)


def profile_markdown(p: dict[str, Any]) -> str:
  """Section 8 as Markdown: per-iteration split, kinds, costliest thunks."""
  gammas = [k for k in p if k != 'alpha']
  lines = [
    f'## Where an iteration goes (profile, alpha {p["alpha"]}, batch 1)',
    '',
    'Decodes traced with the JAX profiler (the median one shown); each XLA '
    'thunk mapped to its HLO instruction (`spec_decode.bench.profile`). ms '
    'per iteration; '
    '"alone": the same calls timed in a compiled loop of their own; setup: '
    'encoders and cache allocation, once per decode.',
    '',
    '| γ | iterations | iteration ms | loop ms | target (alone) | '
    'draft model (alone) | draft other | verify/commit | idle | setup ms | '
    'thunks | copied KB |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for g in gammas:
    x = p[g]
    s = x['split_ms']
    copied = sum(x['hlo']['copy_bytes_per_iteration'].values()) / 1e3
    lines.append(
      f'| {g} | {x["iterations"]} | {x["ms_per_iteration"]:.1f} | '
      f'{x["loop_ms_per_iteration"]:.1f} | '
      f'{s["target"]:.1f} ({x["target_alone_ms"]:.1f}) | '
      f'{s["draft model"]:.1f} ({x["draft_model_alone_ms"]:.1f}) | '
      f'{s["draft other"]:.2f} | {s["loop"]:.2f} | {s["idle"]:.2f} | '
      f'{x["setup_ms"]:.0f} | {x["hlo"]["thunks_per_iteration"]} | '
      f'{copied:.0f} |'
    )
  lines += [
    '',
    '| γ | scope | ' + ' | '.join(profile.KINDS) + ' |',
    '|---|---|' + '---|' * len(profile.KINDS),
  ]
  for g in gammas:
    for scope in profile.SCOPES:
      kinds = p[g]['kinds_ms'].get(scope)
      if not kinds:
        continue
      lines.append(
        f'| {g} | {scope} | '
        + ' | '.join(f'{kinds.get(k, 0.0):.2f}' for k in profile.KINDS)
        + ' |'
      )
  g = gammas[-1]
  lines += [
    '',
    f'Costliest thunks at γ = {g} (ms per iteration):',
    '',
    '| ms | scope | kind | shape | op |',
    '|---|---|---|---|---|',
  ]
  for t in p[g]['top'][:8]:
    lines.append(
      f'| {t["ms"]:.2f} | {t["scope"]} | {t["kind"]} | {t["shape"]} | '
      f'`{t["op_name"][-60:]}` |'
    )
  return '\n'.join(lines)


def to_markdown(r: dict[str, Any]) -> str:
  lines = [
    '## Plain decoding efficiency',
    '',
    '| copy GB/s | weight GB/step | step ms | weights GB/s | fraction |',
    '|---|---|---|---|---|',
    f'| {r["copy_bandwidth_gb_s"]:.1f} | '
    f'{r["decoder_weight_bytes_per_step"] / 1e9:.3f} | '
    f'{r["plain_step_seconds"] * 1e3:.1f} | '
    f'{r["plain_weight_read_gb_s"]:.1f} | '
    f'{r["copy_bandwidth_fraction"]:.0%} |',
    '',
    '## v(k) = target time(k tokens) / time(1 token)',
    '',
    '| k | ' + ' | '.join(r['v']) + ' |',
    '|---|' + '---|' * len(r['v']),
    '| v | ' + ' | '.join(f'{x:.2f}' for x in r['v'].values()) + ' |',
    '',
    f'c (draft step / target step) = {r["c"]:.3f}',
    '',
    '## Speculative vs plain (controlled acceptance, batch 1)',
    '',
    '| alpha | gamma | alpha measured | tokens/call | measured | '
    'predicted E/(γc+v) | ratio | measured (loop) | ratio (loop) | '
    'Thm 3.8 (v=1) | setup ms | iteration ms | model calls ms | other ms | '
    'model calls in context ms | predicted in context | ratio (loop, in '
    'context) |',
    '|' + '---|' * 17,
  ]
  for a, s in r['speedup'].items():
    lines.append(
      f'| {a} | {s["gamma"]} | {s["alpha_measured"]:.3f} | '
      f'{s["tokens_per_call"]:.2f} | {s["measured"]:.2f}x | '
      f'{s["predicted"]:.2f}x | {s["ratio"]:.2f} | '
      f'{s.get("measured_loop", 0):.2f}x | {s.get("ratio_loop", 0):.2f} | '
      f'{s["predicted_v1"]:.2f}x | {s.get("setup_spec_ms", 0):.0f} | '
      f'{s.get("iteration_ms", 0):.1f} | '
      f'{s.get("model_calls_ms", 0):.1f} | {s.get("overhead_ms", 0):.1f} | '
      f'{s.get("model_calls_in_context_ms", 0):.1f} | '
      f'{s.get("predicted_in_context", 0):.2f}x | '
      f'{s.get("ratio_loop_in_context", 0):.2f} |'
    )
  lines += [
    '',
    '"measured (loop)": the decode loops alone, the setup before them '
    '(encoders, caches; "setup ms" for the speculative run) subtracted; '
    'iteration ms excludes it too. "model calls ms": γ draft steps and one '
    'target call over γ+1 tokens, each timed alone; "in context": the same '
    'calls back to back in one compiled loop, as decoding runs them (each '
    "model's weights evicted from the CPU cache by the other's); "
    '"predicted in context" = E[tokens] x target step / that time.',
  ]
  lines += [
    '',
    '## Batch size (alpha = 0.8)',
    '',
    '| batch | plain tok/s | speculative tok/s | speedup |',
    '|---|---|---|---|',
  ]
  for b, s in r['batch'].items():
    lines.append(
      f'| {b} | {s["plain_tokens_per_s"]:.1f} | '
      f'{s["speculative_tokens_per_s"]:.1f} | '
      f'{s["speedup"]:.2f}x |'
    )
  pairs = r.get('hf_pairs', {})
  skipped = [p['skipped'] for p in pairs.values() if 'skipped' in p]
  if skipped:
    lines += ['', f'Peer run skipped: {skipped[0]}']
  elif pairs:
    lines += [
      '',
      '## Peer: Hugging Face transformers (PyTorch CPU), batch 1',
      '',
      '| pair | target/draft decoder layers | c | alpha | gamma | | '
      'plain tok/s | speculative tok/s | speedup | ours / transformers '
      'speculative tok/s | same greedy tokens |',
      '|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    for name, hf in pairs.items():
      head = (
        f'| {name} | {hf["target_decoder_layers"]}/{hf["draft_layers"]} | '
        f'{hf["c"]:.3f} | {hf["alpha"]:.2f} | {hf["gamma"]} |'
      )
      lines += [
        f'{head} ours | {hf["ours_plain_tokens_per_s"]:.1f} | '
        f'{hf["ours_tokens_per_s"]:.1f} | {hf["ours_speedup"]:.2f}x | '
        f'{hf["ratio"]:.2f} | {hf["same_tokens_as_hf"]} |',
        f'{head} transformers | {hf["hf_plain_tokens_per_s"]:.1f} | '
        f'{hf["hf_tokens_per_s"]:.1f} | {hf["hf_speedup"]:.2f}x | | '
        f'assisted = greedy: {hf["hf_assisted_equals_hf_greedy"]} |',
      ]
  lines += [
    '',
    f'First plain call (compile + run): '
    f'{r["compile_seconds_plain"]:.1f}s; recompilations after '
    f'warm-up: {r["recompilations"]}',
  ]
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='spec-decode bench', description=__doc__.splitlines()[0]
  )
  parser.add_argument(
    '--quick',
    action='store_true',
    help='smaller models and fewer repeats (< 3 minutes)',
  )
  parser.add_argument('--out', default='bench.json', help='JSON output path')
  parser.add_argument(
    '--kernel',
    choices=('both', 'on', 'off', 'none'),
    default=None,
    help='sections 1-3 again with the small-K CPU kernel on and/or off '
    '(JSON key "kernel"); none skips them (default: both, none with '
    '--quick)',
  )
  parser.add_argument(
    '--kernel_only', action='store_true', help='only the --kernel sections'
  )
  parser.add_argument(
    '--profile',
    choices=('on', 'off'),
    default='on',
    help='where a speculative iteration\'s time goes (JSON key "profile")',
  )
  parser.add_argument(
    '--profile_only', action='store_true', help='only the --profile section'
  )
  args = parser.parse_args(argv)
  cfg = QUICK if args.quick else FULL
  if args.kernel is None:
    args.kernel = 'none' if args.quick else 'both'
  only = args.kernel_only or args.profile_only
  results = {} if only else run(cfg)
  if args.kernel != 'none' and not args.profile_only:
    settings = ('off', 'on') if args.kernel == 'both' else (args.kernel,)
    results['kernel'] = kernel_sections(cfg, settings)
  if (args.profile == 'on' and not args.kernel_only) or args.profile_only:
    results['profile'] = profile_section(cfg)
  results['quick'] = args.quick
  with open(args.out, 'w') as f:
    json.dump(results, f, indent=2)
  if not only:
    print(to_markdown(results))
  if 'kernel' in results:
    print('\n' + kernel_markdown(results['kernel']))
  if 'profile' in results:
    print('\n' + profile_markdown(results['profile']))
  print(f'\nwrote {args.out}')
  return 0


if __name__ == '__main__':
  raise SystemExit(main())

"""`spec-decode bench` / `make bench`: speed measured side by side, one run.

Sections (all medians over repeats, after warm-up, in one process):
  1. plain decoding efficiency: decoder weight bytes read per step / step
     time, against a memory-copy bandwidth measured in the same run;
  2. v(k) = target time for k tokens / time for 1 token, k = 2..16;
  3. speculative vs plain walltime under controlled acceptance
     (`bench.controlled.ControlledDraft`) at alpha in {0.5, 0.7, 0.8, 0.9},
     with the generalized prediction E[tokens] / (gamma c + v) from measured
     c and v, end to end and for the decode loops alone (setup subtracted);
  4. tokens/s of plain and speculative decoding at batch 1, 4, 8, 16;
  4b. gamma='auto' (the in-loop finish-time policy) against plain and each
     fixed gamma over a grid of batch sizes x controlled alphas
     (`bench.batch_policy`, JSON key `batch_policy`);
  5. peer: Hugging Face transformers greedy and assisted generation against
     ours on the same weights and inputs (`bench.peer`);
  6. first-call compile time, and the number of recompilations after warm-up.
  7. (`--kernel`) sections 1-3 again with the small-K CPU kernel on and off
     (`spec_decode.kernels`), same run, under the JSON key `kernel`
     (`bench.kernel_sections`);
  8. (`--profile`, on by default) where a speculative iteration's time goes
     at gamma 4 and 8 (alpha 0.8): decodes traced with the JAX profiler,
     its XLA thunks split by scope (target call, draft calls, the rest of
     the draft block, the loop's verify/commit, idle) and by kind (kernel,
     dot, copy, cache write, reduce, elementwise), next to the same calls
     timed alone, and the bytes the loop body copies per iteration from the
     optimized HLO (`spec_decode.bench.profile`), under the JSON key
     `profile`.
This module measures; `bench.report` renders the Markdown tables and
`bench.cli` is the command line (JSON to `--out`).
"""

import dataclasses
import functools
import platform
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode import theory
from spec_decode.bench import batch_policy
from spec_decode.bench import controlled
from spec_decode.bench import peer
from spec_decode.bench import profile
from spec_decode.chain import loops
from spec_decode.policy import timing

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
  policy_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
  policy_alphas: tuple[float, ...] = (0.5, 0.8, 0.95)


def with_dtype(cfg: BenchConfig, dtype: str) -> BenchConfig:
  """`cfg` with both models' weights and activations in `dtype` (e.g.
  bfloat16 on an accelerator; logits stay float32)."""
  return dataclasses.replace(
    cfg,
    target=cfg.target.replace(dtype=dtype, param_dtype=dtype),
    draft=cfg.draft.replace(dtype=dtype, param_dtype=dtype),
  )


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
# The quick draft has one decoder layer: with two, its 32128-wide logits
# and layers cost 0.2-0.3 of a target step here, where no gamma pays at
# batch 8 and the grid compares nothing.
QUICK = BenchConfig(
  target=_v1_1(32128, 512, 8, 1024, 6),
  draft=_v1_1(32128, 256, 4, 512, 2).replace(num_decoder_layers=1),
  max_decode_len=32,
  repeats=3,
  ks=(1, 2, 4, 8, 16),
  batches=(1, 8),
  copy_mb=256,
  peer_pairs=('deep decoder',),
  policy_batches=(1, 8, 32),
  policy_alphas=(0.5, 0.95),
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


_median_time = timing.median_time
step_times = timing.step_times


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
  return controlled.ControlledDraft(
    inner=draft_net,
    reference=jnp.asarray(reference),
    alpha=jnp.float32(alpha),
    key=jax.random.key(seed),
  )


def timed_generate(repeats, **kwargs) -> tuple[float, sd.GenerateOutput]:
  out = sd.generate(**kwargs)
  return _median_time(lambda: sd.generate(**kwargs).tokens, repeats), out


def timed_speculative(
  repeats: int,
  target,
  encoder_tokens,
  draft,
  gamma: int,
  max_decode_len: int,
  plain: sd.GenerateOutput | None = None,
) -> tuple[float, sd.GenerateOutput]:
  """`timed_generate` of a speculative decode; with `plain` (the greedy
  plain output), checks that the speculative tokens equal it."""
  seconds, out = timed_generate(
    repeats,
    model=target,
    encoder_tokens=encoder_tokens,
    draft=draft,
    gamma=gamma,
    max_decode_len=max_decode_len,
  )
  if plain is not None:
    assert (out.tokens == plain.tokens).all(), 'greedy identity broken'
  return seconds, out


def no_eos_rows(out: sd.GenerateOutput, max_decode_len: int) -> int:
  """Rows of `out` that reached `max_decode_len` without EOS. The bench's
  random-weight targets rarely emit EOS, so its decodes run their full
  length by design; the eval reports such outputs apart
  (`eval/report/outcomes.py`), and the bench counts them so that its tables say
  what they time."""
  lengths = np.asarray(out.lengths)
  last = np.asarray(out.tokens)[np.arange(len(lengths)), lengths - 1]
  return int(((lengths >= max_decode_len) & (last != sd.EOS_ID)).sum())


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
) -> dict:
  """Speculative vs plain under `ControlledDraft` at each alpha in ALPHAS.

  γ comes from `theory.choose_gamma` with the measured c and v(k) (from the
  target's times `t_times` for k tokens, the draft's `d_times`); each
  speculative output is checked equal to the plain one. Also reports where
  an iteration's time goes: the model calls it makes (γ draft steps and one
  target call over γ + 1 tokens, timed inside compiled loops) and the rest;
  and the speedup of the decode loops alone (`measured_loop`: the setup
  before the loop, target and draft encoders, subtracted from both
  walltimes), which is what E/(γc+v) predicts.
  """
  c = d_times[1] / t_times[1]
  v_of_k = {1: 1.0, **{k: t / t_times[1] for k, t in t_times.items() if k > 1}}
  m = cfg.max_decode_len
  setup_plain = setup_seconds([target], enc, m + 2, cfg.repeats)
  setup_spec = setup_seconds([target, draft_net], enc, m + 2, cfg.repeats)
  speedups = {}
  for alpha in ALPHAS:
    gamma, _ = theory.choose_gamma(alpha, c, v_of_k, max_gamma=max(cfg.ks) - 1)
    gamma = int(gamma)
    draft = controlled_draft(draft_net, reference, alpha)
    spec_time, spec = timed_speculative(
      cfg.repeats, target, enc, draft, gamma, m, plain=plain
    )
    a_hat = spec.stats.alpha
    predicted = float(
      theory.walltime_improvement(a_hat, gamma, c, v_of_k[gamma + 1])
    )
    measured = plain_time / spec_time
    measured_loop = (plain_time - setup_plain) / (spec_time - setup_spec)
    iteration = (spec_time - setup_spec) / max(spec.stats.target_calls, 1)
    model_calls = gamma * d_times[1] + t_times[1] * v_of_k[gamma + 1]
    in_context = timing.iteration_time(target, draft_net, gamma, cfg.repeats)
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


def decode_sections(
  cfg: BenchConfig,
  target,
  draft_net,
  enc,
  bandwidth: float,
  step_bytes: int,
  reference=None,
) -> tuple[dict[str, Any], np.ndarray]:
  """Sections 1-3 (plain efficiency, v(k) and c, controlled acceptance).

  Args:
    cfg: the run's sizes.
    target: the target model.
    draft_net: the draft network `ControlledDraft` runs.
    enc: `[1, S]` encoder tokens.
    bandwidth: the copy bandwidth (bytes/s) the weight-read rate is set
      against.
    step_bytes: `decoder_step_bytes(target)`.
    reference: the target's greedy output the controlled drafts propose;
      None generates it here (after the v(k) timings).

  Returns:
    The sections' results and the reference tokens.
  """
  m = cfg.max_decode_len
  plain_time, plain = timed_generate(
    cfg.repeats, model=target, encoder_tokens=enc, max_decode_len=m
  )
  step_time = plain_time / int(plain.lengths.max())
  t_times = step_times(target, cfg.ks, cfg.repeats)
  d_times = step_times(draft_net, (1,), cfg.repeats)
  v = {k: t_times[k] / t_times[1] for k in cfg.ks if k > 1}
  if reference is None:
    reference = sd.generate(
      target, enc, max_decode_len=m + max(cfg.ks) + 2
    ).tokens
  speedups = controlled_speedups(
    cfg, target, draft_net, enc, plain, plain_time, reference, t_times, d_times
  )
  results = dict(
    plain_no_eos=no_eos_rows(plain, m),
    plain_rows=int(plain.lengths.shape[0]),
    plain_seconds=plain_time,
    plain_step_seconds=step_time,
    plain_weight_read_gb_s=step_bytes / step_time / 1e9,
    copy_bandwidth_fraction=step_bytes / step_time / bandwidth,
    v={str(k): r for k, r in v.items()},
    c=d_times[1] / t_times[1],
    target_step_seconds=t_times[1],
    draft_step_seconds=d_times[1],
    speedup=speedups,
  )
  return results, reference


def policy_section(cfg: BenchConfig, target=None, draft_net=None) -> list:
  """Section 4b: `batch_policy.run` over the config's grid."""
  if target is None:
    target = peer.suppress_eos(sd.Model.init(cfg.target, seed=0))
    draft_net = sd.Model.init(cfg.draft, seed=1).for_drafting()
  return batch_policy.run(
    target,
    draft_net,
    cfg.max_decode_len,
    cfg.repeats,
    cfg.policy_batches,
    cfg.policy_alphas,
  )


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
    draft_net = sd.Model.init(cfg.draft, seed=1).for_drafting()
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
  """Sections 1-6 on the bench's models; the results as a JSON-able dict."""
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
  draft_net = sd.Model.init(cfg.draft, seed=1).for_drafting()

  # 6a. compile time of the first call.
  enc1 = inputs(1)
  t0 = time.perf_counter()
  sd.generate(target, enc1, max_decode_len=m)
  results['compile_seconds_plain'] = time.perf_counter() - t0

  # 1-3. plain decoding efficiency, v(k) and c, controlled acceptance.
  bandwidth = copy_bandwidth(cfg.copy_mb, cfg.repeats)
  step_bytes = decoder_step_bytes(target)
  results.update(
    copy_bandwidth_gb_s=bandwidth / 1e9,
    decoder_weight_bytes_per_step=step_bytes,
  )
  sections, reference = decode_sections(
    cfg, target, draft_net, enc1, bandwidth, step_bytes
  )
  del sections['plain_seconds']
  results.update(sections)
  speedups = results['speedup']

  # 4. batch sizes, at alpha = 0.8.
  gamma = speedups['0.8']['gamma']
  batch_rows = {}
  for b in cfg.batches:
    enc = inputs(b, seed=b)
    ref = sd.generate(target, enc, max_decode_len=m + gamma + 2)
    draft = controlled_draft(draft_net, ref.tokens, 0.8)
    pt, plain = timed_generate(
      cfg.repeats, model=target, encoder_tokens=enc, max_decode_len=m
    )
    st, _ = timed_speculative(cfg.repeats, target, enc, draft, gamma, m)
    batch_rows[str(b)] = dict(
      no_eos=no_eos_rows(plain, m),
      plain_tokens_per_s=b * m / pt,
      speculative_tokens_per_s=b * m / st,
      speedup=pt / st,
    )
  results['batch'] = batch_rows

  # 4b. gamma='auto' against plain and fixed gammas, batch x alpha.
  results['batch_policy'] = policy_section(cfg, target, draft_net)

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
  draft = controlled_draft(draft_net, reference, 0.6, seed=3)
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

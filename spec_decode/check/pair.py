"""Bring-your-own-drafter check: does this target/draft pair decode exactly?

`verify(target, draft)` works for any target (`protocol.LanguageModel`) and
any draft (a language model or a `drafter.Drafter`), and reaches both only
through those protocols. It runs:

1. Greedy identity: plain greedy and speculative greedy decodes of the same
   inputs, at every gamma in `gammas` (or with the token tree `tree`), must
   give the same tokens and lengths. Deterministic (false-alarm rate 0 in
   exact arithmetic; a logit near-tie could flip an argmax).
2. Per sampler (default: temperature 1; with top-k; with top-p), N
   speculative samples of at most `sample_len` tokens for one input, rows
   cycling through `gammas` (or all with `tree`), and three checks on
   them against the target's exact distribution, obtained by teacher
   forcing through `init_state` / `score` and `Sampler.probs`:
   - zero probability: no sampled token may have target probability 0
     (deterministic, like 1).
   - PIT chi-square: the randomized probability integral transform of
     every sampled token, u_i = F(x_i-) + v p(x_i) with v ~ U[0, 1), where
     F is the cdf of p(. | x_<i) over ids in decreasing probability (ties
     by id), and u_i = v after EOS. Under exact decoding the u_i of a
     sequence are i.i.d. U[0, 1) (Rosenblatt's transform: each is uniform
     given the prefix), so the `[sample_len, bins]` table of their bins is
     a set of independent multinomials with N / bins expected per cell;
     Pearson's statistic, df = sample_len * (bins - 1). Exact at any V
     (no enumeration); it tests each position's conditional distribution
     (averaged over the sampled prefixes).
   - Enumerated G-test: the prefix tree is expanded where the target
     gives a prefix an expected count >= `min_expected` (at most
     N / min_expected prefixes per level, at V = 32128 too). Cells: every
     complete sequence with expected count >= `min_expected`, and for
     every expanded prefix "this prefix, then anything else", each with
     its exact probability; cells below `min_expected` are pooled (and the
     pool merged into the smallest cell when it is small too). Run when it
     has two cells or more, which depends on the target only: a flat
     target at V = 32128 gives none (the PIT still tests it), a peaked or
     truncated one a fine partition.
   The statistical checks share `false_alarm` by Bonferroni: each runs at
   false_alarm / (their number), fixed before anything is sampled. Tail
   probabilities come from `jax.scipy.special.gammaincc` (no scipy).
"""

import math
from typing import Any

import numpy as np

from spec_decode.chain import generation
from spec_decode.check import report as report_lib
from spec_decode.check import statistics
from spec_decode.core import inputs
from spec_decode.core import sampling
from spec_decode.core import tree_shape
from spec_decode.core.ids import EOS_ID

DEFAULT_SAMPLERS = (
  sampling.Sampler(1.0),
  sampling.Sampler(1.0, top_k=8),
  sampling.Sampler(1.0, top_p=0.9),
)
# Length of the random inputs used when none are given (EOS included).
_INPUT_LENGTH = 8


def validate(
  *,
  gammas,
  num_inputs,
  max_decode_len,
  samplers,
  num_samples,
  sample_len,
  batch_size,
  bins,
  false_alarm,
  seed,
  min_expected=5.0,
  tree=None,
) -> None:
  """Raises ValueError naming the first bad argument of `verify`."""

  def whole(name, value, low):
    inputs.check_int(name, value, low)

  if not isinstance(gammas, (tuple, list)) or not gammas:
    raise ValueError(f'gammas must be a non-empty list, got {gammas!r}')
  for g in gammas:
    inputs.parse_gamma(g, 'gammas')
  if tree is not None and not inputs.is_auto(tree):
    tree_shape.parse(tree)  # ValueError naming what is wrong.
  whole('num_inputs', num_inputs, 1)
  whole('max_decode_len', max_decode_len, 1)
  whole('num_samples', num_samples, 1)
  whole('sample_len', sample_len, 1)
  whole('batch_size', batch_size, 1)
  whole('bins', bins, 2)
  whole('seed', seed, 0)
  for s in samplers:
    if not isinstance(s, sampling.Sampler) or s.is_greedy:
      raise ValueError(
        f'samplers must be Samplers with temperature > 0, got {s!r}'
      )
  if not isinstance(min_expected, (int, float)) or min_expected <= 0:
    raise ValueError(f'min_expected must be > 0, got {min_expected!r}')
  if not isinstance(false_alarm, (int, float)) or not 0 < false_alarm < 1:
    raise ValueError(f'false_alarm must be in (0, 1), got {false_alarm!r}')


def verify(
  target: Any,
  draft: Any,
  *,
  encoder_tokens: Any = None,
  gammas: tuple[int, ...] = (1, 3, 5),
  num_inputs: int = 16,
  max_decode_len: int = 16,
  samplers: tuple[sampling.Sampler, ...] = DEFAULT_SAMPLERS,
  num_samples: int = 6000,
  sample_len: int = 3,
  batch_size: int = 1000,
  bins: int = 10,
  min_expected: float = 5.0,
  false_alarm: float = 1e-3,
  seed: int = 0,
  verifier: Any = None,
  eos_id: int = EOS_ID,
  tree: Any = None,
) -> report_lib.PairReport:
  """Checks that speculative decoding with `draft` is exact for `target`.

  Args:
    target: any language model (`core/protocol.py`).
    draft: any language model or drafter with the target's vocabulary.
    encoder_tokens: `[B, S]` ints, 0 = padding: the greedy inputs; the
      first row is the input of the distribution tests. Default:
      `num_inputs` random rows of 8 ids, the last one EOS.
    gammas: draft lengths tried (greedy: each; sampling: batches cycle).
    num_inputs: rows of the default inputs.
    max_decode_len: tokens per greedy decode.
    samplers: the sampling settings tested (temperature > 0).
    num_samples: N, sequences sampled per sampler.
    sample_len: tokens per sampled sequence at most.
    batch_size: rows per `generate` or teacher-forcing call.
    bins: cells per position of the PIT chi-square.
    min_expected: the least expected count of an enumerated cell.
    false_alarm: family-wise rate at which an exact pair fails.
    seed: seeds the inputs, the samples and the PIT's v.
    verifier: passed to `generate` (default Algorithm 1); to check one.
    eos_id: end-of-sequence id.
    tree: None (chains of `gammas`), or the `generate(tree=...)` shape to
      check instead (paths, a branching tuple or 'auto'): the tree path.

  Returns:
    A `PairReport`; `report.passed`, `print(report.table())`.
  """
  validate(
    gammas=gammas,
    num_inputs=num_inputs,
    max_decode_len=max_decode_len,
    samplers=samplers,
    num_samples=num_samples,
    sample_len=sample_len,
    batch_size=batch_size,
    bins=bins,
    false_alarm=false_alarm,
    seed=seed,
    min_expected=min_expected,
    tree=tree,
  )
  vocab = target.vocab_size
  inputs.check_pair(target, draft)
  if encoder_tokens is None:
    rng = np.random.default_rng([seed, 0])
    enc = rng.integers(2, max(vocab, 3), (num_inputs, _INPUT_LENGTH))
    enc[:, -1] = eos_id
  else:
    enc = np.asarray(encoder_tokens)
    if enc.ndim != 2 or not np.issubdtype(enc.dtype, np.integer):
      raise ValueError(
        f'encoder_tokens must be a 2-D int array, got {enc.dtype} {enc.shape}'
      )
  enc = enc.astype(np.int32)
  common = dict(eos_id=eos_id)
  modes = _modes(gammas, tree)
  checks = list(
    _greedy_checks(target, draft, enc, modes, max_decode_len, verifier, common)
  )
  # Enumeration depends on the target alone: it fixes which G-tests run,
  # and so the Bonferroni share, before anything is sampled.
  k = min(vocab, 1 << math.ceil(math.log2(num_samples / min_expected + 1)))
  forcers = [
    statistics.Forcer(target, enc[:1], s, min(batch_size, num_samples), k)
    for s in samplers
  ]
  cells = [
    statistics.partition(f, num_samples, sample_len, min_expected, eos_id)
    for f in forcers
  ]
  tests = len(samplers) + sum(c is not None for c in cells)
  share = false_alarm / max(tests, 1)
  for i, (s, cell) in enumerate(zip(samplers, cells, strict=True)):
    samples, alpha = _sample(
      target,
      draft,
      enc[:1],
      s,
      num_samples,
      sample_len,
      batch_size,
      modes,
      verifier,
      [seed, i + 1],
      common,
    )
    pos = np.zeros(len(samples), np.int32)
    p_x, below, *_ = forcers[i](samples, pos)
    p_x, below = p_x.astype(np.float64), below.astype(np.float64)
    label = _label(s)
    checks.append(statistics.zero_check(label, samples, p_x, eos_id))
    rng = np.random.default_rng([seed, i + 1, 1])
    checks.append(
      statistics.pit_check(
        label, samples, p_x, below, bins, share, rng, alpha, eos_id
      )
    )
    if cell is not None:
      checks.append(
        statistics.g_check(label, samples, cell, share, min_expected, eos_id)
      )
  return report_lib.PairReport(tuple(checks), float(false_alarm))


def _label(s: sampling.Sampler) -> str:
  top_k = f' top_k={s.top_k}' if s.top_k else ''
  top_p = f' top_p={s.top_p:g}' if s.top_p < 1.0 else ''
  return f't={s.temperature:g}{top_k}{top_p}'


def _modes(gammas, tree) -> list[tuple[str, dict]]:
  """`(label, generate's keywords)` of each speculative setting checked."""
  if tree is not None:
    return [(f'tree={tree}', dict(tree=tree))]
  gammas = [inputs.parse_gamma(g, 'gammas') for g in gammas]
  return [(f'gamma={g}', dict(gamma=g)) for g in gammas]


def _greedy_checks(target, draft, enc, modes, max_decode_len, verifier, kw):
  plain = generation.generate(target, enc, max_decode_len=max_decode_len, **kw)
  for label, mode in modes:
    spec = generation.generate(
      target,
      enc,
      draft=draft,
      **mode,
      max_decode_len=max_decode_len,
      verifier=verifier,
      **kw,
    )
    differ = np.flatnonzero(
      (spec.tokens != plain.tokens).any(1) | (spec.lengths != plain.lengths)
    )
    detail = ''
    if len(differ):
      r = int(differ[0])
      detail = (
        f'row {r}: plain {plain.tokens[r].tolist()} vs speculative '
        f'{spec.tokens[r].tolist()}'
      )
    yield report_lib.exact_check(
      f'greedy identity, {label}',
      len(enc),
      len(differ),
      detail or 'rows that differ',
    )


def _sample(
  target, draft, enc, s, n, length, batch, modes, verifier, seed_key, kw
):
  """`[n, length]` speculative samples for input `enc [1, S]`, mean alpha.

  Every call decodes `batch` rows (one compilation per gamma); rows past n
  are dropped.
  """
  batch = min(batch, n)
  first = int(np.random.default_rng(seed_key).integers(0, 2**31 - n - batch))
  out, alphas = [], []
  for b, start in enumerate(range(0, n, batch)):
    res = generation.generate(
      target,
      np.repeat(enc, batch, 0),
      draft=draft,
      **modes[b % len(modes)][1],
      temperature=s.temperature,
      top_k=s.top_k,
      top_p=s.top_p,
      max_decode_len=length,
      seed=np.arange(first + start, first + start + batch),
      verifier=verifier,
      **kw,
    )
    out.append(res.tokens[: n - start])
    alphas.append(res.stats.alpha)
  return np.concatenate(out), float(np.mean(alphas))

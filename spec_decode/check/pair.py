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

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spec_decode.chain import generation
from spec_decode.core import inputs
from spec_decode.core import sampling
from spec_decode.core import tree_shape
from spec_decode.core.decode_settings import EOS_ID

DEFAULT_SAMPLERS = (
  sampling.Sampler(1.0),
  sampling.Sampler(1.0, top_k=8),
  sampling.Sampler(1.0, top_p=0.9),
)
# Length of the random inputs used when none are given (EOS included).
_INPUT_LENGTH = 8


@dataclasses.dataclass(frozen=True)
class PairCheck:
  """One check of `verify`.

  Attributes:
    name: what was checked, e.g. 'greedy identity, gamma=3'.
    passed: the verdict.
    sample_size: rows compared (greedy) or sequences sampled.
    statistic: rows that differ / samples with probability 0 / Pearson's
      X^2 / the G statistic.
    p_value: the statistic's tail probability; None for deterministic
      checks.
    false_alarm: the rate at which this check fails an exact pair (0 for
      deterministic checks; the Bonferroni share for statistical ones).
    df: degrees of freedom (statistical checks).
    detail: a short note (the first mismatch, the draft's alpha, ...).
  """

  name: str
  passed: bool
  sample_size: int
  statistic: float
  p_value: float | None
  false_alarm: float
  df: int | None = None
  detail: str = ''


@dataclasses.dataclass(frozen=True)
class PairReport:
  """What `verify` found; `passed` when every check passed.

  Attributes:
    checks: every check, greedy ones first.
    false_alarm: family-wise false-alarm rate of the statistical checks.
  """

  checks: tuple[PairCheck, ...]
  false_alarm: float

  @property
  def passed(self) -> bool:
    return all(c.passed for c in self.checks)

  def table(self) -> str:
    """The verdicts as a Markdown table, with a closing verdict line."""
    rows = [
      '| check | verdict | n | statistic | df | p-value | false-alarm rate |',
      '|---|---|---|---|---|---|---|',
    ]
    for c in self.checks:
      p = '-' if c.p_value is None else f'{c.p_value:.3g}'
      df = '-' if c.df is None else str(c.df)
      stat = f'{c.statistic:.4g}' + (f' ({c.detail})' if c.detail else '')
      rows.append(
        f'| {c.name} | {"pass" if c.passed else "FAIL"} | {c.sample_size} '
        f'| {stat} | {df} | {p} | {c.false_alarm:.3g} |'
      )
    failed = [c.name for c in self.checks if not c.passed]
    tests = sum(c.p_value is not None for c in self.checks)
    rows.append('')
    if failed:
      rows.append(f'FAIL: {len(failed)} of {len(self.checks)} checks failed')
    else:
      rows.append(
        f'PASS: all {len(self.checks)} checks passed (family-wise '
        f'false-alarm rate {self.false_alarm:g}, Bonferroni over {tests} '
        'tests)'
      )
    return '\n'.join(rows)


def chi2_sf(statistic: float, df: int) -> float:
  """P(X >= statistic) for X ~ chi-square(df): Q(df / 2, statistic / 2)."""
  if math.isinf(statistic):
    return 0.0
  return float(
    jax.scipy.special.gammaincc(
      jnp.float32(df / 2.0), jnp.float32(max(statistic, 0.0) / 2.0)
    )
  )


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
  encoder_tokens: Any = None,
  *,
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
) -> PairReport:
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
    Forcer(target, enc[:1], s, min(batch_size, num_samples), k)
    for s in samplers
  ]
  cells = [
    partition(f, num_samples, sample_len, min_expected, eos_id) for f in forcers
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
    checks.append(_zero_check(label, samples, p_x, eos_id))
    rng = np.random.default_rng([seed, i + 1, 1])
    checks.append(
      _pit_check(label, samples, p_x, below, bins, share, rng, alpha, eos_id)
    )
    if cell is not None:
      checks.append(_g_check(label, samples, cell, share, min_expected, eos_id))
  return PairReport(tuple(checks), float(false_alarm))


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
    yield _exact_check(
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


@functools.partial(jax.jit, static_argnames=('sampler', 'k'))
def _forced(target, enc, tokens, pos, sampler, k):
  """Teacher forcing of output tokens `[b, T]` (after the start id).

  Returns:
    p(x_i | x_<i) `[b, T]`; the mass of the ids ranked before x_i `[b, T]`
    (decreasing probability, ties by id); and the k most probable tokens
    after the first `pos[b]` tokens, probabilities and ids `[b, k]`.
  """
  b, t = tokens.shape
  inputs = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), tokens[:, :-1]], 1)
  logits, _ = target.score(target.init_state(enc, t + 1), inputs)
  probs = sampler.probs(logits)
  p_x = jnp.take_along_axis(probs, tokens[..., None], axis=-1)
  ids = lax.broadcasted_iota(jnp.int32, probs.shape, probs.ndim - 1)
  before = (probs > p_x) | ((probs == p_x) & (ids < tokens[..., None]))
  below = jnp.sum(jnp.where(before, probs, 0.0), axis=-1)
  top = lax.top_k(probs[jnp.arange(b), pos], min(k, probs.shape[-1]))
  return p_x[..., 0], below, top


@dataclasses.dataclass(frozen=True)
class Forcer:
  """Teacher forcing of `target` for one input and sampler.

  Called with output tokens `[n, T]` and positions `[n]`, returns what
  `_forced` does, as numpy: `[p_x, below, top_probs, top_ids]`. Runs
  chunks of `batch` rows, the last one padded: one compilation per sampler.
  """

  target: Any
  enc: np.ndarray  # [1, S]
  sampler: sampling.Sampler
  batch: int
  k: int

  def __call__(self, tokens: np.ndarray, pos: np.ndarray):
    outs = []
    for start in range(0, len(tokens), self.batch):
      chunk = tokens[start : start + self.batch]
      rows = len(chunk)
      pad = self.batch - rows
      got = _forced(
        self.target,
        jnp.asarray(np.repeat(self.enc, self.batch, 0)),
        jnp.asarray(np.pad(chunk, ((0, pad), (0, 0))), jnp.int32),
        jnp.asarray(np.pad(pos[start : start + self.batch], (0, pad))),
        self.sampler,
        self.k,
      )
      outs.append([np.asarray(x)[:rows] for x in jax.tree.leaves(got)])
    return [np.concatenate(parts) for parts in zip(*outs, strict=True)]


def _real(samples: np.ndarray, eos_id: int) -> np.ndarray:
  """`[N, T]` True at the positions a sequence has (up to its EOS)."""
  after = np.cumsum(samples == eos_id, axis=1) - (samples == eos_id)
  return after == 0


def _zero_check(label, samples, p_x, eos_id) -> PairCheck:
  bad = np.flatnonzero(((p_x <= 0) & _real(samples, eos_id)).any(1))
  detail = 'samples of target probability 0'
  if len(bad):
    detail = (
      f'e.g. {samples[bad[0]].tolist()}; a logit near-tie at a top-k/top-p '
      'cut can also do this'
    )
  return _exact_check(
    f'zero probability, {label}', len(samples), len(bad), detail
  )


def _exact_check(name, n, failures, detail) -> PairCheck:
  """A deterministic check: passes when nothing failed."""
  return PairCheck(
    name=name,
    passed=not failures,
    sample_size=n,
    statistic=float(failures),
    p_value=None,
    false_alarm=0.0,
    detail=detail,
  )


def _pit_check(
  label, samples, p_x, below, bins, share, rng, alpha, eos_id
) -> PairCheck:
  n, t = samples.shape
  v = rng.random((n, t))
  u = np.where(_real(samples, eos_id), below + v * p_x, v)
  cell = np.clip((u * bins).astype(np.int64), 0, bins - 1)
  counts = np.stack([np.bincount(cell[:, i], minlength=bins) for i in range(t)])
  expected = n / bins
  stat = float(((counts - expected) ** 2 / expected).sum())
  return _test_check(
    f'PIT chi-square, {label}',
    n,
    stat,
    t * (bins - 1),
    share,
    f'alpha {alpha:.2f}',
  )


# Marks a cell "this prefix, then any continuation not in another cell".
REST = -1


def partition(forcer, n, length, min_expected, eos_id):
  """A partition of all sequences into cells of exact probability.

  Expands the prefix tree level by level from the empty prefix. A prefix
  is expanded when its expected count N P is >= min_expected (it then has
  at most N P / min_expected children as probable, all among its
  `forcer.k` most probable). Cells: each complete sequence (EOS or
  `length` tokens) with N P >= min_expected, and for each expanded prefix
  s the rest `s + (REST,)`, with probability P(s) minus that of its
  children that are cells or expanded.

  Returns:
    `(cells {key: probability}, expanded prefixes)`, or None when the
    G-test would have fewer than two cells (no test).
  """
  threshold = min_expected / n
  frontier = {(): 1.0}
  cells, expanded = {}, set()
  for depth in range(length):
    if not frontier:
      break
    expanded.update(frontier)
    prefixes = list(frontier)
    tokens = np.zeros((len(prefixes), length), np.int32)
    if depth:
      tokens[:, :depth] = prefixes
    *_, probs, ids = forcer(tokens, np.full(len(prefixes), depth))
    grown = {}
    for prefix, row_probs, row_ids in zip(prefixes, probs, ids, strict=True):
      rest = frontier[prefix]
      for prob, tok in zip(row_probs.astype(np.float64), row_ids, strict=True):
        mass = frontier[prefix] * prob
        if mass < threshold:
          break  # Sorted: the rest are smaller.
        seq = prefix + (int(tok),)
        done = tok == eos_id or depth + 1 == length
        (cells if done else grown)[seq] = mass
        rest -= mass
      cells[prefix + (REST,)] = max(rest, 0.0)
    frontier = grown
  big = [p for p in cells.values() if p * n >= min_expected]
  pool = max(0.0, 1.0 - sum(big))
  if len(big) + (pool * n >= min_expected) < 2:
    return None
  return cells, expanded


def cell_of(sample, expanded, cells, eos_id) -> tuple[int, ...]:
  """The key of the cell `sample` (a row of output tokens) falls in."""
  ends = np.flatnonzero(sample == eos_id)
  seq = tuple(int(x) for x in sample[: ends[0] + 1 if len(ends) else None])
  if seq in cells:
    return seq
  # The rest of the longest expanded proper prefix (the empty one always).
  depth = next(d for d in range(len(seq) - 1, -1, -1) if seq[:d] in expanded)
  return seq[:depth] + (REST,)


def _g_check(label, samples, partition, share, min_expected, eos_id):
  """G-test of the samples' cells; cells with N P < min_expected pooled
  (and the pool merged into the smallest cell when it is small too)."""
  n = len(samples)
  cells, expanded = partition
  big = [k for k, p in cells.items() if p * n >= min_expected]
  index = {key: i for i, key in enumerate(big)}
  counts = np.zeros(len(big) + 1)
  for sample in samples:
    key = cell_of(sample, expanded, cells, eos_id)
    counts[index.get(key, len(big))] += 1
  expected = n * np.array([cells[k] for k in big] + [0.0])
  expected[-1] = max(0.0, n - expected[:-1].sum())
  if expected[-1] < min_expected:  # Too small a pool: merge it.
    smallest = int(np.argmin(expected[:-1]))
    counts[smallest] += counts[-1]
    expected[smallest] += expected[-1]
    counts, expected = counts[:-1], expected[:-1]
  expected *= n / expected.sum()
  seen = counts > 0
  stat = float(
    2.0 * np.sum(counts[seen] * np.log(counts[seen] / expected[seen]))
  )
  rests = sum(k[-1] == REST for k in big)
  detail = f'{len(big) - rests} sequences, {rests} prefix rests'
  return _test_check(
    f'enumerated G-test, {label}', n, stat, len(counts) - 1, share, detail
  )


def _test_check(name, n, stat, df, share, detail) -> PairCheck:
  """A statistical check: fails when the p-value is below its share."""
  p = chi2_sf(stat, df)
  return PairCheck(
    name=name,
    passed=p >= share,
    sample_size=n,
    statistic=stat,
    p_value=p,
    false_alarm=share,
    df=df,
    detail=detail,
  )

"""The distribution tests of `verify` (check/pair.py) and their statistics.

Teacher forcing of the target (`Forcer`), the zero-probability check, the
PIT chi-square, the enumerated G-test's partition of all sequences into
cells of exact probability (`partition`, `cell_of`), and the chi-square
tail (`chi2_sf`) that turns a statistic into a p-value. check/pair.py's
docstring says what each test tests and why it is exact.
"""

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spec_decode.check import report as report_lib
from spec_decode.core import sampling


def chi2_sf(statistic: float, df: int) -> float:
  """P(X >= statistic) for X ~ chi-square(df): Q(df / 2, statistic / 2)."""
  if math.isinf(statistic):
    return 0.0
  return float(
    jax.scipy.special.gammaincc(
      jnp.float32(df / 2.0), jnp.float32(max(statistic, 0.0) / 2.0)
    )
  )


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


def zero_check(label, samples, p_x, eos_id) -> report_lib.PairCheck:
  bad = np.flatnonzero(((p_x <= 0) & _real(samples, eos_id)).any(1))
  detail = 'samples of target probability 0'
  if len(bad):
    detail = (
      f'e.g. {samples[bad[0]].tolist()}; a logit near-tie at a top-k/top-p '
      'cut can also do this'
    )
  return report_lib.exact_check(
    f'zero probability, {label}', len(samples), len(bad), detail
  )


def pit_check(
  label, samples, p_x, below, bins, share, rng, alpha, eos_id
) -> report_lib.PairCheck:
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


def g_check(label, samples, partition, share, min_expected, eos_id):
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


def _test_check(name, n, stat, df, share, detail) -> report_lib.PairCheck:
  """A statistical check: fails when the p-value is below its share."""
  p = chi2_sf(stat, df)
  return report_lib.PairCheck(
    name=name,
    passed=p >= share,
    sample_size=n,
    statistic=stat,
    p_value=p,
    false_alarm=share,
    df=df,
    detail=detail,
  )

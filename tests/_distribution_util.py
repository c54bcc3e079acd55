"""Whole-sequence distribution testing: exact probabilities and a G-test.

Method. A tiny target (vocabulary V = 6, EOS = 1) decodes sequences of at
most M = 4 tokens for one input; every possible output (EOS ends a sequence,
pad after it) is enumerated, 1 + 5 + 25 + 125 + 625 = 781 of them, and its
exact probability under the target's sampling distribution is computed by
teacher forcing. N = 24,000 speculative samples (rows of different seeds, in
batches of 4,000 whose rows accept different numbers of tokens) are compared
with it by a G-test: sequences with expected count >= 5 are their own bins,
the rest are pooled into one; degrees of freedom = bins - 1. A test fails
when the p-value is below 1e-3, its false-alarm rate. Any sample the target
gives zero probability fails at once.

Negative control (`ResidualDroppingVerifier`): after a rejection it samples
the target's p instead of the residual norm(max(0, p - q)), a plausible bug
that changes the output distribution; the same test at the same N must
reject it.
"""

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from conftest import tiny_config
from scipy import stats

import spec_decode as sd
from spec_decode.core import rejection
from spec_decode.core import sampling
from spec_decode.models.t5_model import shift_right

V, M, N, BATCH = 6, 4, 24_000, 4_000
FALSE_ALARM = 1e-3
ENC = np.array([[3, 4, 5, 2, 0]], np.int32)


def target_model() -> sd.Model:
  """The tiny target every distribution test samples."""
  return sd.Model.init(tiny_config(vocab_size=V), seed=3)


def all_sequences(vocab_size: int = V, max_len: int = M) -> np.ndarray:
  """Every possible output `[S, max_len]` (pad after EOS; 781 at V, M)."""
  seqs = []
  non_eos = [t for t in range(vocab_size) if t != sd.EOS_ID]
  for length in range(1, max_len + 1):
    grids = np.meshgrid(*([non_eos] * (length - 1)), indexing='ij')
    prefixes = (
      np.stack([g.ravel() for g in grids], 1)
      if grids
      else np.zeros((1, 0), int)
    )
    for pre in prefixes:
      seqs.append(list(pre) + [sd.EOS_ID] + [0] * (max_len - length))
  grids = np.meshgrid(*([non_eos] * max_len), indexing='ij')
  seqs.extend(np.stack([g.ravel() for g in grids], 1).tolist())
  return np.asarray(seqs, np.int32)


def exact_probs(
  model, enc, sampler, vocab_size: int = V, max_len: int = M
) -> tuple[np.ndarray, np.ndarray]:
  """All sequences of at most `max_len` tokens and their exact
  probabilities under `sampler`."""
  seqs = all_sequences(vocab_size, max_len)
  logits = model.logits(np.repeat(enc, len(seqs), 0), shift_right(seqs))
  probs = np.asarray(sampler.probs(logits), np.float64)
  per_token = np.take_along_axis(probs, seqs[..., None], -1)[..., 0]
  is_eos = seqs == sd.EOS_ID
  length = np.where(is_eos.any(1), is_eos.argmax(1) + 1, max_len)
  mask = np.arange(max_len)[None] < length[:, None]
  p = np.prod(np.where(mask, per_token, 1.0), axis=1)
  np.testing.assert_allclose(p.sum(), 1.0, atol=1e-4)
  return seqs, p


def g_test(samples: np.ndarray, seqs: np.ndarray, p: np.ndarray) -> float:
  """p-value of the G-test of `samples [N, M]` against P(seqs) = p."""
  index = {tuple(s): i for i, s in enumerate(seqs)}
  counts = np.zeros(len(seqs))
  for s in map(tuple, samples):
    assert s in index and p[index[s]] > 0, f'impossible sample {s}'
    counts[index[s]] += 1
  expected = len(samples) * p
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  exp = exp * obs.sum() / exp.sum()
  nz = obs > 0
  g = 2.0 * np.sum(obs[nz] * np.log(obs[nz] / exp[nz]))
  return float(stats.chi2.sf(g, len(obs) - 1))


def sample_sequences(
  target, draft, enc, first_seed=0, num=N, carry=None, **kwargs
) -> tuple[np.ndarray, list]:
  """`num` (default N) speculative samples `[num, M]` (seeds from
  `first_seed` on) and the stats of each batch. `carry`, a list: the
  gamma='auto' decodes carry their acceptance estimate from batch to batch
  (`policy.carried`, from the prior), each batch's `gamma_choice` appended
  to the list."""
  out, hists = [], []
  for start in range(0, num, BATCH):
    if carry is not None:
      kwargs['acceptance'] = carry[-1]['acceptance'] if carry else None
    res = sd.generate(
      target,
      np.repeat(enc, BATCH, 0),
      draft=draft,
      max_decode_len=M,
      seed=np.arange(start, start + BATCH) + first_seed,
      **kwargs,
    )
    out.append(res.tokens)
    hists.append(res.stats)
    if carry is not None:
      carry.append(res.gamma_choice)
  return np.concatenate(out), hists


@flax.struct.dataclass(kw_only=True)
class WrappedDrafter:
  """A drafter that passes every call on to `inner`: the negative controls
  subclass it and override the one method they break."""

  inner: Any
  uses_target_features: bool = flax.struct.field(
    pytree_node=False, default=False
  )

  @property
  def vocab_size(self):
    return self.inner.vocab_size

  @property
  def vocabulary(self):
    return self.inner.vocabulary

  def init_draft(self, encoder_tokens, length):
    return self.inner.init_draft(encoder_tokens, length)

  def propose(self, state, context, settings):
    return self.inner.propose(state, context, settings)

  def propose_tree(self, state, context, settings, shape):
    return self.inner.propose_tree(state, context, settings, shape)


@dataclasses.dataclass(frozen=True)
class ResidualDroppingVerifier:
  """Negative control: on rejection, samples p instead of the residual."""

  def __call__(
    self,
    p,
    q,
    draft_tokens,
    uniforms,
    bonus_keys,
    residual_keys,
    greedy=False,
    num_proposed=None,
  ):
    exact = rejection.ExactVerifier()(
      p,
      q,
      draft_tokens,
      uniforms,
      bonus_keys,
      residual_keys,
      greedy,
      num_proposed=num_proposed,
    )
    rows = jnp.arange(p.shape[0])
    wrong = jax.vmap(sampling.sample)(
      residual_keys[rows, exact.accepted], p[rows, exact.accepted]
    )
    num = q.shape[1] if num_proposed is None else num_proposed
    return exact.replace(
      next_token=jnp.where(exact.accepted >= num, exact.next_token, wrong)
    )

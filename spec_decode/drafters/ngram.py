"""An order-n n-gram drafter (the paper's unigram / bigram drafts, Table 3).

`NGram.fit` estimates the model from output token sequences (EOS included;
each sequence's context starts with n - 1 copies of the decoder start id 0).
The distribution of the next token after a context c of n - 1 tokens is
interpolated absolute discounting down to an add-k smoothed unigram:

  q_1(w)     = (count(w) + k) / (N + k V)
  q_j(w | c) = max(count(c, w) - d, 0) / count(c) + b(c) q_{j-1}(w | c')

where c' drops the oldest token of c, and the backoff mass b(c) is what the
discounted entries leave (all of it for an unseen context). Every token has
probability > 0.

Storage scales to T5 vocabularies (V = 32128): a dense V^(n-1) x V table is
impossible, so each order j >= 2 keeps a hash table of H_j buckets (a power
of two, at least `1 / load` times the number of distinct contexts). Contexts
are placed by linear probing, most frequent first, over at most `probes`
buckets; a bucket stores its context's tokens (checked on lookup), its `K`
most frequent continuations with their discounted probabilities, and the
backoff mass, into which the discounted mass of continuations beyond the top
K is folded. A context that found no bucket backs off entirely. So hashing
and truncation only make the draft worse, never inexact: the draft samples
from the q it reports.

`propose` draws G tokens autoregressively, each from the loop's sampler
applied to `log q` as logits (greedy: the argmax, q not materialized). The
draft costs a few gathers and one `[B, V]` pass per order and token (c ~ 0).
Trees (`propose_tree`): every node's k most likely continuations given its
path (greedy), or k draws without replacement from q (sampling).
"""

import os
from typing import Any
from typing import Iterable
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.core import drafter
from spec_decode.core import sampling
from spec_decode.core import tree_draft
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.ids import EOS_ID
from spec_decode.core.ids import PAD_ID

_EMPTY = -1  # Key of an unused bucket (token ids are >= 0).


@flax.struct.dataclass(kw_only=True)
class NGram:
  """An order-n model; the tuples hold one entry per order j = 2..n.

  Attributes:
    unigram: `[V] float32` add-k smoothed unigram probabilities.
    keys: `[H_j, j - 1] int32` context of each bucket (oldest token first;
      `-1` marks an empty bucket).
    ids: `[H_j, K] int32` most frequent continuations of the context.
    probs: `[H_j, K] float32` their discounted probabilities (0 for unused
      entries).
    backoff: `[H_j] float32` mass left for the lower order (1 if empty).
    order: n (static).
    probes: buckets tried per lookup (linear probing; static).
    vocabulary: the target's vocabulary or None (static).
  """

  unigram: jax.Array
  keys: tuple[jax.Array, ...] = ()
  ids: tuple[jax.Array, ...] = ()
  probs: tuple[jax.Array, ...] = ()
  backoff: tuple[jax.Array, ...] = ()
  order: int = flax.struct.field(pytree_node=False, default=1)
  probes: int = flax.struct.field(pytree_node=False, default=4)
  vocabulary: Any = flax.struct.field(pytree_node=False, default=None)

  uses_target_features = False

  @property
  def vocab_size(self) -> int:
    return self.unigram.shape[-1]

  def __repr__(self) -> str:
    sizes = [int(k.shape[0]) for k in self.keys]
    top = int(self.ids[0].shape[1]) if self.ids else 0
    return (
      f'NGram(order={self.order}, vocab_size={self.vocab_size}, '
      f'buckets={sizes}, top_k={top})'
    )

  # -- estimation -------------------------------------------------------------
  @classmethod
  def fit(
    cls,
    sequences: Iterable[Sequence[int]],
    n: int = 2,
    vocab_size: int | None = None,
    discount: float = 0.75,
    add_k: float = 0.1,
    top_k: int = 16,
    load: float = 0.5,
    probes: int = 4,
    eos_id: int = EOS_ID,
    vocabulary: Any = None,
  ) -> 'NGram':
    """Estimates an order-`n` model from output token sequences.

    Args:
      sequences: token id sequences (lists or array rows), EOS included. A
        sequence ends at its first EOS; without one, trailing 0s (padding)
        are dropped.
      n: order: 1 = unigram, 2 = bigram, ...
      vocab_size: V (required).
      discount: d in (0, 1), subtracted from every seen count of order >= 2.
      add_k: k > 0 added to every unigram count.
      top_k: K, continuations stored per context.
      load: contexts per bucket at most, in (0, 1]: H_j is the smallest
        power of two >= (distinct contexts of order j) / load.
      probes: buckets tried per context (linear probing).
      eos_id: end-of-sequence id.
      vocabulary: stored as the drafter's `vocabulary` (checked against the
        target's by `generate`).

    Raises:
      ValueError: a bad argument or a token outside [0, V).
    """
    if vocab_size is None or int(vocab_size) < 2:
      raise ValueError(f'vocab_size must be given (>= 2), got {vocab_size!r}')
    if int(n) < 1:
      raise ValueError(f'n must be >= 1, got {n!r}')
    if not 0.0 < discount < 1.0:
      raise ValueError(f'discount must be in (0, 1), got {discount!r}')
    if add_k <= 0.0:
      raise ValueError(f'add_k must be > 0, got {add_k!r}')
    if top_k < 1 or probes < 1 or not 0.0 < load <= 1.0:
      raise ValueError(
        f'need top_k >= 1, probes >= 1, load in (0, 1]; got {top_k}, '
        f'{probes}, {load}'
      )
    n, v = int(n), int(vocab_size)
    seqs = [_trimmed(s, eos_id) for s in sequences]
    tokens = np.concatenate(seqs) if seqs else np.zeros((0,), np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= v):
      raise ValueError(
        f'token ids must be in [0, {v}), got [{tokens.min()}, {tokens.max()}]'
      )
    counts = np.bincount(tokens, minlength=v).astype(np.float64)
    unigram = (counts + add_k) / (counts.sum() + add_k * v)
    tables = [
      _fit_order(seqs, j, discount, top_k, load, probes)
      for j in range(2, n + 1)
    ]
    return cls(
      unigram=jnp.asarray(unigram, jnp.float32),
      keys=tuple(jnp.asarray(t[0]) for t in tables),
      ids=tuple(jnp.asarray(t[1]) for t in tables),
      probs=tuple(jnp.asarray(t[2]) for t in tables),
      backoff=tuple(jnp.asarray(t[3]) for t in tables),
      order=n,
      probes=int(probes),
      vocabulary=vocabulary,
    )

  # -- the distribution -------------------------------------------------------
  def probs_after(self, context: jax.Array) -> jax.Array:
    """q(. | context): `context [B, n - 1]` (oldest first) -> `[B, V]`.

    Positions before the start of a sequence hold the start id 0.
    """
    batch = context.shape[0]
    q = jnp.broadcast_to(self.unigram, (batch, self.vocab_size))
    rows = jnp.arange(batch)[:, None]
    for i in range(self.order - 1):
      width = i + 1  # Order j = i + 2 reads the newest j - 1 tokens.
      ctx = context[:, context.shape[1] - width :]
      slot, found = self._lookup(i, ctx)
      probs = jnp.where(found[:, None], self.probs[i][slot], 0.0)
      backoff = jnp.where(found, self.backoff[i][slot], 1.0)
      q = (q * backoff[:, None]).at[rows, self.ids[i][slot]].add(probs)
    return q

  def _lookup(self, i: int, ctx: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Bucket `[B]` of order i + 2 holding `ctx [B, i + 1]`, and found `[B]`."""
    keys = self.keys[i]
    mask = keys.shape[0] - 1
    h = _hash(jnp, ctx.astype(jnp.uint32))
    slot = jnp.zeros(ctx.shape[:1], jnp.int32)
    found = jnp.zeros(ctx.shape[:1], bool)
    for r in range(self.probes):
      b = ((h + jnp.uint32(r)) & jnp.uint32(mask)).astype(jnp.int32)
      hit = jnp.all(keys[b] == ctx, axis=-1) & ~found
      slot = jnp.where(hit, b, slot)
      found = found | hit
    return slot, found

  # -- drafter protocol -------------------------------------------------------
  def init_draft(self, encoder_tokens: jax.Array, length: int) -> None:
    """No state: the context is read from the loop's inputs each time."""
    del encoder_tokens, length
    return None

  def propose(
    self, state: None, context: drafter.DraftContext, settings: DecodeSettings
  ) -> tuple[drafter.Proposal, None]:
    """G tokens drawn autoregressively from q (via the loop's sampler)."""
    sampler = settings.sampler
    width = self.order - 1
    n = context.length
    pos = n[:, None] - (width - 1) + jnp.arange(width)[None]
    window = jnp.take_along_axis(context.inputs, jnp.maximum(pos, 0), axis=1)
    window = jnp.where(pos >= 0, window, PAD_ID).astype(jnp.int32)
    tokens, qs = [], []
    for g in range(int(settings.gamma)):
      logits = jnp.log(self.probs_after(window))
      x, q = sampling.draw_tokens(sampler, context.keys[:, g], logits)
      tokens.append(x)
      qs.append(q)
      window = jnp.concatenate([window[:, 1:], x[:, None]], axis=1)
    q = None if sampler.is_greedy else jnp.stack(qs, axis=1)
    return drafter.full_proposal(jnp.stack(tokens, axis=1), q), state

  def propose_tree(
    self,
    state: None,
    context: drafter.DraftContext,
    settings: DecodeSettings,
    shape,
  ) -> tuple[drafter.TreeProposal, None]:
    """The k most likely continuations of every node (greedy), or k draws
    without replacement from q (sampling), given the node's path."""
    width = self.order - 1
    n = context.length
    pos = n[:, None] - (width - 1) + jnp.arange(width)[None]
    window = jnp.take_along_axis(context.inputs, jnp.maximum(pos, 0), axis=1)
    window = jnp.where(pos >= 0, window, PAD_ID).astype(jnp.int32)
    batch = window.shape[0]

    def logits_after(paths):  # [B, T, d] path tokens -> [B, T, V]
      t = paths.shape[1]
      ctx = jnp.concatenate(
        [jnp.broadcast_to(window[:, None], (batch, t, width)), paths], 2
      )[..., paths.shape[2] :]  # The newest `width` tokens.
      q = self.probs_after(ctx.reshape(batch * t, width))
      return jnp.log(q).reshape(batch, t, -1)

    def level_logits(level, tokens, carry):
      return logits_after(level.path_tokens(tokens)), carry

    root = logits_after(jnp.zeros((batch, 1, 0), jnp.int32))[:, 0]
    proposal, _ = tree_draft.expand(
      shape, settings.sampler, root, level_logits, None, context.keys
    )
    return proposal, state

  # -- files ------------------------------------------------------------------
  def save(self, path: str) -> None:
    """Writes the arrays and settings to `path` (.npz; vocabulary not kept)."""
    arrays = {'unigram': np.asarray(self.unigram)}
    for i in range(self.order - 1):
      arrays[f'keys_{i}'] = np.asarray(self.keys[i])
      arrays[f'ids_{i}'] = np.asarray(self.ids[i])
      arrays[f'probs_{i}'] = np.asarray(self.probs[i])
      arrays[f'backoff_{i}'] = np.asarray(self.backoff[i])
    arrays['settings'] = np.asarray([self.order, self.probes], np.int64)
    with open(os.fspath(path), 'wb') as f:
      np.savez(f, **arrays)

  @classmethod
  def load(cls, path: str, vocabulary: Any = None) -> 'NGram':
    """Reads a model written by `save`."""
    with np.load(os.fspath(path)) as data:
      order, probes = (int(x) for x in data['settings'])

      def tup(name):
        return tuple(jnp.asarray(data[f'{name}_{i}']) for i in range(order - 1))

      return cls(
        unigram=jnp.asarray(data['unigram']),
        keys=tup('keys'),
        ids=tup('ids'),
        probs=tup('probs'),
        backoff=tup('backoff'),
        order=order,
        probes=probes,
        vocabulary=vocabulary,
      )


def _hash(xp, ctx):
  """uint32 hash of the last axis of `ctx` (uint32), same in numpy and jnp.

  FNV-1a over the tokens, then the murmur3 finalizer to spread the low bits
  the bucket mask keeps.
  """
  h = xp.full(ctx.shape[:-1], 0x811C9DC5, xp.uint32)
  for t in range(ctx.shape[-1]):
    h = (h ^ ctx[..., t]) * xp.uint32(0x01000193)
  h = h ^ (h >> xp.uint32(16))
  h = h * xp.uint32(0x85EBCA6B)
  h = h ^ (h >> xp.uint32(13))
  h = h * xp.uint32(0xC2B2AE35)
  return h ^ (h >> xp.uint32(16))


def _trimmed(seq: Sequence[int], eos_id: int) -> np.ndarray:
  """The sequence up to its first EOS (inclusive), else without padding."""
  s = np.asarray(seq, np.int64).reshape(-1)
  eos = np.flatnonzero(s == eos_id)
  if eos.size:
    return s[: eos[0] + 1]
  nonpad = np.flatnonzero(s != PAD_ID)
  return s[: nonpad[-1] + 1] if nonpad.size else s[:0]


def _fit_order(seqs, j, discount, top_k, load, probes):
  """Hash table of order j: keys, ids, probs, backoff (numpy)."""
  m = j - 1
  ctxs, nexts = [], []
  for s in seqs:
    if not s.size:
      continue
    padded = np.concatenate([np.full(m, PAD_ID, np.int64), s])
    windows = np.lib.stride_tricks.sliding_window_view(padded[:-1], m)
    ctxs.append(windows)
    nexts.append(s)
  if ctxs:
    ctx = np.concatenate(ctxs)
    nxt = np.concatenate(nexts)
  else:
    ctx = np.zeros((0, m), np.int64)
    nxt = np.zeros((0,), np.int64)
  contexts, ctx_id = np.unique(ctx, axis=0, return_inverse=True)
  ctx_id = ctx_id.reshape(-1)
  num_ctx = len(contexts)
  # Counts of (context, next) pairs, sorted by context, count desc, token.
  pairs, pair_count = np.unique(
    np.stack([ctx_id, nxt], 1), axis=0, return_counts=True
  )
  total = np.bincount(ctx_id, minlength=num_ctx).astype(np.float64)
  order = np.lexsort((pairs[:, 1], -pair_count, pairs[:, 0]))
  pairs, pair_count = pairs[order], pair_count[order]
  first = np.searchsorted(pairs[:, 0], np.arange(num_ctx))
  rank = np.arange(len(pairs)) - first[pairs[:, 0]]
  keep = rank < top_k
  disc = (pair_count - discount) / total[pairs[:, 0]]
  ids = np.zeros((num_ctx, top_k), np.int32)
  probs = np.zeros((num_ctx, top_k), np.float32)
  ids[pairs[keep, 0], rank[keep]] = pairs[keep, 1]
  probs[pairs[keep, 0], rank[keep]] = disc[keep]
  backoff = 1.0 - probs.astype(np.float64).sum(1)
  # Place contexts by linear probing, most frequent first.
  size = 1
  while size * load < max(num_ctx, 1):
    size *= 2
  h = _hash(np, contexts.astype(np.uint32)) if num_ctx else np.zeros(0)
  owner = np.full(size, -1, np.int64)
  pending = np.argsort(-total, kind='stable')
  for r in range(probes):
    if not pending.size:
      break
    b = ((h[pending] + np.uint32(r)) & np.uint32(size - 1)).astype(np.int64)
    free = owner[b] < 0
    cand, cand_b = pending[free], b[free]
    _, win = np.unique(cand_b, return_index=True)  # First = most frequent.
    owner[cand_b[win]] = cand[win]
    placed = np.zeros(num_ctx, bool)
    placed[owner[owner >= 0]] = True
    pending = pending[~placed[pending]]
  used = owner >= 0
  t_keys = np.full((size, m), _EMPTY, np.int32)
  t_ids = np.zeros((size, top_k), np.int32)
  t_probs = np.zeros((size, top_k), np.float32)
  t_backoff = np.ones((size,), np.float32)
  t_keys[used] = contexts[owner[used]]
  t_ids[used] = ids[owner[used]]
  t_probs[used] = probs[owner[used]]
  t_backoff[used] = backoff[owner[used]]
  return t_keys, t_ids, t_probs, t_backoff

"""Prompt lookup: propose what followed an earlier occurrence of the suffix.

The copy heuristic the paper suggests for summarization and chat (section
5), as in prompt-lookup decoding: take the longest suffix (at most
`max_ngram`, at least `min_ngram` tokens) of the output so far, newest token
included, that also occurs earlier in the encoder input (padding 0 ignored)
or in the output itself (not counting the suffix's own position), and
propose the tokens that followed that occurrence: up to G of them, stopping
at the end of the encoder input or of the output so far (an EOS is proposed
like any token). Among matches of the longest length the most recent wins,
reading the encoder input as coming before the output. A row without a
match proposes nothing (`num = 0`), and the verifier draws the target's
token there.

The proposal is deterministic given the prefix, so `q` is one-hot on each
proposed token (None when greedy) and Algorithm 1 stays exact: a token is
accepted with probability p(x). The search is vectorized over rows on
fixed shapes: for each suffix length k it compares the history shifted by
0..k-1 with the suffix, O(B (S + L) max_ngram) per proposal.

Trees (`propose_tree`): the root's children are the first tokens of the
best matches with distinct first tokens (best first), each followed by its
match's continuation; deterministic too, so q is one-hot per node.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.core import drafter
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.ids import PAD_ID


@flax.struct.dataclass(kw_only=True)
class Copy:
  """Prompt-lookup drafter (no weights; every field is static).

  Attributes:
    vocab_size: V, the target's vocabulary size (for the one-hot q).
    max_ngram: longest suffix looked up.
    min_ngram: shortest suffix that counts as a match.
    vocabulary: the target's vocabulary or None.
  """

  vocab_size: int = flax.struct.field(pytree_node=False)
  max_ngram: int = flax.struct.field(pytree_node=False, default=3)
  min_ngram: int = flax.struct.field(pytree_node=False, default=1)
  vocabulary: Any = flax.struct.field(pytree_node=False, default=None)

  uses_target_features = False

  def __post_init__(self):
    if not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(
        'need 1 <= min_ngram <= max_ngram, got '
        f'{self.min_ngram}, {self.max_ngram}'
      )
    if self.vocab_size < 2:
      raise ValueError(f'vocab_size must be >= 2, got {self.vocab_size}')

  def init_draft(self, encoder_tokens: jax.Array, length: int) -> None:
    """No state: the history is read from the loop's inputs each time."""
    del encoder_tokens, length
    return None

  def propose(
    self, state: None, context: drafter.DraftContext, settings: DecodeSettings
  ) -> tuple[drafter.Proposal, None]:
    tokens, num = lookup(
      context.inputs,
      context.length,
      context.encoder_tokens,
      int(settings.gamma),
      self.max_ngram,
      self.min_ngram,
    )
    q = None
    if not settings.sampler.is_greedy:
      q = jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32)
    return drafter.Proposal(tokens=tokens, q=q, num=num), state

  def propose_tree(
    self,
    state: None,
    context: drafter.DraftContext,
    settings: DecodeSettings,
    shape,
  ) -> tuple[drafter.TreeProposal, None]:
    """Several matches: the root's rank-r child starts the continuation of
    the r-th match (`lookup` again, excluding the first tokens of the
    matches before it), which goes on down that child's rank-0 chain.
    Nodes with another rank below depth 1 are not proposed. Static trees
    only: its proposals are point masses, without a confidence to allot
    a dynamic tree's nodes by.

    Raises:
      ValueError: `shape` is a dynamic tree.
    """
    if not hasattr(shape, 'paths'):
      raise ValueError(
        'Copy proposes static trees only (its proposals have no '
        'confidence for a dynamic tree); give tree= a shape'
      )
    depth = shape.depth
    ranks = int((shape.children[0] >= 0).sum())
    conts, nums, firsts = [], [], []
    for _ in range(ranks):
      exclude = jnp.stack(firsts, 1) if firsts else None
      tokens, num = lookup(
        context.inputs,
        context.length,
        context.encoder_tokens,
        depth,
        self.max_ngram,
        self.min_ngram,
        exclude=exclude,
      )
      conts.append(tokens)
      nums.append(num)
      # A rank without a match excludes nothing (-1 is never a token).
      firsts.append(jnp.where(num > 0, tokens[:, 0], -1))
    conts = jnp.stack(conts, 1)  # [B, R, D]
    nums = jnp.stack(nums, 1)  # [B, R]
    paths = shape.paths
    match = np.asarray([p[0] for p in paths])
    on_chain = np.asarray([not any(p[1:]) for p in paths])
    step = np.asarray([len(p) - 1 for p in paths])
    tokens = conts[:, match, step]
    valid = on_chain[None] & (step[None] < nums[:, match])
    tokens = jnp.where(valid, tokens, PAD_ID)
    q = None
    if not settings.sampler.is_greedy:
      q = jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32)
    return drafter.TreeProposal(tokens=tokens, q=q, valid=valid), state


def lookup(
  inputs: jax.Array,
  length: jax.Array,
  encoder_tokens: jax.Array,
  gamma: int,
  max_ngram: int,
  min_ngram: int = 1,
  exclude: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """The prompt-lookup proposal (see the module docstring).

  Args:
    inputs: `[B, L] int32` decoder inputs (`inputs[:, k]` = output token k,
      `inputs[:, 0]` the start id; entries past `length` are ignored).
    length: `[B] int32` n, output tokens so far.
    encoder_tokens: `[B, S] int32` (0 = padding, never matched or copied).
    gamma: G, tokens proposed at most.
    max_ngram: longest suffix looked up.
    min_ngram: shortest suffix that counts.
    exclude: optional `[B, E] int32`: matches whose first proposed token is
      one of these are skipped (the next-best match is taken; token trees).

  Returns:
    tokens `[B, G] int32` (0 past `num`) and num `[B] int32` in [0, G].
  """
  enc = encoder_tokens.astype(jnp.int32)
  s = enc.shape[1]
  # History: the encoder input, then output tokens 1..L-1.
  hist = jnp.concatenate([enc, inputs[:, 1:].astype(jnp.int32)], axis=1)
  p = hist.shape[1]
  pos = jnp.arange(p)[None]
  out_valid = jnp.arange(1, inputs.shape[1])[None] <= length[:, None]
  valid = jnp.concatenate([enc != PAD_ID, out_valid], axis=1)
  # Runs of valid positions never cross from the encoder into the output.
  bad = jnp.where(valid, -1, pos)
  last_bad = jax.lax.cummax(bad, axis=1)
  last_bad = jnp.where(pos >= s, jnp.maximum(last_bad, s - 1), last_bad)
  run = pos - last_bad  # Valid tokens ending at each position (0: invalid).
  next_bad = jax.lax.cummin(jnp.where(valid, p, pos), axis=1, reverse=True)
  next_bad = jnp.where(pos < s, jnp.minimum(next_bad, s), next_bad)
  follow = next_bad - pos - 1  # Tokens after each position in its run.

  if exclude is not None:
    after = jnp.concatenate([hist[:, 1:], jnp.full_like(hist[:, :1], -1)], 1)
    banned = jnp.any(after[:, :, None] == exclude[:, None, :], axis=2)
  offsets = jnp.arange(max_ngram)
  suffix = jnp.take_along_axis(
    inputs, jnp.maximum(length[:, None] - offsets[None], 0), axis=1
  )  # suffix[:, t] = output token n - t.
  best = jnp.full(length.shape, -1, jnp.int32)
  match = jnp.ones(hist.shape, bool)
  for k in range(1, max_ngram + 1):
    t = k - 1
    shifted = jnp.pad(hist[:, : p - t], ((0, 0), (t, 0)), constant_values=-1)
    match = match & (shifted == suffix[:, t : t + 1])
    if k < min_ngram:
      continue
    ok = match & (run >= k) & (follow >= 1) & (length[:, None] >= k)
    if exclude is not None:
      ok &= ~banned
    best = jnp.maximum(best, jnp.max(jnp.where(ok, k * p + pos, -1), axis=1))
  found = best >= 0
  end = jnp.where(found, best % p, 0)  # Last position of the match.
  avail = jnp.take_along_axis(follow, end[:, None], axis=1)[:, 0]
  num = jnp.where(found, jnp.minimum(avail, gamma), 0).astype(jnp.int32)
  take = jnp.minimum(end[:, None] + 1 + jnp.arange(gamma)[None], p - 1)
  tokens = jnp.take_along_axis(hist, take, axis=1)
  tokens = jnp.where(jnp.arange(gamma)[None] < num[:, None], tokens, PAD_ID)
  return tokens.astype(jnp.int32), num

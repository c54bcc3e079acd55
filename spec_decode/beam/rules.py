"""Beam search's step rule and stop rule, T5X's, without a model.

The rules take the log-probabilities the model gave the live beams and
return the next beams; they never call a model, so a loop can apply them to
log-probabilities from any source (one target call per step in plain beam
search; a scored token tree, several steps per call, in speculative beam
search). `docs/decoding.md` states the rules in words.

They reproduce `t5x.decoding.beam_search` at T5X revision 03d3e28
(2023-07-25; its beam search is the same through 870d069, 2023-09-27)
operation for operation (the same float32 arithmetic, the brevity penalty
of one scalar length per step included, the same -1e7 mask, the same tie
order of `lax.top_k`), with one change: every batch row has its own step
counter and stops on its own (see `stopped`). Later T5X revisions raise a
per-row length array to the power alpha (34f1e74, for prompts), which can
differ by an ulp, and stop when no live beam beats `min_log_prob`
(0a56776); neither is mirrored. Beams are kept in T5X's order, worst first
(best last); `outputs` returns them best first.

Shapes: `B` rows, `K` beams, `V` vocabulary, `M` = max_decode_len.
Sequences hold `M + 1` positions: position 0 is the start id 0 and position
`t >= 1` is output token `t`.
"""

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

# T5X's mask value (`t5x.decoding.NEG_INF`): added to a candidate's log-prob to
# keep it out of a set, and the score of an empty finished slot.
NEG_INF = -1.0e7


def brevity_penalty(alpha: float, length) -> jax.Array:
  """`((5 + length) / 6) ** alpha`, float32, for one length (a Python int or
  a 0-d array), as T5X computes it."""
  return jnp.power((5.0 + length) / 6.0, alpha)


def penalized(alpha: float, log_probs: jax.Array, lengths: jax.Array):
  """`log_probs [B, N]` over the brevity penalty of each row's length
  `lengths [B]`, as T5X computes it for its one length per step.

  T5X divides by the penalty of one scalar length; XLA computes that (and
  may rewrite `x / y ** a` as `x * y ** -a`) differently from the power of
  a `[B, 1]` array, by an ulp or two (at alpha 2 the array power of length
  1 is 1.0 where the scalar's is 1.0000001), which can flip an exact tie in
  the finished set. So each row is divided by its own scalar's penalty in
  the same expression (`lax.map`: one small division per row and step).
  """
  return lax.map(
    lambda row: row[0] / brevity_penalty(alpha, row[1]), (log_probs, lengths)
  )


@flax.struct.dataclass(kw_only=True)
class Beams:
  """The beams of every row (no model state).

  Attributes:
    step: `[B] int32` steps taken: tokens in each live sequence (T5X's
      `cur_index`, per row).
    live_seqs: `[B, K, M + 1] int32` live (unfinished) sequences, worst
      first; zeros past position `step`.
    live_logprobs: `[B, K] float32` their total log-probabilities (-1e7 for
      the K - 1 placeholder beams before the first step).
    finished_seqs: `[B, K, M + 1] int32` finished sequences (ending in EOS,
      zeros after it), worst first.
    finished_scores: `[B, K] float32` their scores: log-probability over the
      brevity penalty of their length; -1e7 in empty slots.
    finished_flags: `[B, K] bool` which finished slots hold a sequence.
  """

  step: jax.Array
  live_seqs: jax.Array
  live_logprobs: jax.Array
  finished_seqs: jax.Array
  finished_scores: jax.Array
  finished_flags: jax.Array

  @classmethod
  def init(cls, batch: int, num_beams: int, max_decode_len: int) -> 'Beams':
    """One live beam per row (the empty sequence), K - 1 placeholders."""
    shape = (batch, num_beams)
    seqs = jnp.zeros(shape + (max_decode_len + 1,), jnp.int32)
    first = jnp.array([0.0] + [NEG_INF] * (num_beams - 1), jnp.float32)
    return cls(
      step=jnp.zeros((batch,), jnp.int32),
      live_seqs=seqs,
      live_logprobs=jnp.tile(first, (batch, 1)),
      finished_seqs=seqs,
      finished_scores=jnp.full(shape, NEG_INF, jnp.float32),
      finished_flags=jnp.zeros(shape, bool),
    )

  @property
  def num_beams(self) -> int:
    return self.live_logprobs.shape[1]

  @property
  def max_decode_len(self) -> int:
    return self.live_seqs.shape[2] - 1

  def last_tokens(self) -> jax.Array:
    """`[B, K]`: each live beam's newest token (the start id at step 0)."""
    return jnp.take_along_axis(
      self.live_seqs, self.step[:, None, None], axis=2
    )[..., 0]


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
  """`x[b, idx[b, j], ...]`: `x [B, N, ...]`, `idx [B, J]` -> `[B, J, ...]`."""
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


def _top(values: jax.Array, k: int) -> jax.Array:
  """Indices of the k largest along axis 1, in increasing order (T5X's
  `lax.top_k` then flip: ties keep the lower index on the better side)."""
  return jnp.flip(lax.top_k(values, k)[1], axis=1)


def step(
  beams: Beams,
  log_probs: jax.Array,
  alpha: float,
  eos_id: int,
  active: jax.Array,
) -> tuple[Beams, jax.Array]:
  """One beam-search step of every active row.

  Args:
    beams: the current beams.
    log_probs: `[B, K, V] float32` log p(next token | live beam).
    alpha: brevity-penalty exponent.
    eos_id: end-of-sequence id.
    active: `[B] bool` rows that take the step; the others are returned
      unchanged.

  Returns:
    The new beams, and `parents [B, K] int32`: new live beam j of row b
    extends old live beam `parents[b, j]` (the identity in inactive rows),
    the order in which a model's per-beam state must be reordered.
  """
  batch, k, vocab = log_probs.shape
  # Every extension of every live beam; the 2K best (K of them can end in
  # EOS, so K unfinished ones always remain).
  candidates = log_probs + beams.live_logprobs[:, :, None]
  top_logprobs, top_index = lax.top_k(
    candidates.reshape(batch, k * vocab), 2 * k
  )
  top_ids = top_index % vocab
  top_parents = top_index // vocab
  pos = beams.step + 1
  positions = jnp.arange(beams.live_seqs.shape[2])[None, None, :]
  top_seqs = jnp.where(
    positions == pos[:, None, None],
    top_ids[:, :, None],
    _take(beams.live_seqs, top_parents),
  )
  newly_finished = top_ids == eos_id

  # Live: the K best of the 2K that did not end in EOS.
  alive_logprobs = top_logprobs + newly_finished * jnp.float32(NEG_INF)
  alive = _top(alive_logprobs, k)
  live_seqs = _take(top_seqs, alive)
  live_logprobs = _take(alive_logprobs, alive)
  parents = _take(top_parents, alive)

  # Finished: the K best of the old finished set and the 2K new ones that
  # ended in EOS, scored with the brevity penalty of their length.
  scores = penalized(alpha, top_logprobs, pos)
  scores += (~newly_finished) * jnp.float32(NEG_INF)
  all_seqs = jnp.concatenate([beams.finished_seqs, top_seqs], axis=1)
  all_scores = jnp.concatenate([beams.finished_scores, scores], axis=1)
  all_flags = jnp.concatenate([beams.finished_flags, newly_finished], axis=1)
  best = _top(all_scores, k)

  def keep(new, old):
    mask = active.reshape((batch,) + (1,) * (new.ndim - 1))
    return jnp.where(mask, new, old)

  new = Beams(
    step=pos,
    live_seqs=live_seqs,
    live_logprobs=live_logprobs,
    finished_seqs=_take(all_seqs, best),
    finished_scores=_take(all_scores, best),
    finished_flags=_take(all_flags, best),
  )
  new = jax.tree.map(keep, new, beams)
  parents = keep(parents, jnp.broadcast_to(jnp.arange(k), (batch, k)))
  return new, parents


def stopped(beams: Beams, alpha: float) -> jax.Array:
  """`[B] bool`: rows that take no more steps (T5X's loop condition).

  A row stops when it has taken M steps, or when every finished slot is
  full and the worst finished score beats the best live beam's
  log-probability over the largest brevity penalty (no live beam can still
  enter the finished set). T5X evaluates these for the whole batch and
  stops when all rows meet them; here each row stops on its own, which
  gives the same beams (a stopped row's finished set can no longer change)
  except in rows whose live beams all carry the -1e7 mask, where T5X's
  result depends on the batch mates. (T5X's later `min_log_prob` stop,
  added after the revision mirrored here, is not part of it: module
  docstring.)
  """
  m = beams.max_decode_len
  # T5X computes this penalty after adding its start position to M.
  min_penalty = brevity_penalty(alpha, m + 1)
  best_live = beams.live_logprobs[:, -1:] / min_penalty
  worst_finished = jnp.min(beams.finished_scores, axis=1, keepdims=True)
  worst_finished = jnp.where(beams.finished_flags, worst_finished, NEG_INF)
  cannot_improve = jnp.all(worst_finished > best_live, axis=1)
  return (beams.step >= m) | cannot_improve


def outputs(
  beams: Beams, eos_id: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Tokens `[B, K, M]`, scores `[B, K]` and lengths `[B, K]`, best first.

  A row with a finished sequence returns its finished set (empty slots: no
  tokens, score -1e7, length 0); a row without one returns its live beams
  and their log-probabilities (length: the steps taken), as T5X does.
  Lengths count output tokens including EOS.
  """
  any_finished = jnp.any(beams.finished_flags, axis=1)
  seqs = jnp.where(
    any_finished[:, None, None], beams.finished_seqs, beams.live_seqs
  )[:, :, 1:]
  scores = jnp.where(
    any_finished[:, None], beams.finished_scores, beams.live_logprobs
  )
  # A finished sequence's only EOS is its last token (live beams never
  # hold EOS).
  eos_length = jnp.argmax(seqs == eos_id, axis=2) + 1
  lengths = jnp.where(
    any_finished[:, None],
    jnp.where(beams.finished_flags, eos_length, 0),
    beams.step[:, None],
  )
  flip = lambda x: jnp.flip(x, axis=1)  # noqa: E731
  return flip(seqs), flip(scores), flip(lengths).astype(jnp.int32)

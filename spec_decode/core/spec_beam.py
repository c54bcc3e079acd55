"""Exact speculative beam search: one jitted `lax.while_loop`.

Plain beam search (`beam_search.beam_decode`) calls the target once per
step. Here each iteration of a row with live beams at step n:

  1. the draft catches up on the inputs the row committed in the previous
     iteration and runs its own beam search (W >= K beams) gamma steps
     ahead from the row's K live beams (`beam_rules.step` on the draft's
     log-probs, starting from the target's live log-probs);
  2. the union of the draft's live beams at steps n + 1 .. n + gamma is a
     forest over the K current beams: draft beam i of step n + d is node
     `1 + (d - 1) * W + i`, a child of the draft beam of step n + d - 1 it
     extends. Every model row (b, j) scores node 0 (its own newest token)
     and all W * gamma nodes in ONE `score_tree` call, with a per-row
     ancestor mask (`RowTreeAttention`); a node whose root is another beam
     is scored too but never read;
  3. plain beam search's step rule is replayed on the target's log-probs:
     step n + 1 reads every live beam's root, and step n + d + 1 can be
     replayed while every live beam (each one the target selected) is a
     draft node at depth d. The first step that needs a beam the draft did
     not propose ends the row's iteration, so 1 .. gamma + 1 steps are
     committed per target call;
  4. the target's rows are reordered to the new beams' roots and each new
     beam's path (the nodes its replayed steps read) is committed
     (`commit_tree`).

Every replayed step is `beam_rules.step` on the target's own log-probs of
the beams it expands, so the beams are plain beam search's: the draft
decides only how many steps one target call covers. Only floating-point
rounding differs (a tree call scores a node among T tokens, plain beam
search one token), which can flip an exact near-tie.

Shapes: `B` rows, `K` beams, `W` draft beams, `V` vocabulary, `M` =
max_decode_len, `G` = gamma, `T = 1 + W * G` tokens per model row in a
target call.
"""

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spec_decode.core import beam_rules
from spec_decode.core.protocol import DecodeState


def reorder_rows(lm: Any, state: DecodeState, rows: jax.Array) -> DecodeState:
  """Row i of the result is row `rows[i]` of `state` (`rows [N] int32`).

  Uses the model's `reorder_beams` when it has one (`protocol.BeamReorder`:
  e.g. a T5 `Model` moves only its self-attention cache), else gathers
  every leaf of the state (the protocol gives each a leading batch axis).
  """
  reorder = getattr(lm, 'reorder_beams', None)
  if reorder is not None:
    return reorder(state, rows)
  return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), state)


@dataclasses.dataclass(frozen=True, eq=False)
class RowTreeAttention:
  """A tree call whose ancestor mask differs per model row.

  Duck-types `core.tree.TreeAttention` for `t5.cache.tree_layout`: the
  positions are static (a node's depth), the mask is a traced array.

  Attributes:
    positions: `[T]` each node's depth (its position relative to the index).
    mask: `[R, T, T] bool` per model row: node t attends to node u.
  """

  positions: tuple[int, ...]
  mask: jax.Array
  offset: int = 0

  @property
  def num_new(self) -> int:
    return len(self.positions)

  def new_positions(self) -> np.ndarray:
    return np.asarray(self.positions, np.int32)

  def mask_array(self) -> jax.Array:
    return self.mask


@flax.struct.dataclass(kw_only=True)
class SpecBeamState:
  """Carry of the speculative beam-search loop.

  Attributes:
    beams: `beam_rules.Beams` of every row.
    done: `[B] bool` rows that have stopped.
    target: the target's state, `B * K` rows (row b * K + j: live beam j),
      index = the row's step.
    draft: the draft's state, `B * K` rows, index = `start` (it holds the
      beam's inputs before `start`).
    start: `[B] int32` first input of each beam the draft has not fed yet.
    calls: `[B] int32` target calls while the row was active.
    histogram: `[B, G + 1] int32` calls that committed 1 + a steps, a = 0..G
      (a: the draft depths the call covered, the analogue of accepted
      draft tokens).
    depth_tries: `[B, G] int32` calls that checked draft depth d + 1 (a
      call that stops the row checks no further depth); the calls that
      covered it are `histogram[:, d + 1:].sum(1)`.
  """

  beams: beam_rules.Beams
  done: jax.Array
  target: DecodeState
  draft: DecodeState
  start: jax.Array
  calls: jax.Array
  histogram: jax.Array
  depth_tries: jax.Array


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
  """`x[b, idx[b, j], ...]` for `x [B, N, ...]`, `idx [B, J]`."""
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


def _pad_seqs(beams: beam_rules.Beams, extra: int) -> beam_rules.Beams:
  """The beams with `extra` more zero positions (the draft looks ahead)."""
  pad = ((0, 0), (0, 0), (0, extra))
  return beams.replace(
    live_seqs=jnp.pad(beams.live_seqs, pad),
    finished_seqs=jnp.pad(beams.finished_seqs, pad),
  )


def _widen(x: jax.Array, extra: int, fill=None) -> jax.Array:
  """`x [B, K, ...]` with `extra` more entries on axis 1: copies of entry
  0, or `fill`."""
  more = jnp.repeat(x[:, :1], extra, axis=1)
  if fill is not None:
    more = jnp.full_like(more, fill)
  return jnp.concatenate([x, more], axis=1)


def _draft_expand(draft, state, start, beams, done, settings, gamma, width):
  """The draft's own beam search, gamma steps from the target's beams.

  The draft keeps `width` W >= K beams: the target's K live beams and
  W - K placeholders (log-prob -1e7) to start with, so that each depth
  proposes W sequences (more chances to hold the target's K).

  Returns:
    tokens and parents, `[G, B, W] int32`: draft beam i of depth d + 1 is
    `parents[d, b, i]` of depth d (depth 0: the target's beams, i < K)
    extended by `tokens[d, b, i]`; and the draft state (K rows per batch
    row) rolled back to each beam's step (for the next iteration).
  """
  batch, k = beams.live_logprobs.shape
  extra = width - k
  chunk_len = gamma + 2
  step = beams.step
  padded = _pad_seqs(beams, chunk_len)
  # Catch up: inputs start .. step (this iteration's roots) and padding.
  chunk = jax.vmap(
    lambda seqs, s: lax.dynamic_slice_in_dim(seqs, s, chunk_len, axis=1)
  )(padded.live_seqs, start)
  ds = draft.rollback(state, jnp.repeat(start, k))
  logits, ds = draft.score(ds, chunk.reshape(batch * k, chunk_len))
  logits = logits.reshape(batch, k, chunk_len, -1)
  root = jnp.take_along_axis(
    logits, (step - start)[:, None, None, None], axis=2
  )[:, :, 0]
  kept = draft.rollback(ds, jnp.repeat(step, k))
  ds = draft.rollback(ds, jnp.repeat(step + 1, k))
  log_probs = _widen(jax.nn.log_softmax(root, axis=-1), extra)
  dbeams = beam_rules.Beams(
    step=step,
    live_seqs=_widen(padded.live_seqs, extra),
    live_logprobs=_widen(beams.live_logprobs, extra, beam_rules.NEG_INF),
    finished_seqs=_widen(padded.finished_seqs, extra, 0),
    finished_scores=_widen(beams.finished_scores, extra, beam_rules.NEG_INF),
    finished_flags=_widen(beams.finished_flags, extra, False),
  )
  if extra:
    # Placeholders start from beam 0's cache (any beam's would do).
    own = jnp.arange(width)
    rows = jnp.where(own < k, own, 0)
    rows = (jnp.arange(batch)[:, None] * k + rows[None]).reshape(-1)
    # Every leaf (the row count changes; `reorder_beams` keeps some).
    ds = jax.tree.map(lambda x: jnp.take(x, rows, axis=0), ds)
  group = jnp.arange(batch, dtype=jnp.int32)[:, None] * width
  alpha, eos = settings.alpha, settings.eos_id

  def expand(dbeams, log_probs):
    dbeams, par = beam_rules.step(dbeams, log_probs, alpha, eos, ~done)
    return dbeams, par, dbeams.last_tokens()

  def one_step(carry, _):
    # A rolled loop: its body compiles once whatever gamma is.
    dbeams, ds, log_probs = carry
    dbeams, par, tok = expand(dbeams, log_probs)
    ds = reorder_rows(draft, ds, (group + par).reshape(-1))
    logits, ds = draft.score(ds, tok.reshape(batch * width, 1))
    log_probs = jax.nn.log_softmax(logits[:, 0], axis=-1)
    return (dbeams, ds, log_probs.reshape(batch, width, -1)), (tok, par)

  (dbeams, _, log_probs), (tokens, parents) = lax.scan(
    one_step, (dbeams, ds, log_probs), length=gamma - 1
  )
  _, par, tok = expand(dbeams, log_probs)
  tokens = jnp.concatenate([tokens, tok[None]], axis=0)
  parents = jnp.concatenate([parents, par[None]], axis=0)
  return tokens, parents, kept


def _forest_mask(parents: jax.Array) -> jax.Array:
  """`[B, T, T] bool` ancestor-or-self mask of the draft's forest.

  Node 0 stands for every model row's own root; node `1 + d * W + i` is
  draft beam i of depth d + 1 (`parents [G, B, W]`, as `_draft_expand`).
  """
  _, batch, k = parents.shape
  size = 1 + k * len(parents)
  root = jax.nn.one_hot(0, size, dtype=bool)
  rows = [jnp.broadcast_to(root, (batch, 1, size))]
  prev = jnp.broadcast_to(root, (batch, k, size))
  for d, par in enumerate(parents):
    own = jax.nn.one_hot(1 + d * k + jnp.arange(k), size, dtype=bool)
    prev = _take(prev, par) | own[None]
    rows.append(prev)
  return jnp.concatenate(rows, axis=1)


@flax.struct.dataclass(kw_only=True)
class _Replay:
  """Carry of the replay loop (`[B, K]` per beam unless stated).

  Attributes:
    depth: `[]` tree depth of the step being replayed.
    beams: the target's beams.
    done: `[B]` rows that have stopped.
    replaying: `[B]` rows whose next step is covered.
    origin: the root (beam at the iteration's start) each beam descends from.
    dbeam: each beam's draft beam index at `depth` (its origin at 0).
    path: `[B, K, G + 1]` the nodes each beam's replayed steps read.
    count: `[B]` steps replayed.
    tried: `[B, G]` draft depth d + 1 was checked: the row had not stopped
      after replaying the step that needs it.
  """

  depth: jax.Array
  beams: beam_rules.Beams
  done: jax.Array
  replaying: jax.Array
  origin: jax.Array
  dbeam: jax.Array
  path: jax.Array
  count: jax.Array
  tried: jax.Array


def _replay(beams, done, logits, tokens, parents, settings):
  """Plain beam search's steps on the target's tree log-probs.

  Step `depth` reads each live beam's node at that depth of its origin's
  tree (`logits [B, K, T, V]`: model row of the origin, node slot); a row
  goes on while every beam it selects is a draft node one level deeper.

  Returns:
    beams, done, origin `[B, K]`, path `[B, K, G + 1]`, count `[B]` and
    tried `[B, G]` (depths checked; the first count - 1 were covered).
  """
  batch, k = beams.live_logprobs.shape
  g, _, w = tokens.shape
  bidx = jnp.arange(batch)[:, None]
  cols = jnp.arange(g + 1)

  def body(r: _Replay) -> _Replay:
    d = r.depth
    slot = jnp.where(d == 0, 0, 1 + (d - 1) * w + r.dbeam)
    log_probs = jax.nn.log_softmax(logits[bidx, r.origin, slot], axis=-1)
    new, par = beam_rules.step(
      r.beams, log_probs, settings.alpha, settings.eos_id, r.replaying
    )
    # The new beam (parent p, token t) is draft beam i of depth d + 1 when
    # i extends p's draft beam by t.
    level = jnp.minimum(d, g - 1)
    match = (parents[level][:, None, :] == _take(r.dbeam, par)[:, :, None]) & (
      tokens[level][:, None, :] == new.last_tokens()[:, :, None]
    )
    covered = jnp.any(match, axis=2) & (d < g)
    sel = r.replaying[:, None]
    path = jnp.where(
      cols == d, _take(slot, par)[:, :, None], _take(r.path, par)
    )
    done = r.done | (beam_rules.stopped(new, settings.alpha) & r.replaying)
    checked = r.replaying & ~done & (d < g)
    return _Replay(
      depth=d + 1,
      beams=new,
      done=done,
      replaying=r.replaying & jnp.all(covered, axis=1) & ~done,
      origin=jnp.where(sel, _take(r.origin, par), r.origin),
      dbeam=jnp.where(sel, jnp.argmax(match, axis=2), r.dbeam),
      path=jnp.where(sel[:, :, None], path, r.path),
      count=r.count + r.replaying.astype(jnp.int32),
      tried=r.tried | (checked[:, None] & (cols[None, :g] == d)),
    )

  arange = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (batch, k))
  r = _Replay(
    depth=jnp.zeros((), jnp.int32),
    beams=beams,
    done=done,
    replaying=~done,
    origin=arange,
    dbeam=arange,
    path=jnp.zeros((batch, k, g + 1), jnp.int32),
    count=jnp.zeros((batch,), jnp.int32),
    tried=jnp.zeros((batch, g), bool),
  )
  r = lax.while_loop(lambda r: jnp.any(r.replaying), body, r)
  return r.beams, r.done, r.origin, r.path, r.count, r.tried


def spec_beam_decode(
  target,
  draft,
  encoder_tokens: jax.Array,
  settings: Any,
  gamma: int,
  width: int,
):
  """Speculative beam search over `encoder_tokens [B, S]` (module doc).

  Args:
    target: a `protocol.TreeLanguageModel`.
    draft: a `protocol.LanguageModel` with the target's vocabulary.
    encoder_tokens: `[B, S] int32`.
    settings: `beam_search.BeamSettings` (static).
    gamma: G >= 1 draft steps per iteration (static).
    width: W >= K beams of the draft's beam search (static).

  Returns:
    tokens `[B, K, M]`, scores `[B, K]`, lengths `[B, K]` (best first),
    steps `[B]`, target calls `[B]`, the histogram `[B, G + 1]` of steps
    per call and the depth tries `[B, G]` (`SpecBeamState`).
  """
  batch = encoder_tokens.shape[0]
  k, g = settings.num_beams, gamma
  m = settings.max_decode_len
  w = width
  size = 1 + w * g
  group = jnp.arange(batch, dtype=jnp.int32)[:, None] * k
  depths = (0,) + tuple(1 + d for d in range(g) for _ in range(w))

  def repeat(state):
    return jax.tree.map(lambda x: jnp.repeat(x, k, axis=0), state)

  def body(s: SpecBeamState) -> SpecBeamState:
    b = s.beams
    step = b.step
    tokens, parents, draft_kept = _draft_expand(
      draft, s.draft, s.start, b, s.done, settings, g, w
    )
    nodes = jnp.concatenate(
      [
        b.last_tokens()[:, :, None],
        jnp.broadcast_to(
          jnp.moveaxis(tokens, 0, 1).reshape(batch, 1, w * g),
          (batch, k, w * g),
        ),
      ],
      axis=2,
    )
    attention = RowTreeAttention(
      positions=depths, mask=jnp.repeat(_forest_mask(parents), k, axis=0)
    )
    tgt = target.rollback(s.target, jnp.repeat(step, k))
    logits, tgt = target.score_tree(
      tgt, nodes.reshape(batch * k, size), attention
    )
    logits = logits.reshape(batch, k, size, -1)

    b, done, origin, path, count, tried = _replay(
      b, s.done, logits, tokens, parents, settings
    )
    active = (~s.done).astype(jnp.int32)
    rows = (group + origin).reshape(-1)
    tgt = reorder_rows(target, tgt, rows)
    tgt = target.commit_tree(
      tgt, path.reshape(batch * k, g + 1), jnp.repeat(count, k)
    )
    return SpecBeamState(
      beams=b,
      done=done,
      target=tgt,
      draft=reorder_rows(draft, draft_kept, rows),
      start=step,
      calls=s.calls + active,
      histogram=s.histogram
      + jax.nn.one_hot(count - 1, g + 1, dtype=jnp.int32) * active[:, None],
      depth_tries=s.depth_tries + tried.astype(jnp.int32),
    )

  beams = beam_rules.Beams.init(batch, k, m)
  s = SpecBeamState(
    beams=beams,
    done=beam_rules.stopped(beams, settings.alpha),
    target=repeat(target.init_state(encoder_tokens, m + size + 1)),
    draft=repeat(draft.init_state(encoder_tokens, m + g + 3)),
    start=jnp.zeros((batch,), jnp.int32),
    calls=jnp.zeros((batch,), jnp.int32),
    histogram=jnp.zeros((batch, g + 1), jnp.int32),
    depth_tries=jnp.zeros((batch, g), jnp.int32),
  )
  s = lax.while_loop(lambda s: jnp.any(~s.done), body, s)
  tokens, scores, lengths = beam_rules.outputs(s.beams, settings.eos_id)
  return (
    tokens,
    scores,
    lengths,
    s.beams.step,
    s.calls,
    s.histogram,
    s.depth_tries,
  )


spec_beam_decode_jit = jax.jit(
  spec_beam_decode, static_argnames=('settings', 'gamma', 'width')
)

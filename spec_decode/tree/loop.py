"""The tree loop: a drafted token tree, one target call over all its nodes.

One jitted `lax.while_loop`, like the chain loops (`chain/`), with the
same token buffer, per-row keys and statistics. Shapes: `B` rows, `N` tree
nodes, `D` tree depth, `M` max_decode_len, `V` vocabulary.

Per iteration, for a row with n output tokens:
  1. the drafter proposes the tree's N nodes (`Drafter.propose_tree`);
  2. the target scores the root (input n, the newest token) and the N
     nodes in ONE call (`TreeLanguageModel.score_tree`): scratch cache slots
     n..n+N, each node at position n + depth, attending to the committed
     inputs and its ancestors;
  3. `tree.verification` accepts a path of a <= D nodes per row and draws
     the next token (greedy: the target's argmax; sampling: recursive
     rejection);
  4. the target commits the root and the accepted path (their keys and
     values move to slots n..n+a, `commit_tree`); the rest is scratch that
     the next iteration overwrites.

Cache length: the models' states hold M + N + 2 inputs (n + N + 1 slots
are written while n < M). `start` can size them (and the token buffer) for
a larger tree than the first one, so that a decode goes on from its state
with another tree (`iterate` stops at a run-time iteration count):
tree='auto' calibrates on its first iterations that way (`tree.auto`).

Going on with a shallower tree: a drafter may assume that the previous
iteration accepted no more tokens than the current tree is deep unless the
loop says otherwise (`core.drafter.accepted_bound`); model drafts re-feed,
early exits copy only that many + 1 inputs. The state remembers the
deepest tree it ran (`TreeLoopState.deepest`, static), and the first
iteration of `iterate` with a shallower tree passes that depth
(`DraftContext.max_accepted`) so that every drafter re-synchronises with
the committed prefix; it runs in a loop of its own (one more compiled
iteration), the others as before.
"""

import functools

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.core import buffer
from spec_decode.core import counters as counters_lib
from spec_decode.core import drafter
from spec_decode.core import model_drafter
from spec_decode.core import provenance as provenance_lib
from spec_decode.core import sampling
from spec_decode.core import verified_block
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.ids import PAD_ID
from spec_decode.core.tree_shape import TreeShape
from spec_decode.tree import verification as tree_verification


@flax.struct.dataclass(kw_only=True)
class TreeCounters:
  """Per-row statistics of a tree decode (all `[B, ...]`).

  Attributes:
    iterations: `[B]` iterations (= target calls) while the row was active.
    accepted_histogram: `[B, D + 1]` iterations that output 0..D accepted
      tokens (none accepted beyond the row's end, `core.counters`).
    position_tries: `[B, D]` iterations that tested a node at depth d + 1.
    position_accepts: `[B, D]` iterations that accepted one there.
    beta_sum: `[B]` sum over tested depths of the rank-0 child's beta.
    proposed: `[B]` nodes proposed (valid) while the row was active.
    node_tries: `[B, N]` iterations that tested node i + 1.
    node_accepts: `[B, N]` iterations that accepted node i + 1.
  """

  iterations: jax.Array
  accepted_histogram: jax.Array
  position_tries: jax.Array
  position_accepts: jax.Array
  beta_sum: jax.Array
  proposed: jax.Array
  node_tries: jax.Array
  node_accepts: jax.Array

  @classmethod
  def zeros(cls, batch: int, shape: TreeShape) -> 'TreeCounters':
    d, n = shape.depth, shape.num_nodes
    z = lambda *s: jnp.zeros((batch,) + s, jnp.int32)
    return cls(
      iterations=z(),
      accepted_histogram=z(d + 1),
      position_tries=z(d),
      position_accepts=z(d),
      beta_sum=jnp.zeros((batch,), jnp.float32),
      proposed=z(),
      node_tries=z(n),
      node_accepts=z(n),
    )


@flax.struct.dataclass(kw_only=True)
class TreeLoopState:
  """Carry of the tree loop.

  Attributes:
    inputs: `[B, M + D + 2] int32` decoder inputs (`core.buffer`).
    length: `[B] int32` output tokens so far (EOS included).
    done: `[B] bool` EOS emitted or M reached.
    step: `[] int32` iterations so far.
    target: the target's decode state.
    draft: the drafter's state.
    counters: `TreeCounters`.
    features: `[B, K, D_model] float32` the target's hidden states at
      inputs n-K..n-1 (the last predicted the newest token) for drafters
      with target features: K = the deepest tree + 1 for drafters that read
      recent features, else 1 (`core.drafter.feature_window`); or None.
    provenance: where each output token came from (the accepted path's
      ranks too; `core.provenance.Record`); None when
      `settings.provenance` is off.
    deepest: static; the depth of the deepest tree the state was iterated
      with (None before any iteration): a bound on the tokens a row
      accepted in its last iteration (module docstring).
  """

  inputs: jax.Array
  length: jax.Array
  done: jax.Array
  step: jax.Array
  target: object
  draft: object
  counters: TreeCounters
  features: jax.Array | None = None
  provenance: provenance_lib.Record | None = None
  deepest: int | None = flax.struct.field(pytree_node=False, default=None)


def _count(c: TreeCounters, shape, result, valid, active, kept):
  d = shape.depth
  a = result.accepted
  depth_of = jnp.asarray(shape.depths[1:])  # [N]
  # A node counts when it was tested inside what the row kept (nothing
  # after an EOS or past M), as in the chain loop; the histogram counts the
  # accepted nodes the row output (`core.counters.output_accepted`).
  in_kept = (depth_of[None] - 1) < kept[:, None]
  tried = result.tried & in_kept & active[:, None]
  on_path = result.accepted_nodes(shape.num_nodes) & tried
  levels = jax.nn.one_hot(depth_of - 1, d, dtype=jnp.int32)  # [N, D]
  tested = (tried.astype(jnp.int32) @ levels) > 0
  accepted = (on_path.astype(jnp.int32) @ levels) > 0
  act = active.astype(jnp.int32)
  return TreeCounters(
    iterations=c.iterations + act,
    accepted_histogram=c.accepted_histogram
    + jax.nn.one_hot(
      counters_lib.output_accepted(a, kept), d + 1, dtype=jnp.int32
    )
    * act[:, None],
    position_tries=c.position_tries + tested,
    position_accepts=c.position_accepts + accepted,
    beta_sum=c.beta_sum + jnp.sum(jnp.where(tested, result.beta, 0.0), 1),
    proposed=c.proposed + jnp.sum(valid, 1).astype(jnp.int32) * act,
    node_tries=c.node_tries + tried,
    node_accepts=c.node_accepts + on_path,
  )


def start(
  target,
  draft,
  encoder_tokens: jax.Array,
  settings: DecodeSettings,
  shape: TreeShape,
  room: tuple[int, int] | None = None,
) -> TreeLoopState:
  """The loop's first state: zero counters for `shape`, room for trees of
  up to `room = (nodes, depth)` (default: `shape`'s) in the caches and the
  token buffer, so that the decode may go on with another tree
  (`with_counters`).

  Args:
    target: a `protocol.TreeLanguageModel`.
    draft: a drafter with `propose_tree`, or a tree language model.
    encoder_tokens: `[B, S] int32`.
    settings: static settings (`max_decode_len` M).
    shape: the tree of the first iterations.
    room: the most nodes and the deepest tree the state will decode with.
  """
  num_nodes, depth = room or (shape.num_nodes, shape.depth)
  num_nodes, depth = max(num_nodes, shape.num_nodes), max(depth, shape.depth)
  batch = encoder_tokens.shape[0]
  proposer = model_drafter.as_drafter(draft)
  cache_len = settings.max_decode_len + num_nodes + 2
  # The window of the inputs one iteration can commit (depth + 1).
  features = drafter.feature_window(proposer, target, batch, depth + 1)
  width = settings.max_decode_len + depth + 2
  return TreeLoopState(
    inputs=jnp.full((batch, width), PAD_ID, jnp.int32),
    length=jnp.zeros((batch,), jnp.int32),
    done=jnp.zeros((batch,), bool),
    step=jnp.zeros((), jnp.int32),
    target=target.init_state(encoder_tokens, cache_len),
    draft=proposer.init_draft(encoder_tokens, cache_len),
    counters=TreeCounters.zeros(batch, shape),
    features=features,
    provenance=(
      provenance_lib.Record.zeros(batch, width) if settings.provenance else None
    ),
  )


def with_counters(state: TreeLoopState, shape: TreeShape) -> TreeLoopState:
  """`state` with zero counters for `shape` (to go on with another tree)."""
  return state.replace(
    counters=TreeCounters.zeros(state.length.shape[0], shape)
  )


def iterate(
  target,
  draft,
  encoder_tokens: jax.Array,
  row_keys: jax.Array,
  settings: DecodeSettings,
  shape: TreeShape,
  state: TreeLoopState,
  max_iterations: jax.Array | int,
) -> TreeLoopState:
  """Tree iterations (module docstring) from `state` until every row is
  done or `state.step` reaches `max_iterations` (a run-time value).

  Args:
    target: a `protocol.TreeLanguageModel`.
    draft: a drafter with `propose_tree`, or a tree language model (drafted
      by `ModelDrafter`).
    encoder_tokens: `[B, S] int32`.
    row_keys: `[B]` PRNG keys.
    settings: static settings; `gamma` must be the tree's depth D.
    shape: the static tree; `state` must have room for it (`start`) and
      counters of its size.
    state: where to go on from.
    max_iterations: the loop stops when `state.step` reaches it (or M).

  Returns:
    The state after the last iteration; its `deepest` is the larger of
    `state.deepest` and D.
  """
  if settings.gamma != shape.depth:
    raise ValueError('the tree loop needs settings.gamma == the tree depth')
  d = shape.depth
  batch = encoder_tokens.shape[0]
  proposer = model_drafter.as_drafter(draft)
  with_features = bool(getattr(proposer, 'uses_target_features', False))
  attention = shape.target_attention()
  rows = jnp.arange(batch)
  children, ranks = jnp.asarray(shape.children), jnp.asarray(shape.ranks)

  def body(
    state: TreeLoopState, max_accepted: int | None = None
  ) -> TreeLoopState:
    n = state.length
    active = ~state.done
    context = drafter.DraftContext(
      inputs=state.inputs,
      length=n,
      encoder_tokens=encoder_tokens,
      keys=sampling.position_keys(
        row_keys, n[:, None] + 1 + jnp.arange(d)[None], verified_block.SAMPLE
      ),
      **drafter.context_reads(proposer, state.features, state.target),
      max_accepted=max_accepted,
    )
    proposal, ds = proposer.propose_tree(state.draft, context, settings, shape)
    drafter.check_proposal(proposer, proposal, context, shape, state.draft, ds)
    root = jnp.take_along_axis(state.inputs, n[:, None], axis=1)
    nodes = jnp.concatenate([root, proposal.tokens], axis=1)
    tgt = target.rollback(state.target, n)
    if with_features:
      logits, feats, tgt = target.score_tree_with_features(
        tgt, nodes, attention
      )
    else:
      logits, tgt = target.score_tree(tgt, nodes, attention)
    result = tree_verification.verify_tree(
      shape,
      settings.sampler,
      logits,
      proposal.tokens,
      proposal.q,
      proposal.valid,
      row_keys,
      n,
    )
    a = result.accepted
    tgt = target.commit_tree(tgt, result.path, a + 1)
    path_tokens = nodes[rows[:, None], result.path[:, 1:]]  # [B, D]
    offsets = jnp.arange(d + 1)[None]
    block = jnp.where(
      offsets < a[:, None],
      jnp.concatenate([path_tokens, jnp.zeros_like(root)], axis=1),
      result.next_token[:, None],
    )
    inputs, length, done, kept = buffer.commit_block(
      state, block, a + 1, settings
    )
    record = state.provenance
    if record is not None:
      record = record.write(
        n,
        kept,
        *provenance_lib.tree_block(
          a, result.path, result.tried, proposal.tokens, children, ranks
        ),
      )
    features = state.features
    if with_features:
      # The hidden state at each node of the accepted path (the root
      # first) predicted the token after it: the window moves on by the
      # inputs this iteration committed.
      features = drafter.slide_features(
        features, feats[rows[:, None], result.path], length - n
      )
    return state.replace(
      inputs=inputs,
      length=length,
      done=done,
      step=state.step + 1,
      target=tgt,
      draft=ds,
      counters=_count(
        state.counters, shape, result, proposal.valid, active, kept
      ),
      features=features,
      provenance=record,
    )

  limit = jnp.minimum(
    jnp.asarray(max_iterations, jnp.int32), settings.max_decode_len
  )

  def going(state: TreeLoopState, stop: jax.Array) -> jax.Array:
    return jnp.any(~state.done) & (state.step < stop)

  deepest = state.deepest
  if deepest is not None and deepest > d:
    # The first iteration after a switch to a shallower tree: the last one
    # may have accepted up to `deepest` tokens, more than the drafters
    # re-feed for this tree, which would leave the previous tree's scratch
    # nodes in their caches (module docstring). Its own loop: the wider
    # re-feed costs this one iteration only.
    first = jnp.minimum(limit, state.step + 1)
    state = lax.while_loop(
      lambda s: going(s, first),
      functools.partial(body, max_accepted=deepest),
      state,
    )
  state = lax.while_loop(lambda s: going(s, limit), body, state)
  return state.replace(deepest=max(deepest or 0, d))


def outputs(
  state: TreeLoopState, settings: DecodeSettings
) -> tuple[jax.Array, jax.Array]:
  """Tokens `[B, M]` and lengths `[B]` of a loop state."""
  return state.inputs[:, 1 : settings.max_decode_len + 1], state.length


def tree_decode(
  target,
  draft,
  encoder_tokens: jax.Array,
  row_keys: jax.Array,
  settings: DecodeSettings,
  shape: TreeShape,
):
  """Speculative decoding with token trees (module docstring).

  Args:
    target: a `protocol.TreeLanguageModel`.
    draft: a drafter with `propose_tree`, or a tree language model (drafted
      by `ModelDrafter`).
    encoder_tokens: `[B, S] int32`.
    row_keys: `[B]` PRNG keys.
    settings: static settings; `gamma` must be the tree's depth D.
    shape: the static tree.

  Returns:
    tokens `[B, M]`, lengths `[B]`, `TreeCounters` and the
    `core.provenance.Record` (None with `settings.provenance` off).
  """
  state = start(target, draft, encoder_tokens, settings, shape)
  state = iterate(
    target, draft, encoder_tokens, row_keys, settings, shape, state,
    settings.max_decode_len,
  )  # fmt: skip
  tokens, lengths = outputs(state, settings)
  return tokens, lengths, state.counters, state.provenance


tree_decode_jit = jax.jit(tree_decode, static_argnames=('settings', 'shape'))


def _start_and_iterate(
  target, draft, encoder_tokens, row_keys, settings, shape, room,
  max_iterations,
) -> TreeLoopState:  # fmt: skip
  state = start(target, draft, encoder_tokens, settings, shape, room)
  return iterate(
    target, draft, encoder_tokens, row_keys, settings, shape, state,
    max_iterations,
  )  # fmt: skip


# The first iterations of a decode that may go on with another tree:
# `room` (num_nodes, depth) is the largest tree it may go on with.
start_and_iterate_jit = jax.jit(
  _start_and_iterate, static_argnames=('settings', 'shape', 'room')
)


def _go_on(
  target, draft, encoder_tokens, row_keys, settings, shape, state
) -> TreeLoopState:  # fmt: skip
  state = with_counters(state, shape)
  return iterate(
    target, draft, encoder_tokens, row_keys, settings, shape, state,
    settings.max_decode_len,
  )  # fmt: skip


# Goes on from a state with another tree (fresh counters), to the end.
go_on_jit = jax.jit(_go_on, static_argnames=('settings', 'shape'))

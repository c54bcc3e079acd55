"""The tree loop: a drafted token tree, one target call over all its nodes.

One jitted `lax.while_loop`, like the chain loops (`chain/`), built the
same way: a frozen `Iteration` (`core.loop_state.Loop` and the tree's
shape) whose `step` is one iteration, ending, as the chain's does, in
`core.loop_state.SpecState.commit`; the same token buffer, per-row keys
and statistics (`SpecCounters`, with the per-node counts). Shapes: `B`
rows, `N` tree nodes, `D` tree depth, `M` max_decode_len, `V` vocabulary.

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

Dynamic trees (`core.tree_shape.DynamicTree`, EAGLE-2 style): the
shape's nodes per depth are static, their parents are the drafter's
choice per row (`TreeProposal.parents`); the loop builds each row's tables
from them (`TreeTables.from_parents`) and the target's ancestor mask per
row (`RowTreeAttention`). Everything else is the static tree's.

Cache length: the models' states hold M + N + 2 inputs (n + N + 1 slots
are written while n < M). `Iteration.init` can size them (and the token
buffer) for a larger tree than the first one, so that a decode goes on from
its state with another tree (`iterate` stops at a run-time iteration count):
tree='auto' calibrates on its first iterations that way (`tree.auto`).

Going on with a shallower tree: a drafter may assume that the previous
iteration accepted no more tokens than the current tree is deep unless the
loop says otherwise (`core.drafter.accepted_bound`); model drafts re-feed,
early exits copy only that many + 1 inputs. The state remembers the
deepest tree it ran (`core.loop_state.TreeState.deepest`, static), and the
first iteration of `iterate` with a shallower tree passes that depth
(`DraftContext.max_accepted`) so that every drafter re-synchronises with
the committed prefix; it runs in a loop of its own (one more compiled
iteration), the others as before.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.core import drafter
from spec_decode.core import loop_state
from spec_decode.core import provenance as provenance_lib
from spec_decode.core import tree_shape as tree_lib
from spec_decode.core.counters import SpecCounters
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.tree_shape import TreeShape
from spec_decode.tree import verification as tree_verification


def settings_for(settings: DecodeSettings, shape: TreeShape) -> DecodeSettings:
  """The tree loop's settings: width and gamma are the tree's depth D
  (`propose_tree` reads D as its gamma), no dynamic gamma."""
  return dataclasses.replace(
    settings, width=shape.depth, gamma=shape.depth, dynamic_gamma=0.0
  )


def zero_counters(batch: int, shape: TreeShape) -> SpecCounters:
  """Counters of a tree decode: `shape.depth` positions, per-node counts."""
  return SpecCounters.zeros(batch, shape.depth, num_nodes=shape.num_nodes)


@dataclasses.dataclass(frozen=True)
class Iteration(loop_state.Loop):
  """What every iteration of one tree decode closes over
  (`core.loop_state.Loop`; `settings.width` and `settings.gamma` are the
  tree's depth D, `settings_for`).

  Attributes:
    shape: the static tree, or a `DynamicTree`'s static sizes.
  """

  shape: TreeShape | tree_lib.DynamicTree

  @classmethod
  def create(
    cls, target, draft, encoder_tokens, row_keys, settings, shape
  ) -> 'Iteration':
    """`target`: a `protocol.TreeLanguageModel`; `draft`: a drafter with
    `propose_tree`, or a tree language model (drafted by `ModelDrafter`).

    Raises:
      ValueError: `settings.width` or `settings.gamma` is not the tree's
        depth.
    """
    if not settings.width == settings.gamma == shape.depth:
      raise ValueError(
        'the tree loop needs settings.width == settings.gamma == the tree '
        f'depth ({shape.depth}), got width {settings.width}, gamma '
        f'{settings.gamma} (tree.loop.settings_for)'
      )
    return super().create(
      target, draft, encoder_tokens, row_keys, settings, shape=shape
    )

  def init(self, room: tuple[int, int] | None = None) -> loop_state.TreeState:
    """The loop's first state: zero counters for the shape, room for trees
    of up to `room = (nodes, depth)` (default: the shape's) in the caches
    and the token buffer, so that the decode may go on with another tree
    (`with_counters`)."""
    shape, max_len = self.shape, self.settings.max_decode_len
    num_nodes, depth = room or (shape.num_nodes, shape.depth)
    num_nodes, depth = max(num_nodes, shape.num_nodes), max(depth, shape.depth)
    return self.first_state(
      loop_state.TreeState,
      zero_counters(self.encoder_tokens.shape[0], shape),
      # The window of the inputs one iteration can commit (depth + 1).
      depth + 1,
      buffer_len=max_len + depth + 2,
      cache_len=max_len + num_nodes + 2,
    )

  def step(
    self, state: loop_state.TreeState, max_accepted: int | None = None
  ) -> loop_state.TreeState:
    """One tree iteration (module docstring); `max_accepted`: the deepest
    tree the state ran, when deeper than this one."""
    settings, shape, target = self.settings, self.shape, self.target
    n = state.length
    context = self.context(state, shape.depth, max_accepted)
    proposal, ds = self.proposer.propose_tree(
      state.draft, context, settings, shape
    )
    drafter.check_proposal(
      self.proposer, proposal, context, shape, state.draft, ds
    )
    root = loop_state.gather(state.inputs, n[:, None])
    nodes = jnp.concatenate([root, proposal.tokens], axis=1)
    tgt = target.rollback(state.target, n)
    if tree_lib.is_dynamic(shape):
      tables = tree_lib.TreeTables.from_parents(shape, proposal.parents)
      attention = tree_lib.RowTreeAttention(
        positions=tuple(int(d) for d in shape.depths), mask=tables.ancestors
      )
    else:
      tables = tree_lib.TreeTables.of_shape(shape, n.shape[0])
      attention = shape.target_attention()
    feats = None
    if self.with_features:
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
      self.row_keys,
      n,
      tables,
    )
    a = result.accepted
    tgt = target.commit_tree(tgt, result.path, a + 1)
    rows = jnp.arange(n.shape[0])[:, None]
    depth_of = jnp.asarray(shape.depths[1:])  # [N]
    levels = jax.nn.one_hot(depth_of - 1, shape.depth, dtype=jnp.int32)
    path = loop_state.VerifiedPath(
      tokens=nodes[rows, result.path[:, 1:]],
      accepted=a,
      next_token=result.next_token,
      # Depth d was tested where any node there was.
      tested=(result.tried.astype(jnp.int32) @ levels) > 0,
      beta=result.beta,
      proposed=jnp.sum(proposal.valid, 1).astype(jnp.int32),
      # The hidden state at each node of the accepted path (the root
      # first) predicted the token after it.
      features=None if feats is None else feats[rows, result.path],
    )
    new, kept = state.commit(
      settings,
      path,
      target=tgt,
      draft=ds,
      codes=lambda: provenance_lib.tree_block(
        a,
        result.path,
        result.tried,
        proposal.tokens,
        tables.children,
        tables.ranks,
      ),
    )
    # A node counts where it was tested inside what the row kept (nothing
    # after an EOS or past M), as a depth does (`SpecCounters.counted`).
    tried = result.tried & ((depth_of[None] - 1) < kept[:, None])
    tried &= ~state.done[:, None]
    on_path = result.accepted_nodes(shape.num_nodes) & tried
    c = new.counters
    return new.replace(
      counters=c.replace(
        node_tries=c.node_tries + tried, node_accepts=c.node_accepts + on_path
      )
    )

  def iterate(
    self, state: loop_state.TreeState, max_iterations: jax.Array | int
  ) -> loop_state.TreeState:
    """Tree iterations from `state` until every row is done or
    `state.step` reaches `max_iterations` (a run-time value) or M.

    `state` must have room for the shape (`init`) and counters of its size
    (`zero_counters`). Returns the state after the last iteration; its
    `deepest` is the larger of `state.deepest` and D.
    """
    settings, d = self.settings, self.shape.depth
    deepest = state.deepest
    if deepest is not None and deepest > d:
      # The first iteration after a switch to a shallower tree: the last one
      # may have accepted up to `deepest` tokens, more than the drafters
      # re-feed for this tree, which would leave the previous tree's scratch
      # nodes in their caches (module docstring). Its own loop: the wider
      # re-feed costs this one iteration only.
      first = jnp.minimum(
        jnp.asarray(max_iterations, jnp.int32), state.step + 1
      )
      state = lax.while_loop(
        lambda s: loop_state.not_finished(s, settings, first),
        functools.partial(self.step, max_accepted=deepest),
        state,
      )
    state = lax.while_loop(
      lambda s: loop_state.not_finished(s, settings, max_iterations),
      self.step,
      state,
    )
    return state.replace(deepest=max(deepest or 0, d))


def with_counters(
  state: loop_state.TreeState, shape: TreeShape
) -> loop_state.TreeState:
  """`state` with zero counters for `shape` (to go on with another tree)."""
  return state.replace(counters=zero_counters(state.length.shape[0], shape))


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
    settings: static settings; `width` and `gamma` must be the tree's
      depth D (`settings_for`).
    shape: the static tree.

  Returns:
    tokens `[B, M]`, lengths `[B]`, `SpecCounters` (with the per-node
    counts) and the `core.provenance.Record` (None with
    `settings.provenance` off).
  """
  it = Iteration.create(
    target, draft, encoder_tokens, row_keys, settings, shape
  )
  state = it.iterate(it.init(), settings.max_decode_len)
  tokens, lengths = loop_state.outputs(state, settings)
  return tokens, lengths, state.counters, state.provenance


# Every tree-loop program is compiled for its settings and its tree.
_STATIC = ('settings', 'shape')

tree_decode_jit = jax.jit(tree_decode, static_argnames=_STATIC)


def _start_and_iterate(
  target, draft, encoder_tokens, row_keys, settings, shape, room,
  max_iterations,
) -> loop_state.TreeState:  # fmt: skip
  it = Iteration.create(
    target, draft, encoder_tokens, row_keys, settings, shape
  )
  return it.iterate(it.init(room), max_iterations)


# The first iterations of a decode that may go on with another tree:
# `room` (num_nodes, depth) is the largest tree it may go on with.
start_and_iterate_jit = jax.jit(
  _start_and_iterate, static_argnames=_STATIC + ('room',)
)


def _go_on(
  target, draft, encoder_tokens, row_keys, settings, shape, state
) -> loop_state.TreeState:  # fmt: skip
  it = Iteration.create(
    target, draft, encoder_tokens, row_keys, settings, shape
  )
  return it.iterate(with_counters(state, shape), settings.max_decode_len)


# Goes on from a state with another tree (fresh counters), to the end.
go_on_jit = jax.jit(_go_on, static_argnames=_STATIC)


def run_jit(
  program, target, draft, encoder_tokens, row_keys, settings, shape, **more
):
  """`program` (`tree_decode_jit`, `start_and_iterate_jit`, `go_on_jit`)
  with a tree: its static arguments written once, the decode's `settings`
  made the tree's (`settings_for`) and the `shape`; `more`: the program's
  own (`room`, `max_iterations`, `state`)."""
  return program(
    target,
    draft,
    encoder_tokens,
    row_keys,
    settings=settings_for(settings, shape),
    shape=shape,
    **more,
  )

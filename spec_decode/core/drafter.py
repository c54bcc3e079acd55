"""The drafter protocol: how the speculative loop asks for proposals.

A drafter proposes up to G tokens per row and the distributions `q` they
were drawn from; the loop verifies them with one target call (Algorithm 1)
and never looks inside the drafter. Any language model (`protocol.py`) is a
drafter through `ModelDrafter` (G autoregressive draft steps); n-gram
tables, prompt lookup, Medusa heads and hierarchical drafts implement
`propose` directly. Drafters that can propose token trees also implement
`propose_tree` (the tree loop, `tree/loop.py`).

Exactness needs only that `q[b, i]` is the distribution `tokens[b, i]` was
drawn from, given the row's prefix and the tokens proposed before it, and
that the number of proposed tokens `num[b]` depends on nothing the verifier
draws (it may depend on the drafter's own distributions and draws).

What a drafter reads of the target (each optional, declared by a class
attribute; the loops fill only what is declared, from the verification
call they make anyway, never from a second target call):
  * `uses_target_features`: the target's final hidden state that predicted
    the newest token (`DraftContext.target_features`; Medusa heads);
  * `uses_recent_features`: also the hidden states of the last K inputs
    (`DraftContext.recent_features`), K the most inputs one iteration can
    commit, so the features of every position the last verification
    accepted (EAGLE-style feature drafts);
  * `uses_target_state`: the target's decode state
    (`DraftContext.target_state`), read-only: its encoder-side keys and
    values and its committed cache slots (drafts that share them).
The loops keep the window with `feature_window` and `slide_features`.

What a drafter hands back is checked where a loop receives it
(`check_proposal`, at trace time): a malformed proposal or draft state is
an error naming the drafter's class and the field.

What a drafter may assume about the previous iteration: its rows accepted
at most `accepted_bound(context, depth)` draft tokens, `depth` being this
call's (`settings.gamma` for `propose`, the tree's depth D for
`propose_tree`), so at most that many + 1 inputs were committed since the
drafter last proposed; the loop says more in `DraftContext.max_accepted`
when it drafts less than before (a shallower tree after the calibration
of tree='auto', a smaller gamma under gamma='auto'). A drafter that keeps
its own cache of committed inputs (`ModelDrafter`'s trees, early exit,
feature draft) re-feeds or copies that many + 1 of the newest inputs, so
whatever it left past them last time (tree nodes are scratch) is
overwritten before it reads it. The bound is static: the loops pass the
larger one only on the first iteration after such a switch (a second
compiled iteration body), never in every iteration.
"""

from typing import Any
from typing import Protocol

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.core.decode_settings import DecodeSettings

DraftState = Any  # A pytree whose leaves have a leading batch axis.


@flax.struct.dataclass(kw_only=True)
class DraftContext:
  """What a drafter may read when it proposes (per row, `B` rows).

  Attributes:
    inputs: `[B, L] int32` decoder inputs: `inputs[:, 0]` is the start id 0,
      `inputs[:, k]` is output token k; entries past `length` are stale.
    length: `[B] int32` n, output tokens so far; `inputs[:, n]` is newest.
    encoder_tokens: `[B, S] int32` the encoder input (0 = padding).
    keys: `[B, G]` PRNG keys, one per proposed position (output tokens
      n+1..n+G); a drafter needing more randomness derives it with
      `jax.random.fold_in`.
    target_features: `[B, D] float32` or None. For drafters with
      `uses_target_features`: the target's final decoder hidden state (after
      the final norm) at input n-1, the one that predicted token n, taken from
      the previous target call; zeros before the first call.
    recent_features: `[B, K, D] float32` or None. For drafters with
      `uses_recent_features`: the target's final hidden states at inputs
      n-K..n-1 (`recent_features[:, -1]` is `target_features`), each from
      the target call that committed that input; zeros at inputs < 0. K is
      the most inputs one iteration commits (G + 1 in the chain loops, the
      deepest tree + 1 in the tree loop), so a drafter called every
      iteration sees the features of every input accepted since its last
      call.
    target_state: the target's decode state, or None. For drafters with
      `uses_target_state`; read-only. Its encoder-side keys and values are
      the decode's; its cache slots for inputs 0..n-1 hold the committed
      inputs, later slots are stale (its index is not n).
    max_accepted: static; None, or the most draft tokens a row can have
      accepted in the previous iteration when that is more than this call
      drafts deep (module docstring; read it through `accepted_bound`).
  """

  inputs: jax.Array
  length: jax.Array
  encoder_tokens: jax.Array
  keys: jax.Array
  target_features: jax.Array | None = None
  recent_features: jax.Array | None = None
  target_state: Any = None
  max_accepted: int | None = flax.struct.field(pytree_node=False, default=None)


@flax.struct.dataclass(kw_only=True)
class Proposal:
  """Draft tokens for one iteration.

  Attributes:
    tokens: `[B, G] int32`; entries at positions >= `num` are ignored.
    q: `[B, G, V] float32` the distribution each token was drawn from, or
      None when decoding is greedy (then q is one-hot on `tokens`).
    num: `[B] int32` in [0, G], tokens proposed per row. The verifier tests
      only the first `num` and draws the next token from the target at
      position `num` when all of them are accepted.
  """

  tokens: jax.Array
  q: jax.Array | None
  num: jax.Array


@flax.struct.dataclass(kw_only=True)
class TreeProposal:
  """Draft tokens for one iteration of the tree loop (`core/tree_shape.py`).

  Attributes:
    tokens: `[B, N] int32` the token of nodes 1..N (breadth first).
    q: `[B, N, V] float32` the distribution node i's token was drawn from,
      given its path and the siblings drawn before it; None when decoding
      is greedy.
    valid: `[B, N] bool` nodes actually proposed; a node whose parent is
      not valid must not be valid either. The verifier skips the others.
    parents: `[B, N] int32` for a dynamic tree (`DynamicTree`): node i's
      parent, a node of the depth above (0: the root); siblings rank in
      node-id order. None for a static tree (the shape says).
  """

  tokens: jax.Array
  q: jax.Array | None
  valid: jax.Array
  parents: jax.Array | None = None


class Drafter(Protocol):
  """Proposes draft tokens; a pytree (weights are leaves)."""

  # True: the loop scores the target with features and fills
  # `DraftContext.target_features` (Medusa / blockwise heads).
  uses_target_features: bool
  # Optional, default False: the loop also fills
  # `DraftContext.recent_features` (needs `uses_target_features`).
  uses_recent_features: bool
  # Optional, default False: the loop fills `DraftContext.target_state`.
  uses_target_state: bool

  @property
  def vocab_size(self) -> int: ...

  @property
  def vocabulary(self) -> Any: ...

  def init_draft(self, encoder_tokens: jax.Array, length: int) -> DraftState:
    """State for decoding `encoder_tokens [B, S]`, `length` inputs at most."""
    ...

  def propose(
    self, state: DraftState, context: DraftContext, settings: DecodeSettings
  ) -> tuple[Proposal, DraftState]:
    """Proposes `settings.gamma` tokens per row.

    Args:
      state: this drafter's state from the previous iteration (or
        `init_draft`).
      context: the row's inputs, length, keys (and target features).
      settings: the loop's `DecodeSettings`: `gamma` (the tokens to
        propose now; under gamma='auto' each iteration's own, at most
        `width`, the most any iteration of the decode drafts), `sampler`
        (the same logits -> distribution map the target uses; greedy when
        `sampler.is_greedy`), `dynamic_gamma`.
    """
    ...

  # Optional: drafters that propose token trees (`generate(tree=...)`).
  def propose_tree(
    self,
    state: DraftState,
    context: DraftContext,
    settings: DecodeSettings,
    shape: Any,
  ) -> tuple[TreeProposal, DraftState]:
    """Proposes the nodes of `shape` (a static `core.tree_shape.TreeShape`,
    or a `DynamicTree`, whose parents the proposal gives).

    `context.keys` are `[B, D]`, one per depth (output token n + d); the
    tree loop passes the `settings` with `gamma` = `width` = D
    (`tree.loop.settings_for`). Exactness needs, per node, that its token
    was drawn from its `q` given its path and its elder siblings, and that
    `valid` (and a dynamic tree's parents) depend on nothing the verifier
    draws nor on the node's own draw (`tree/verification.py`).
    """
    ...


def accepted_bound(context: DraftContext, depth: int) -> int:
  """The most draft tokens a row accepted in the previous iteration (a
  static int): `depth`, this call's gamma or tree depth, unless the loop
  said more (`context.max_accepted`, module docstring)."""
  return max(int(depth), context.max_accepted or 0)


def full_proposal(tokens: jax.Array, q: jax.Array | None) -> Proposal:
  """A proposal of all G tokens in every row."""
  num = jnp.full((tokens.shape[0],), tokens.shape[1], jnp.int32)
  return Proposal(tokens=tokens, q=q, num=num)


def check_proposal(
  drafter: Any,
  proposal: Any,
  context: DraftContext,
  size: Any,
  given: DraftState,
  returned: DraftState,
) -> None:
  """Raises unless `proposal` is what the loop that asked for it needs.

  The loops call it once per iteration body, where they receive a
  proposal. Shapes and dtypes are static under jit, so it runs in plain
  Python while the loop is traced and costs the compiled loop nothing (as
  Gemma checks its sampler's state); an error names the drafter's class,
  the field, what it had and what the loop needs.

  Args:
    drafter: the drafter that proposed.
    proposal: what its `propose` (`size` an int) or `propose_tree` (`size`
      a `core.tree_shape.TreeShape`) returned.
    context: the `DraftContext` it was given; B = its rows.
    size: G, the tokens per row `propose` was asked for, or the tree's
      shape (N = its `num_nodes`).
    given: the draft state the drafter was given.
    returned: the one it returned. The loop carries it from iteration to
      iteration: it must have `given`'s structure, shapes and dtypes.

  Raises:
    TypeError: not a `Proposal` (`TreeProposal`), or a field's dtype.
    ValueError: a field's shape.
  """
  tree = hasattr(size, 'num_nodes')
  where = f'{type(drafter).__name__}.{"propose_tree" if tree else "propose"}'
  kind = TreeProposal if tree else Proposal
  if not isinstance(proposal, kind):
    raise TypeError(
      f'{where} returned {type(proposal).__name__} as its proposal; '
      f'expected a core.drafter.{kind.__name__}'
    )
  batch = context.length.shape[0]
  _check_context(where, context, batch, size.depth if tree else int(size))
  vocab = getattr(drafter, 'vocab_size', None)
  n, name = (size.num_nodes, 'N') if tree else (int(size), 'G')
  legend = f'B = {batch} rows, {name} = {n}, V = {vocab or "any"}'
  fields = [
    ('tokens', (batch, n), jnp.int32, f'[B, {name}]'),
    ('q', (batch, n, vocab), jnp.floating, f'[B, {name}, V] or None'),
  ]
  if tree:
    fields.append(('valid', (batch, n), jnp.bool_, '[B, N]'))
    if not hasattr(size, 'paths'):  # A dynamic tree: the parents it chose.
      fields.append(('parents', (batch, n), jnp.int32, '[B, N]'))
  else:
    fields.append(('num', (batch,), jnp.int32, '[B] or None'))
  for field, shape, dtype, dims in fields:
    value = getattr(proposal, field)
    if value is None and field in ('q', 'num'):
      continue
    check_array(
      f'{where} returned {kind.__name__}.{field}', value, shape, dtype,
      f'{dims}: {legend}',
    )  # fmt: skip
  check_draft_state(where, given, returned)


def _check_context(where: str, context: DraftContext, batch: int, depth: int):
  """Raises unless the context a loop gave `where` has the documented
  shapes (`DraftContext`): B rows, one key per position drafted."""
  fields = [
    ('inputs', (batch, None), jnp.int32, '[B, L]'),
    ('length', (batch,), jnp.int32, '[B]'),
    ('encoder_tokens', (batch, None), jnp.int32, '[B, S]'),
    ('keys', (batch, depth), jax.dtypes.prng_key, f'[B, {depth}] PRNG keys'),
    ('target_features', (batch, None), jnp.float32, '[B, D] or None'),
    ('recent_features', (batch, None, None), jnp.float32, '[B, K, D] or None'),
  ]
  for field, shape, dtype, dims in fields:
    value = getattr(context, field)
    if value is not None or field in ('inputs', 'length', 'keys'):
      check_array(
        f'the loop gave {where} DraftContext.{field}', value, shape, dtype,
        f'{dims}, B = {batch}',
      )  # fmt: skip


def check_draft_state(where: str, given: DraftState, returned: DraftState):
  """Raises unless the draft state `where` (a drafter's Class.method)
  returned has the structure, shapes and dtypes of the one it was given."""
  expected = jax.tree_util.tree_flatten_with_path(given)
  got = jax.tree_util.tree_flatten_with_path(returned)
  if expected[1] != got[1]:
    raise TypeError(
      f'{where} returned a draft state of another structure than it was '
      f'given (the loop carries it from iteration to iteration): '
      f'{got[1]}; expected {expected[1]}'
    )
  for (path, before), (_, after) in zip(expected[0], got[0], strict=True):
    dtype = (
      before.dtype if hasattr(before, 'dtype') else jnp.result_type(before)
    )
    check_array(
      f'{where} returned draft state{jax.tree_util.keystr(path)}', after,
      jnp.shape(before), dtype, 'the state it was given',
    )  # fmt: skip


def check_array(what: str, value: Any, shape, dtype, meaning: str) -> None:
  """Raises unless `value` has `shape` (None: any size) and `dtype` (a
  dtype, or an abstract one such as `jnp.floating`).

  Args:
    what: who handed which field, e.g. 'NGram.propose returned
      Proposal.tokens' (the error starts with it).
    value: the array.
    shape: the expected shape.
    dtype: the expected dtype.
    meaning: the axes' names and sizes, for the error.
  """
  dims = ', '.join('?' if d is None else str(d) for d in shape)
  want = f'({dims}{"," if len(shape) == 1 else ""})'
  want += f' {getattr(dtype, "__name__", dtype)}'
  if not hasattr(value, 'shape') or not hasattr(value, 'dtype'):
    raise TypeError(
      f'{what} = {type(value).__name__}, not an array; expected {want} '
      f'({meaning})'
    )
  if len(value.shape) != len(shape) or any(
    d is not None and d != v for d, v in zip(shape, value.shape, strict=True)
  ):
    raise ValueError(
      f'{what} of shape {tuple(value.shape)} {value.dtype}; expected {want} '
      f'({meaning})'
    )
  if not jnp.issubdtype(value.dtype, dtype):
    raise TypeError(
      f'{what} of dtype {value.dtype}; expected {want} ({meaning})'
    )


def reads(proposer: Any, what: str) -> bool:
  """Whether `proposer` declares `uses_<what>` (`features`: target_features,
  `recent_features`, `target_state`)."""
  name = 'uses_target_features' if what == 'features' else f'uses_{what}'
  return bool(getattr(proposer, name, False))


def feature_window(
  proposer: Any, target: Any, batch: int, width: int
) -> jax.Array | None:
  """The loops' zero feature window `[B, K, D]` float32 before the first
  call, or None for a drafter that reads no features.

  Args:
    proposer: the drafter.
    target: the target (`feature_size`, else `config.emb_dim`, is D).
    batch: B.
    width: the most inputs one iteration commits; K = `width` when the
      drafter reads recent features, else 1 (the newest only).
  """
  if not reads(proposer, 'features'):
    return None
  size = getattr(target, 'feature_size', None) or target.config.emb_dim
  k = width if reads(proposer, 'recent_features') else 1
  return jnp.zeros((batch, k, size), jnp.float32)


def slide_features(
  window: jax.Array, new: jax.Array, count: jax.Array
) -> jax.Array:
  """The window after `count` more inputs were committed.

  Args:
    window: `[B, K, D]` features at inputs n-K..n-1.
    new: `[B, C, D]` the last target call's features at inputs n..n+C-1
      (the committed ones first).
    count: `[B] int32` in [0, C], inputs committed (the new length n + count).

  Returns:
    `[B, K, D]` features at inputs n+count-K..n+count-1.
  """
  k = window.shape[1]
  both = jnp.concatenate([window, new.astype(window.dtype)], axis=1)
  idx = count[:, None] + jnp.arange(k)[None]
  return jnp.take_along_axis(both, idx[..., None], axis=1)


def context_reads(
  proposer: Any, window: jax.Array | None, target_state: Any
) -> dict[str, Any]:
  """The `DraftContext` fields a drafter declared it reads, from the loop's
  feature window and the target's state."""
  out = {}
  if window is not None:
    out['target_features'] = window[:, -1]
    if reads(proposer, 'recent_features'):
      out['recent_features'] = window
  if reads(proposer, 'target_state'):
    out['target_state'] = target_state
  return out


def is_drafter(obj: Any) -> bool:
  return hasattr(obj, 'propose') and hasattr(obj, 'init_draft')


def zero_gamma_ok(draft: Any) -> bool:
  """Gamma 0 (no draft call) keeps `draft` usable: a language model (caught
  up later) or a drafter without state."""
  if not is_drafter(draft):
    return True
  return draft.init_draft(jnp.zeros((1, 1), jnp.int32), 1) is None

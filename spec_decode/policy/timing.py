"""Measured costs of draft and target: c and v(k) (paper section 3).

`c` is the time of one draft step over one target step, `v(k)` the time of
a target call on k tokens over a call on one; both are medians of calls
timed inside compiled loops (no dispatch overhead), as the decoding loops
see them. A drafter that is not a language model (n-gram, copy, heads) is
timed through `propose`, and its c is that time per proposed token.
"""

import functools
import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.core import drafter as drafter_base
from spec_decode.core import sampling
from spec_decode.core.decode_settings import DecodeSettings


def median_time(fn, repeats: int) -> float:
  """Median wall time of `fn()` over `repeats` calls, after one warm-up."""
  jax.block_until_ready(fn())  # warm-up (and compile)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


@functools.partial(jax.jit, static_argnames=('batch', 'prefix', 'length'))
def primed_state(model, batch: int, prefix: int, length: int):
  """A decoding state of `length` positions with `prefix` tokens scored
  (compiled: eager op-by-op dispatch of a large model costs more than its
  compile)."""
  state = model.init_state(jnp.full((batch, 16), 5, jnp.int32), length)
  return model.score(state, jnp.zeros((batch, prefix), jnp.int32))[1]


def _index(state):
  return state.cache.index if hasattr(state, 'cache') else state.index


@functools.partial(
  jax.jit, static_argnames=('num_tokens', 'calls', 'attention')
)
def repeated_score(model, state, num_tokens: int, calls: int, attention=None):
  """`calls` score calls of `num_tokens` tokens inside one compiled loop.

  Each call rolls back to the same index and writes the cache the next call
  reads, so XLA cannot hoist the work out of the loop. With a tree's
  `attention` (`core.tree_shape.TreeAttention`, static) the calls are
  `score_tree` calls over its nodes, timed by the same loop, so a tree's
  cost and a chain's are comparable.
  """
  index = _index(state)
  tokens = jnp.zeros((index.shape[0], num_tokens), jnp.int32)

  def body(_, carry):
    st, acc = carry
    st = model.rollback(st, index)
    if attention is None:
      logits, st = model.score(st, tokens)
    else:
      logits, st = model.score_tree(st, tokens, attention)
    return st, acc + logits[0, 0, 0]

  return lax.fori_loop(0, calls, body, (state, jnp.float32(0)))[1]


@functools.partial(jax.jit, static_argnames=('length',))
def state_at(model, encoder_tokens, length: int, position):
  """A decoding state of `length` positions for `encoder_tokens [B, S]`
  whose rows stand at decode position `position` (a traced int: one
  program serves every position). The cache holds zeros before it: a
  score call costs the same whatever the cache holds, and the loops'
  calls attend over the whole buffer under a mask."""
  state = model.init_state(encoder_tokens, length)
  rows = encoder_tokens.shape[0]
  return model.rollback(state, jnp.full((rows,), position, jnp.int32))


def score_call_seconds(model, state, num_tokens: int, calls: int) -> float:
  """Seconds of one in-loop score call of `num_tokens` tokens per row, from
  one timed run of `calls` calls (`repeated_score`). The caller compiles
  first (an untimed call) and repeats it in its own order (the eval's
  rotating rounds) instead of taking a median here."""
  t0 = time.perf_counter()
  jax.block_until_ready(repeated_score(model, state, num_tokens, calls))
  return (time.perf_counter() - t0) / calls


@functools.partial(jax.jit, static_argnames=('gamma', 'calls'))
def _repeated_iterations(target, draft, states, gamma: int, calls: int):
  """`calls` rounds of one target call over gamma + 1 tokens then gamma draft
  steps, each call's input depending on the previous call's output as in
  speculative decoding (so XLA runs them in that order, not concurrently)."""
  t_index, d_index = _index(states[0]), _index(states[1])
  batch = t_index.shape[0]

  def token(logits):  # always 0, but only known after `logits`
    return (logits[:, -1:, 0] > 3e38).astype(jnp.int32)

  def body(_, carry):
    t_state, d_state, last = carry
    logits, t_state = target.score(
      target.rollback(t_state, t_index),
      jnp.broadcast_to(last, (batch, gamma + 1)),
    )
    last = token(logits)
    d_state = draft.rollback(d_state, d_index)
    for _ in range(gamma):  # unrolled, like the drafters' steps
      logits, d_state = draft.score(d_state, last)
      last = token(logits)
    return t_state, d_state, last

  init = (*states, jnp.zeros((batch, 1), jnp.int32))
  return lax.fori_loop(0, calls, body, init)[2]


def iteration_time(
  target: Any,
  draft: Any,
  gamma: int,
  repeats: int,
  batch: int = 1,
  prefix: int = 16,
  calls: int = 8,
) -> float:
  """Median time of one target call over gamma + 1 tokens plus gamma draft
  steps, run back to back inside one compiled loop.

  This is what a speculative iteration's model calls cost with the memory
  hierarchy in decoding's state: on a CPU whose cache holds one model's
  weights, calls timed alone (`step_times`) find their weights cached, while
  here each model's weights have been evicted by the other's.
  """
  states = tuple(
    primed_state(m, batch, prefix, prefix + gamma + 3) for m in (target, draft)
  )
  return (
    median_time(
      lambda: _repeated_iterations(target, draft, states, gamma, calls),
      repeats,
    )
    / calls
  )


def step_times(
  model: Any,
  ks: Sequence[int],
  repeats: int,
  batch: int = 1,
  prefix: int = 16,
  calls: int = 16,
  length: int | None = None,
) -> dict[int, float]:
  """Median time of one in-loop `score` call with k tokens per row, per k.

  `length` (default `prefix + max(ks) + 2`) is the cache's length: callers
  that time one k at a time pass one length so the primed state compiles
  once.
  """
  length = length or prefix + max(ks) + 2
  state = primed_state(model, batch, prefix, length)
  return {
    k: median_time(lambda k=k: repeated_score(model, state, k, calls), repeats)
    / calls
    for k in ks
  }


def tree_step_time(
  model: Any,
  attention: Any,
  num_nodes: int,
  repeats: int,
  batch: int = 1,
  prefix: int = 16,
  calls: int = 16,
  length: int | None = None,
) -> float:
  """`step_times` for one `score_tree` call over a tree of `num_nodes`
  nodes (root included) with `attention` (`TreeShape.target_attention`
  of its shape): the same loop, calls and rollback, so v_tree(n) and
  v_chain(n) differ only in the call."""
  length = length or prefix + num_nodes + 2
  state = primed_state(model, batch, prefix, length)
  return (
    median_time(
      lambda: repeated_score(model, state, num_nodes, calls, attention),
      repeats,
    )
    / calls
  )


@functools.partial(jax.jit, static_argnames=('settings', 'calls'))
def _repeated_propose(drafter, state, context, settings, calls: int):
  def body(_, carry):
    st, acc = carry
    proposal, st = drafter.propose(st, context, settings)
    return st, acc + proposal.tokens[0, 0]

  return lax.fori_loop(0, calls, body, (state, jnp.int32(0)))[1]


def propose_time(
  drafter: Any,
  settings: DecodeSettings,
  repeats: int,
  batch: int = 1,
  feature_size: int = 0,
  prefix: int = 16,
  calls: int = 16,
  target: Any = None,
) -> float:
  """Median time of one in-loop `propose` call (`settings.gamma` tokens
  per row, with the buffer and feature window of a loop `settings.width`
  wide).

  `target` gives a drafter that reads the target's state or recent
  features (`core.drafter`) a decode state holding `prefix` inputs and a
  zero feature window; else it gets zero features of `feature_size`.
  """
  g, w = settings.gamma, settings.width
  enc = jnp.full((batch, 16), 5, jnp.int32)
  length = prefix + w + 2
  inputs = (jnp.arange(length)[None] % 7 + 3).astype(jnp.int32)
  inputs = jnp.broadcast_to(inputs.at[:, 0].set(0), (batch, length))
  n = jnp.full((batch,), prefix, jnp.int32)
  keys = jax.random.split(jax.random.key(0), batch)
  if target is not None:
    tstate = target.score(target.init_state(enc, length), inputs[:, :prefix])
    reads = drafter_base.context_reads(
      drafter,
      drafter_base.feature_window(drafter, target, batch, w + 1),
      tstate[1],
    )
  else:
    reads = {
      'target_features': (
        jnp.zeros((batch, feature_size), jnp.float32)
        if getattr(drafter, 'uses_target_features', False)
        else None
      )
    }
  context = drafter_base.DraftContext(
    inputs=inputs,
    length=n,
    encoder_tokens=enc,
    keys=sampling.position_keys(keys, n[:, None] + 1 + jnp.arange(g), 0),
    **reads,
  )
  state = drafter.init_draft(enc, length)
  return (
    median_time(
      lambda: _repeated_propose(drafter, state, context, settings, calls),
      repeats,
    )
    / calls
  )


def measure(
  target: Any,
  draft: Any,
  ks: Sequence[int],
  batch: int,
  repeats: int,
  settings: DecodeSettings | None = None,
) -> dict[str, Any]:
  """c and v(k) for a target and a draft (a model or a drafter).

  Args:
    target: the target model.
    draft: a language model (timed per T=1 step) or a drafter (timed per
      `propose` call of `settings.gamma` tokens, divided by gamma).
    ks: target call sizes k for v(k) (1 is always added).
    batch: rows per call.
    repeats: timed repeats (medians).
    settings: `DecodeSettings` for timing a drafter's `propose`.

  Returns:
    `{'c', 'v_of_k': {k: v(k)}, 'target_step_seconds',
    'draft_step_seconds'}`, v(1) = 1.
  """
  ks = sorted(set(int(k) for k in ks) | {1})
  t = step_times(target, ks, repeats, batch=batch)
  if drafter_base.is_drafter(draft):
    if settings is None:
      raise ValueError('timing a drafter needs the decode settings')
    size = getattr(getattr(target, 'config', None), 'emb_dim', 0)
    d = (
      propose_time(draft, settings, repeats, batch, size, target=target)
      / settings.gamma
    )
  else:
    d = step_times(draft, (1,), repeats, batch=batch)[1]
  return {
    'c': d / t[1],
    'v_of_k': {k: t[k] / t[1] for k in ks},
    'target_step_seconds': t[1],
    'draft_step_seconds': d,
  }

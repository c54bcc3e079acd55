"""The loops hand a feature drafter the target's features of every accepted
input (`DraftContext.recent_features`), chains and trees.

A recording drafter wraps a feature draft: at every call it stores the
feature window it was handed at the inputs the window covers, and the
distribution of its first proposed token at input n. After a decode with
ragged acceptance (rows accept different numbers of tokens, at temperature
1), every stored feature must equal the target's teacher-forced feature of
that input (the hand-off), every committed input before the last call must
have been covered (no accepted input skipped), and every first-token q must
equal the feature draft's teacher-forced distribution on the target's true
features (the draft's own cache re-fed with them, EAGLE's correction).

Negative control: the same recorder handing the draft the window of its
previous call (stale features, a plausible bug in the hand-off after a
rejection) must fail both checks.
"""

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch
from conftest import sharpened
from conftest import tiny_config

import spec_decode as sd
from spec_decode.chain import steps
from spec_decode.core import loop_state
from spec_decode.core import tree_shape
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.drafters.feature import FeatureDraft
from spec_decode.tree import loop as tree_loop

M = 14


@flax.struct.dataclass(kw_only=True)
class RecordState:
  inner: Any
  seen: jax.Array  # [B, L, D] features handed, at their inputs
  covered: jax.Array  # [B, L] bool
  first_q: jax.Array  # [B, L, V] first token's q, at input n
  has_q: jax.Array  # [B, L] bool
  last_n: jax.Array  # [B] the length at the last call
  prev: jax.Array  # [B, K, D] the window of the last call


@flax.struct.dataclass(kw_only=True)
class Recorder:
  """Records what a wrapped feature draft is handed (module docstring)."""

  inner: Any
  width: int = flax.struct.field(pytree_node=False)
  stale: bool = flax.struct.field(pytree_node=False, default=False)

  uses_target_features = True
  uses_recent_features = True
  uses_target_state = True

  @property
  def vocab_size(self):
    return self.inner.vocab_size

  @property
  def vocabulary(self):
    return self.inner.vocabulary

  def init_draft(self, enc, length):
    b, d, v = enc.shape[0], self.inner.net_config.emb_dim, self.vocab_size
    return RecordState(
      inner=self.inner.init_draft(enc, length),
      seen=jnp.zeros((b, length, d)),
      covered=jnp.zeros((b, length), bool),
      first_q=jnp.zeros((b, length, v)),
      has_q=jnp.zeros((b, length), bool),
      last_n=jnp.zeros((b,), jnp.int32),
      prev=jnp.zeros((b, self.width, d)),
    )

  def _record(self, state, context, used, q):
    n = context.length
    rows = jnp.arange(n.shape[0])
    k = used.shape[1]
    seen, covered = state.seen, state.covered
    for j in range(k):
      t = n - k + j
      ok = t >= 0
      tc = jnp.maximum(t, 0)
      seen = seen.at[rows, tc].set(
        jnp.where(ok[:, None], used[:, j], seen[rows, tc])
      )
      covered = covered.at[rows, tc].set(covered[rows, tc] | ok)
    return state.replace(
      seen=seen,
      covered=covered,
      first_q=state.first_q.at[rows, n].set(q),
      has_q=state.has_q.at[rows, n].set(True),
      last_n=n,
      prev=context.recent_features,
    )

  def _handed(self, state, context):
    assert context.recent_features.shape[1] == self.width
    used = state.prev if self.stale else context.recent_features
    return used, context.replace(
      recent_features=used, target_features=used[:, -1]
    )

  def propose(self, state, context, settings):
    used, ctx = self._handed(state, context)
    proposal, inner = self.inner.propose(state.inner, ctx, settings)
    state = self._record(state, context, used, proposal.q[:, 0])
    return proposal, state.replace(inner=inner)

  def propose_tree(self, state, context, settings, shape):
    used, ctx = self._handed(state, context)
    proposal, inner = self.inner.propose_tree(state.inner, ctx, settings, shape)
    state = self._record(state, context, used, proposal.q[:, 0])
    return proposal, state.replace(inner=inner)


@pytest.fixture(scope='module')
def pair():
  target = sharpened(sd.Model.init(tiny_config(num_decoder_layers=3), seed=0))
  draft = FeatureDraft.init(target)
  leaves, tree = jax.tree.flatten(draft.params)
  keys = jax.random.split(jax.random.key(5), len(leaves))
  noisy = [
    x + 0.3 * jnp.std(x) * jax.random.normal(k, x.shape)
    for x, k in zip(leaves, keys, strict=True)
  ]
  return target, draft.with_params(jax.tree.unflatten(tree, noisy))


def _settings(gamma):
  return DecodeSettings(
    max_decode_len=M, sampler=sd.Sampler(1.0), gamma=gamma, provenance=False
  )


def _chain(target, rec, enc, keys, gammas):
  """The chain loop's iterations at the gammas given (cycled), G the
  largest: fixed gamma is one gamma, gamma='auto' a varying one."""
  settings = _settings(max(gammas))
  it = steps.Iteration.create(target, rec, enc, keys, settings)
  state = it.init()
  step = {g: jax.jit(functools.partial(it.draft, g=g)) for g in set(gammas)}
  i = 0
  while bool(loop_state.not_finished(state, settings)):
    state = step[gammas[i % len(gammas)]](state)
    i += 1
  return state.inputs, state.length, state.draft, state.counters


def _tree(target, rec, enc, keys, branching):
  shape = tree_shape.from_branching(branching)
  settings = _settings(shape.depth)
  state = tree_loop.start_and_iterate_jit(
    target, rec, enc, keys, settings, shape, None, M
  )
  return state.inputs, state.length, state.draft, state.counters


def _errors(target, draft, enc, inputs, lengths, rec_state):
  """(feature error, uncovered inputs, first-q error) of a decode."""
  inputs = jnp.asarray(inputs[:, : M + 1])
  feats = np.asarray(target.features(enc, inputs))
  seen = np.asarray(rec_state.seen)[:, : M + 1]
  covered = np.asarray(rec_state.covered)[:, : M + 1]
  last_n = np.asarray(rec_state.last_n)
  feat_err = float(
    np.max(np.abs(np.where(covered[..., None], seen - feats, 0)))
  )
  uncovered = sum(
    int(np.sum(~covered[b, : last_n[b]])) for b in range(len(last_n))
  )
  predicted = draft.teacher_forced(enc, inputs, jnp.asarray(feats))
  want = np.asarray(jax.nn.softmax(draft.logits(predicted)))
  has_q = np.asarray(rec_state.has_q)[:, : M + 1]
  got = np.asarray(rec_state.first_q)[:, : M + 1]
  q_err = float(np.max(np.abs(np.where(has_q[..., None], got - want, 0))))
  return feat_err, uncovered, q_err


CASES = {
  'chain_fixed_3': ('chain', (3,)),
  'chain_varying_1_3_2': ('chain', (1, 3, 2)),
  'tree_2_2_1': ('tree', (2, 2, 1)),
}


@pytest.mark.parametrize('name', sorted(CASES))
@pytest.mark.parametrize('stale', [False, True], ids=['handoff', 'stale'])
def test_feature_handoff(pair, name, stale):
  target, draft = pair
  kind, arg = CASES[name]
  enc = jnp.asarray(encoder_batch(6, 7, 16, seed=3))
  keys = jax.random.split(jax.random.key(11), 6)
  width = max(arg) + 1 if kind == 'chain' else len(arg) + 1
  rec = Recorder(inner=draft, width=width, stale=stale)
  run = _chain if kind == 'chain' else _tree
  inputs, lengths, rec_state, counters = run(target, rec, enc, keys, arg)
  # Ragged acceptance: rows accepted different numbers of tokens.
  assert len({tuple(h) for h in np.asarray(counters.accepted_histogram)}) > 2
  feat_err, uncovered, q_err = _errors(
    target, draft, enc, np.asarray(inputs), lengths, rec_state
  )
  if stale:
    # A stale window is caught: features at the wrong inputs, and the
    # draft's predictions differ from teacher forcing.
    assert feat_err > 1e-2 and q_err > 1e-3, (feat_err, q_err)
  else:
    assert feat_err < 1e-4, feat_err
    assert uncovered == 0
    assert q_err < 1e-4, q_err

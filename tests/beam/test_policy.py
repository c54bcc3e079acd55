"""Speculative beam search with `gamma='auto'`: plain steps or tree calls.

Any schedule of plain steps and speculative calls returns plain beam
search's beams; the draft must catch up on the steps taken plainly (and
follow their beam reorders), which a draft equal to the target with full
trees shows: then every speculative call commits gamma + 1 steps.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch
from conftest import perturbed
from conftest import sharpened
from conftest import tiny_config
from jax import lax
from test_speculative import ENC
from test_speculative import RowTableLM
from test_speculative import _tables

import spec_decode as sd
from spec_decode.beam import costs as beam_costs
from spec_decode.beam import draft_trees
from spec_decode.beam import policy as beam_policy
from spec_decode.beam import search as beam_search_lib
from spec_decode.beam import speculative as spec_beam
from spec_decode.policy import cost_cache

P, S, POLICY = beam_policy.PLAIN, beam_policy.SPECULATIVE, beam_policy.POLICY
# A smaller cap on plain steps in a row than the library's, so that short
# decodes reach it (the cap and the draft's catch-up room follow it).
CAP = 16
# Plain runs of every length up to the cap, between speculative calls.
SCHEDULE = [P, S, P, P, S, S] + [P] * CAP + [S, P]


@pytest.fixture(autouse=True, scope='module')
def _small_cap():
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(beam_policy, 'MAX_IDLE', CAP)
    mp.setattr(spec_beam, 'CATCH_UP', CAP)
    jax.clear_caches()
    yield
  jax.clear_caches()


def _inputs(seconds=(1.0, 2.0), **kw):
  return beam_policy.BeamPolicyInputs.create(np.asarray(seconds), **kw)


def test_choice_rule():
  active = jnp.array([True, True, False])
  # Row 2 is done: its calls do not count. S = (2*3 + 2*E(0.8, 2)) / 4.
  hist = jnp.array([[0, 0, 2], [0, 0, 0], [50, 0, 0]])
  s = float(beam_policy.steps_per_call(hist, active))
  assert s == pytest.approx((6 + 2 * (1 + 0.8 + 0.64)) / 4)
  spec = lambda h, seconds, idle=0, **kw: bool(  # noqa: E731
    beam_policy.speculate(
      jnp.asarray(h), active, _inputs(seconds, **kw), jnp.int32(0),
      jnp.int32(idle),
    )
  )  # fmt: skip
  assert spec(hist, (1.0, s - 0.01))  # S steps per call beat S - 0.01 s.
  assert not spec(hist, (1.0, s + 0.01))
  # Poor coverage: plain, until the probe (period ceil(1 / 0.02) = 50,
  # capped at the cap; explore_cost 0 leaves only the cap).
  poor = [[40, 0, 0], [40, 0, 0], [0, 0, 0]]
  assert not spec(poor, (1.0, 2.0), idle=CAP - 1)
  assert spec(poor, (1.0, 2.0), idle=CAP)
  assert spec(poor, (1.0, 1.1), idle=10)  # Period ceil(0.1 / 0.02) = 5.
  assert not spec(poor, (1.0, 1.1), idle=10, explore_cost=0.0)
  # Forced kinds win, except the cap on plain steps in a row.
  assert spec(poor, (1.0, 2.0), forced_gamma=S)
  assert not spec(hist, (1.0, 1.0), forced_gamma=P)
  assert spec(hist, (1.0, 1.0), forced_gamma=P, idle=CAP)


def _decode(target, draft, enc, k, gamma, schedule, m=12, **tree):
  settings = beam_search_lib.BeamSettings(
    num_beams=k, alpha=0.6, max_decode_len=m
  )
  layout = draft_trees.TreeLayout(
    gamma=gamma, width=tree.get('w', 1), children=tree.get('c', 2)
  )
  out = spec_beam.spec_beam_decode_jit(
    target, draft, jnp.asarray(enc), settings=settings, layout=layout,
    policy=_inputs(forced_gamma=schedule),
  )  # fmt: skip
  names = ('tokens', 'scores', 'lengths', 'steps', 'calls', 'histogram')
  return dict(zip(names, map(np.asarray, out), strict=False))


def _check(plain, out, exact=True):
  np.testing.assert_array_equal(out['tokens'], plain.tokens)
  np.testing.assert_array_equal(out['lengths'], plain.lengths)
  np.testing.assert_array_equal(out['steps'], plain.steps)
  if exact:
    np.testing.assert_array_equal(out['scores'], plain.scores)
  else:
    np.testing.assert_allclose(out['scores'], plain.scores, atol=1e-5)
  # Every call is a plain step (1 step) or a speculative call (1 + a).
  hist = out['histogram']
  plain_steps = out['calls'] - hist.sum(1)
  committed = hist @ np.arange(1, hist.shape[1] + 1)
  np.testing.assert_array_equal(plain_steps + committed, out['steps'])
  return plain_steps


@pytest.mark.parametrize('num_beams', [1, 2, 4])
def test_every_schedule_returns_plain_beams_on_tables(num_beams):
  target = RowTableLM(tables=_tables(8, seed=num_beams))
  m = 30
  plain = sd.beam_search(
    target, ENC, num_beams=num_beams, alpha=0.6, max_decode_len=m
  )
  draft = sd.TableLM.random(8, seed=11)
  long_rows = plain.steps > CAP
  assert long_rows.any() and not long_rows.all(), plain.steps
  for schedule in ([P], [S], SCHEDULE, [POLICY]):
    out = _decode(target, draft, ENC, num_beams, 2, schedule, m=m)
    plain_steps = _check(plain, out)
    if schedule == [P]:  # Capped: CAP plain steps in a row at most.
      np.testing.assert_array_equal(out['histogram'].sum(1) > 0, long_rows)
    if schedule == [S]:
      assert (plain_steps == 0).all()


@pytest.fixture(scope='module')
def t5():
  return sharpened(sd.Model.init(tiny_config(), seed=0))


@pytest.fixture(scope='module')
def enc(t5):
  return encoder_batch(8, 7, t5.vocab_size, seed=2)


def _self_draft_full_calls(t5, enc, k=2, gamma=2, m=30):
  """Plain and the self-draft decode with full trees (W = K^(G-1), c = K)
  on SCHEDULE, and how many speculative calls committed fewer than
  gamma + 1 steps without stopping their row."""
  plain = sd.beam_search(t5, enc, num_beams=k, alpha=0.6, max_decode_len=m)
  out = _decode(t5, t5, enc, k, gamma, SCHEDULE, m=m, w=k ** (gamma - 1), c=k)
  _check(plain, out, exact=False)
  # A row's last call may end early (it stopped); any other must be full.
  short = out['histogram'][:, :-1].sum(1)
  return int(np.maximum(short - 1, 0).sum()), out


def test_draft_catches_up_on_plain_steps(t5, enc):
  # The catch-up covers runs of up to CAP plain steps and their beam
  # reorders: a draft equal to the target then covers every step. (The
  # reorders themselves barely show here: this tiny model ranks its top
  # children alike after the other beams' older prefixes.)
  short, out = _self_draft_full_calls(t5, enc)
  assert out['histogram'].sum() > 8, out['histogram']  # Speculative calls.
  assert short == 0, out['histogram']


def test_negative_control_draft_not_catching_up(t5, enc, monkeypatch):
  # A catch-up chunk without room for the plain steps leaves the draft's
  # root logits at the wrong input: calls miss steps.
  monkeypatch.setattr(spec_beam, 'CATCH_UP', 0)
  jax.clear_caches()
  short, _ = _self_draft_full_calls(t5, enc)
  jax.clear_caches()
  assert short > 0


@flax.struct.dataclass(kw_only=True)
class _HistoryState:
  inputs: jax.Array  # [R, L] inputs, then the scratch slots of a tree call
  index: jax.Array  # [R]
  start: jax.Array  # [R] the first encoder token


@flax.struct.dataclass(kw_only=True)
class HistoryLM:
  """Logits `tables[h % R, newest input]`, h = the first encoder token +
  the sum over every input so far of (input + 1).

  Every earlier input moves the next distribution (unlike a bigram table,
  or a tiny T5 whose top children barely depend on the older prefix), so
  a draft equal to it covers every step only when each beam's tree is
  grown from that beam's own history. A tree language model.
  """

  tables: jax.Array  # [R, V, V]
  vocabulary: Any = flax.struct.field(pytree_node=False, default=None)

  @property
  def vocab_size(self) -> int:
    return self.tables.shape[-1]

  def init_state(self, encoder_tokens, length):
    rows = encoder_tokens.shape[0]
    return _HistoryState(
      inputs=jnp.zeros((rows, length + 1), jnp.int32),
      index=jnp.zeros((rows,), jnp.int32),
      start=encoder_tokens[:, 0].astype(jnp.int32),
    )

  def _logits(self, sums, tokens):
    return self.tables[sums % self.tables.shape[0], tokens]

  def _sum(self, state):
    before = jnp.arange(state.inputs.shape[1])[None] < state.index[:, None]
    return state.start + jnp.sum(jnp.where(before, state.inputs + 1, 0), 1)

  def _write(self, state, tokens, at):
    inputs = jax.vmap(lambda b, t, i: lax.dynamic_update_slice(b, t, (i,)))(
      state.inputs, tokens.astype(jnp.int32), at
    )
    return state.replace(inputs=inputs)

  def score(self, state, tokens):
    sums = self._sum(state)[:, None] + jnp.cumsum(tokens + 1, axis=1)
    state = self._write(state, tokens, state.index)
    return self._logits(sums, tokens), state.replace(
      index=state.index + tokens.shape[1]
    )

  def score_tree(self, state, tokens, attention):
    offset = getattr(attention, 'offset', 0)
    state = self._write(state, tokens, state.index + offset)
    slots = state.index[:, None] + jnp.arange(offset + tokens.shape[1])
    scratch = jnp.take_along_axis(state.inputs, slots, axis=1)
    mask = attention.mask_array().astype(jnp.int32)
    sums = self._sum(state)[:, None] + jnp.einsum(
      'rtu,ru->rt', mask, scratch + 1
    )
    return self._logits(sums, tokens), state

  def commit_tree(self, state, slots, count):
    moved = jnp.take_along_axis(
      state.inputs, state.index[:, None] + slots, axis=1
    )
    old = jax.vmap(lambda b, i: lax.dynamic_slice(b, (i,), (slots.shape[1],)))(
      state.inputs, state.index
    )
    keep = jnp.arange(slots.shape[1])[None] < count[:, None]
    state = self._write(state, jnp.where(keep, moved, old), state.index)
    return state.replace(index=state.index + count)

  def rollback(self, state, index):
    return state.replace(index=index)


def _history_self_draft_short_calls(k=2, gamma=2, m=30):
  """Plain beam search and the self-draft decode of a `HistoryLM` with
  full trees on SCHEDULE; speculative calls that committed fewer than
  gamma + 1 steps without stopping their row, and the decode."""
  rng = np.random.default_rng(4)
  tables = rng.normal(0.0, 3.0, (4, 8, 8))
  tables[:, :, sd.EOS_ID] -= 2.0
  lm = HistoryLM(tables=jnp.asarray(tables, jnp.float32))
  plain = sd.beam_search(lm, ENC, num_beams=k, alpha=0.6, max_decode_len=m)
  out = _decode(lm, lm, ENC, k, gamma, SCHEDULE, m=m, w=k ** (gamma - 1), c=k)
  _check(plain, out)
  short = out['histogram'][:, :-1].sum(1)
  return int(np.maximum(short - 1, 0).sum()), out


def test_draft_follows_beam_reorders_across_calls():
  """After a speculative call the draft's rows are the beams' own: later
  plain steps' reorders compose onto the identity, so a self-draft whose
  proposals depend on its whole history covers every step."""
  short, out = _history_self_draft_short_calls()
  assert out['histogram'].sum() > 8, out['histogram']  # Speculative calls.
  assert short == 0, out['histogram']


def test_negative_control_stale_draft_rows(monkeypatch):
  """The row map kept after a call (issue 28): the next call applies it
  again, and the trees of some beams grow from other beams' histories."""
  monkeypatch.setattr(spec_beam, 'draft_rows_after_call', lambda rows: rows)
  jax.clear_caches()
  short, _ = _history_self_draft_short_calls()
  jax.clear_caches()
  assert short >= 4  # 8 at this seed.


def test_auto_decodes_plain_beams_and_follows_the_costs(t5, enc, monkeypatch):
  plain = sd.beam_search(t5, enc, num_beams=2, alpha=0.6, max_decode_len=12)
  # Fixed costs: a call costs 2 plain steps.
  monkeypatch.setattr(
    beam_costs, 'iteration_seconds', lambda *a, **k: ([1.0, 2.0], {})
  )
  auto = lambda draft: sd.beam_search(  # noqa: E731
    t5,
    enc,
    num_beams=2,
    alpha=0.6,
    max_decode_len=12,
    draft=draft,
    gamma='auto',
    max_auto_gamma=2,
  )
  # An unrelated draft covers ~1 step per call: plain steps, with probes.
  poor = auto(sd.TableLM.random(t5.vocab_size, seed=3))
  assert poor.iteration_seconds == [1.0, 2.0]
  # One speculative call for the batch's estimate (8 rows x 1 step, with
  # the prior: S = 1.29 < 2), then plain steps.
  np.testing.assert_array_equal(poor.histogram.sum(1), 1)
  np.testing.assert_array_equal(poor.calls, poor.steps)  # 1 step each.
  # A near draft covers more than 2 steps per call: speculative calls.
  near = auto(perturbed(t5, 0.02, seed=1))
  assert (near.histogram.sum(1) == near.calls).all(), near.calls
  for out in (poor, near):
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    np.testing.assert_allclose(out.scores, plain.scores, atol=1e-5)


def test_costs_are_measured_once_and_cached(tmp_path, monkeypatch):
  monkeypatch.setenv('SPEC_DECODE_CACHE_DIR', str(tmp_path))
  monkeypatch.setattr(cost_cache, '_memory', {})
  target = RowTableLM(tables=_tables(8, seed=2))
  draft = sd.TableLM.random(8, seed=5)
  settings = beam_search_lib.BeamSettings(
    num_beams=2, alpha=0.6, max_decode_len=12
  )
  layout = draft_trees.TreeLayout(gamma=2, width=1, children=2)
  args = (target, draft, jnp.asarray(ENC), settings, layout)
  seconds, info = beam_costs.iteration_seconds(*args)
  assert info['measured'] and len(list(tmp_path.iterdir())) == 1
  assert 0 < seconds[0] <= seconds[1] < 1.0, seconds
  # Another process reads the file.
  monkeypatch.setattr(cost_cache, '_memory', {})
  again, info = beam_costs.iteration_seconds(*args)
  assert again == seconds and not info['measured']
  out = sd.beam_search(
    target,
    ENC,
    num_beams=2,
    alpha=0.6,
    max_decode_len=12,
    draft=draft,
    gamma='auto',
  )
  assert out.iteration_seconds == seconds


def test_bad_auto_settings():
  target = RowTableLM(tables=_tables(8, seed=2))
  draft = sd.TableLM.random(8, seed=5)
  with pytest.raises(ValueError, match='max_auto_gamma'):
    sd.beam_search(
      target, ENC, num_beams=2, draft=draft, gamma='auto', max_auto_gamma=0
    )
  with pytest.raises(ValueError, match="or 'auto'"):
    sd.beam_search(target, ENC, num_beams=2, draft=draft, gamma='fast')

"""`spec-decode bench beam`'s pieces: the recorded beam trajectory and the
controlled-acceptance draft of speculative beam search.

Timings are `make bench`'s business; these check what the bench measures
with: the trajectory is plain beam search's, and the controlled draft
commits exactly one step per call at alpha = 0 and close to gamma + 1 at
alpha = 1, with outputs equal to plain beam search's at every alpha.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch
from conftest import perturbed
from conftest import sharpened
from conftest import tiny_config

import spec_decode as sd
from spec_decode.bench.beam import controlled as controlled_beam
from spec_decode.bench.beam import search as beam

K, GAMMA, M = 2, 2, 10


@pytest.fixture(scope='module')
def models():
  target = sharpened(sd.Model.init(tiny_config(vocab_size=64), seed=0))
  # The controlled draft's cost model: a different network.
  draft = perturbed(target, 0.5, seed=3)
  enc = encoder_batch(8, 7, 64, seed=2)
  return target, draft, enc


@pytest.fixture(scope='module')
def recorded(models):
  target, _, enc = models
  traj, tokens = controlled_beam.trajectory(target, enc, K, 0.6, M)
  return (
    traj,
    tokens,
    sd.beam_search(target, enc, num_beams=K, alpha=0.6, max_decode_len=M),
  )


def test_trajectory_is_plain_beam_search(recorded):
  traj, tokens, plain = recorded
  np.testing.assert_array_equal(tokens, plain.tokens)
  np.testing.assert_array_equal(np.asarray(traj.steps), plain.steps)
  valid = np.asarray(traj.valid)
  # A row has live beams at steps 1 .. its last step, none after.
  for b, steps in enumerate(plain.steps):
    assert valid[b, 1 : steps + 1].any(-1).all()
    assert not valid[b, steps + 1 :].any()
    assert not valid[b, 0].any()
  # Step 1 extends the start id.
  np.testing.assert_array_equal(np.asarray(traj.prev)[:, 1], 0)
  assert len(set(plain.steps.tolist())) > 1  # rows stop at different steps


def _controlled(models, recorded, alpha):
  target, draft, enc = models
  traj, _, plain = recorded
  cd = controlled_beam.ControlledBeamDraft(
    inner=draft, traj=traj, alpha=jnp.float32(alpha), key=jax.random.key(0)
  )
  out = sd.beam_search(
    target, enc, num_beams=K, alpha=0.6, max_decode_len=M, draft=cd, gamma=GAMMA
  )
  # Exact at every alpha: the draft only decides how far a call reaches.
  assert beam.same_beams(plain, out).all()
  np.testing.assert_array_equal(out.steps, plain.steps)
  return out


def test_alpha_zero_commits_one_step_per_call(models, recorded):
  out = _controlled(models, recorded, 0.0)
  np.testing.assert_array_equal(out.calls, out.steps)
  assert out.steps_per_call == 1.0


def test_alpha_one_commits_gamma_plus_one_steps(models, recorded):
  traj, _, plain = recorded
  out = _controlled(models, recorded, 1.0)
  # A row of n steps needs ceil(n / (gamma + 1)) calls when every call
  # covers its tree; a step whose parents share a last token may cost a
  # call more (its children are proposed after both), at most one each.
  full = -(-plain.steps // (GAMMA + 1))
  assert (out.calls >= full).all()
  shared = controlled_beam.shared_last_fraction(traj)
  extra = int(np.ceil(shared * plain.steps.sum())) + 1
  assert out.calls.sum() <= full.sum() + extra, (out.calls, full, shared)
  assert out.steps_per_call > 2.0


def test_half_acceptance_is_between(models, recorded):
  half = _controlled(models, recorded, 0.5)
  assert 1.0 < half.steps_per_call < GAMMA + 1


def test_shared_last_fraction_counts_steps_with_equal_last_tokens():
  # Row 0: steps 1 and 2 (M = 3); at step 1 the two beams end in 5 and 5
  # (shared), at step 2 in 6 and 7.
  m = 3
  nxt = np.zeros((1, m + 2, 2), np.int32)
  valid = np.zeros((1, m + 2, 2), bool)
  nxt[0, 1], nxt[0, 2], nxt[0, 3] = [5, 5], [6, 7], [8, 9]
  valid[0, 1:4] = True
  traj = controlled_beam.Trajectory(
    prev=jnp.zeros_like(nxt), next=nxt, valid=valid, steps=jnp.array([3])
  )
  # Parents at steps 1 and 2 (children at 2 and 3): one of two shared.
  assert controlled_beam.shared_last_fraction(traj) == 0.5
  nxt[0, 1] = [5, 4]
  traj = traj.replace(next=nxt)
  assert controlled_beam.shared_last_fraction(traj) == 0.0


def test_markdown_table_has_a_row_per_setting(models, recorded):
  _, _, plain = recorded
  row = beam.result_row('demo pair', K, GAMMA, plain, plain, 2.0, 1.0)
  assert row['speedup'] == 2.0 and row['exact'] and row['exact_rows'] == '8/8'
  table = beam.markdown([dict(row, batch=1)])
  assert table.splitlines()[2].startswith('| demo pair | 1 | 2 | 2 | 2.00 |')


def test_rank_coverage(models):
  # Ranked by the target itself, c = K always covers (a live beam is among
  # the K best non-EOS extensions of all beams, so among its parent's K
  # best); coverage grows with c; a draft that is the target ranks alike.
  from spec_decode.bench.beam import coverage as beam_coverage

  target, draft, enc = models
  k = 3
  seqs, live, steps, _ = jax.device_get(
    controlled_beam.live_sequences(target, jnp.asarray(enc), k, 0.6, M)
  )
  rows = beam_coverage.coverage_rows(
    target, target, enc, (seqs, live, steps), children=(1, 2, 3)
  )
  by = {(r['model'], r['children']): r['covered'] for r in rows}
  assert rows[0]['steps'] == int(np.maximum(steps - 1, 0).sum())
  assert by[('target', 3)] == 1.0
  assert by[('target', 1)] <= by[('target', 2)] <= 1.0
  assert by[('target', 1)] < 1.0  # Runner-ups are kept here.
  for c in (1, 2, 3):
    assert by[('draft', c)] == by[('target', c)]
  # A different draft ranks differently: c = K no longer always covers.
  other = beam_coverage.coverage_rows(
    target, draft, enc, (seqs, live, steps), children=(3,)
  )
  assert other[1]['model'] == 'draft' and other[1]['covered'] < 1.0
  assert '| 3 | target |' in beam_coverage.markdown(rows)

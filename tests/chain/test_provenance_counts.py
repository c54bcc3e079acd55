"""Provenance and counters count the same accepted draft tokens (issue 42).

A row that ends inside an iteration's accepted block (the verifier accepted
a draft EOS, or the row reached max_decode_len) outputs only part of what
the verifier accepted. The convention (docs/usage/decoding.md): draft tokens
accepted beyond a row's end are not output, so they count as accepted
nowhere: not in the histogram, the per-position counts (alpha) or tokens per
call, and the provenance has no entry for them. Checked per row for chains,
trees, gamma='auto' and tree='auto', greedy and at temperature 1, with a
draft equal to the target (every draft token accepted, so every row that
ends inside a block leaves accepted tokens behind) and a near draft (mixed
acceptance).
"""

import numpy as np
import pytest
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.chain import auto_costs
from spec_decode.core import provenance as prov
from spec_decode.core import tree_shape as tree_lib
from spec_decode.policy import cost_cache
from spec_decode.tree import auto as tree_auto

BATCH = 16
# Not a multiple of a full chain iteration (5 tokens at gamma 4) nor of a
# full (2, 2, 1) tree's (4): with every draft token accepted, rows that run
# to M stop inside their last accepted block.
M = 13
GAMMA = 4
MODES = {
  'chain': dict(gamma=GAMMA),
  'tree': dict(tree=(2, 2, 1)),
  'gamma_auto': dict(gamma='auto', max_auto_gamma=GAMMA),
  'tree_auto': dict(tree='auto'),
}
# The fixed modes' draft depth (every iteration drafts this deep).
DEPTH = {'chain': GAMMA, 'tree': 3}
# gamma='auto''s seconds per iteration at gamma 0..4, fixed instead of timed
# (timing compiles a loop per gamma, and a loaded machine's timings could
# make the policy never draft): drafting pays at the near draft's alpha.
AUTO_SECONDS = [1.0, 1.1, 1.2, 1.3, 1.4]


def _tree_seconds(target, draft, enc, settings, shapes=tree_auto.TIMED):
  """tree='auto''s seconds per iteration: 2 + 0.5 nodes + 0.25 depth."""
  del target, draft, enc, settings
  out = {}
  for branching in shapes:
    shape = tree_lib.from_branching(branching)
    out[branching] = 2.0 + 0.5 * shape.num_nodes + 0.25 * shape.depth
  return out


@pytest.fixture
def fixed_costs(monkeypatch, tmp_path):
  monkeypatch.setenv('SPEC_DECODE_CACHE_DIR', str(tmp_path))
  monkeypatch.setattr(cost_cache, '_memory', {})
  monkeypatch.setattr(auto_costs, 'measure', lambda *a, **k: AUTO_SECONDS)
  monkeypatch.setattr(tree_auto, 'iteration_seconds', _tree_seconds)


@pytest.fixture(scope='module')
def enc():
  return encoder_batch(BATCH, 7, 16, seed=4)


def _provenance_histogram(p: prov.Provenance, width: int) -> np.ndarray:
  """`[B, width]` drafting iterations per row by the ACCEPTED tokens they
  output, read from the provenance (plain gamma-0 steps are no drafting
  iteration, as in the counters)."""
  hist = np.zeros((p.codes.shape[0], width), np.int64)
  for r in range(p.codes.shape[0]):
    for it in p.iterations(r):
      kinds = [kind for _, kind, _ in it]
      if kinds != [prov.TARGET]:
        hist[r, kinds.count(prov.ACCEPTED)] += 1
  return hist


# The auto modes compile a loop per candidate; at temperature 1 they run in
# `make test-slow` (greedy covers the same counting code in `make test`).
CASES = [
  pytest.param(
    mode,
    t,
    marks=[pytest.mark.slow] if mode.endswith('auto') and t else [],
  )
  for mode in sorted(MODES)
  for t in (0.0, 1.0)
]


@pytest.mark.parametrize('mode, temperature', CASES)
def test_provenance_and_counters_agree_on_rows_ending_inside_a_block(
  target, near_draft, enc, fixed_costs, mode, temperature
):
  del fixed_costs
  # Rows that ended inside an accepted block, by EOS and by M; and (fixed
  # depth, draft == target) those that left accepted draft tokens behind.
  ends = {'eos': 0, 'max_len': 0, 'eos_left': 0, 'max_len_left': 0}
  for draft in (target, near_draft):
    out = sd.generate(
      target,
      enc,
      draft=draft,
      max_decode_len=M,
      temperature=temperature,
      seed=7,
      **MODES[mode],
    )
    s, p = out.stats, out.provenance
    kinds = [np.asarray(p.kinds(r)) for r in range(BATCH)]
    accepted = np.array([np.sum(k == prov.ACCEPTED) for k in kinds])
    width = s.row_accepted_histogram.shape[1]
    # The comparison: per-row ACCEPTED tokens against the
    # histogram's accepted count and the per-position accepts (alpha's
    # numerator counts), then the whole per-row histogram.
    np.testing.assert_array_equal(
      s.row_accepted_histogram @ np.arange(width), accepted
    )
    np.testing.assert_array_equal(s.row_position_accepts.sum(1), accepted)
    np.testing.assert_array_equal(
      s.row_accepted_histogram, _provenance_histogram(p, width)
    )
    # Draft token i was accepted in exactly the iterations that output
    # more than i accepted tokens.
    np.testing.assert_array_equal(
      s.row_position_accepts,
      np.cumsum(s.row_accepted_histogram[:, ::-1], axis=1)[:, -2::-1],
    )
    # Tokens per call: the output tokens over the iterations.
    assert [len(p.iterations(r)) for r in range(BATCH)] == (
      s.row_iterations.tolist()
    )
    assert s.tokens_per_call == pytest.approx(
      out.lengths.sum() / s.row_iterations.sum()
    )
    if mode == 'tree':
      assert out.tree['node_accepts'].sum() == accepted.sum()
    if mode == 'gamma_auto':
      assert s.row_gamma_histogram[:, 1:].any()  # The policy drafted.
    for r in range(BATCH):
      n = out.lengths[r]
      last = p.iterations(r)[-1]
      if kinds[r][-1] != prov.ACCEPTED:
        continue
      end = 'eos' if n < M else 'max_len'
      if end == 'eos':
        assert out.tokens[r, n - 1] == sd.EOS_ID
      ends[end] += 1
      if draft is target and mode in DEPTH and len(last) < DEPTH[mode]:
        # Its last iteration accepted all DEPTH draft tokens (the draft is
        # the target) and output fewer.
        ends[end + '_left'] += 1
  assert ends['eos'] > 0 and ends['max_len'] > 0, ends
  if mode in DEPTH:
    assert ends['eos_left'] > 0 and ends['max_len_left'] > 0, ends

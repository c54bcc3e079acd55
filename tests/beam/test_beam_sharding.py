"""Sharded beam search on 8 host CPU devices gives the unsharded beams.

Plain and speculative beam search with partitioned models (the rows on the
`data` axis, heads, mlp and vocabulary on `model`) must return exactly what
the unsharded models return: every beam's tokens, length and score, and the
steps and target calls of every row. The mesh test runs in the 8-device
subprocess of `test_in_subprocess` (`_mesh_util`).
"""

import numpy as np
from _mesh_util import inputs
from _mesh_util import needs_mesh
from _mesh_util import pair
from _mesh_util import rerun_on_mesh

import spec_decode as sd
from spec_decode.parallel.partitioning import Partitioner

_INNER = 'SPEC_DECODE_BEAM_SHARDING_SUBPROCESS'
_KW = dict(num_beams=2, alpha=0.6, max_decode_len=8)


def _assert_same(out: sd.BeamSearchOutput, ref: sd.BeamSearchOutput) -> None:
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  np.testing.assert_array_equal(out.steps, ref.steps)
  np.testing.assert_array_equal(out.calls, ref.calls)
  # Sharded matmuls may sum in another order: scores to float32 rounding.
  np.testing.assert_allclose(out.scores, ref.scores, rtol=1e-5, atol=1e-5)


@needs_mesh
def test_sharded_beam_search_matches_unsharded():
  target, draft = pair()
  p = Partitioner(data=2, model=4)
  sharded_target = p.shard_params(target)
  sharded_draft = p.shard_params(draft)
  # 8 rows split over data = 2; 5 rows are padded to 6 and cut back.
  for batch in (8, 5):
    enc = inputs(8)[:batch]
    ref = sd.beam_search(target, enc, **_KW)
    if batch == 8:  # (The padding is the same code for both searches.)
      _assert_same(sd.beam_search(sharded_target, enc, **_KW), ref)
    spec_kw = dict(_KW, draft=draft, gamma=2)
    spec_ref = sd.beam_search(target, enc, **spec_kw)
    spec_kw['draft'] = sharded_draft
    spec = sd.beam_search(sharded_target, enc, **spec_kw)
    _assert_same(spec, spec_ref)
    np.testing.assert_array_equal(spec.histogram, spec_ref.histogram)
    # Speculative beam search is plain beam search (tokens, steps).
    np.testing.assert_array_equal(spec.tokens, ref.tokens)
    np.testing.assert_array_equal(spec.steps, ref.steps)
    if batch == 8:
      # The case is not trivial: rows stop at different steps, and the
      # draft's beams cover some steps (the replay runs past one step).
      assert len(set(ref.steps.tolist())) > 1
      assert spec_ref.steps_per_call > 1.0


def test_in_subprocess():
  assert '1 passed' in rerun_on_mesh(__file__, _INNER)

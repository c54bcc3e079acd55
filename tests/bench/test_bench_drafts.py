"""The drafts benches' shared parts, on the suite's tiny models (their
command lines need the demo pair and the Debian data)."""

import numpy as np
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.bench.drafts import hierarchical
from spec_decode.bench.drafts import interleaved


def test_fastest_runs_returns_every_configs_outputs(target, near_draft):
  enc = encoder_batch(3, 7, 16, seed=0)
  configs = [dict(max_decode_len=8), dict(max_decode_len=8, draft=near_draft)]
  outs, seconds = interleaved.fastest_runs(target, enc, configs, repeats=2)
  assert seconds.shape == (2,) and (seconds > 0).all()
  for i in range(3):  # Speculative greedy is plain greedy, row by row.
    plain = sd.generate(target, enc[i : i + 1], max_decode_len=8)
    np.testing.assert_array_equal(outs[0][i].tokens, plain.tokens)
    np.testing.assert_array_equal(outs[1][i].tokens, plain.tokens)


def test_draft_cost_of_a_model_draft(target, near_draft):
  """c on real contexts (a broken context build once made this raise)."""
  enc = encoder_batch(2, 7, 16, seed=1)
  plain = np.random.default_rng(0).integers(2, 16, (2, 40)).astype(np.int32)
  c = hierarchical._draft_cost(  # pylint: disable=protected-access
    target, near_draft, enc, plain, np.array([30, 30]), gamma=2, repeats=1
  )
  assert np.isfinite(c) and c > 0

"""Sharded tree decoding on 8 host CPU devices gives the unsharded tokens.

The mesh test runs in the 8-device subprocess of `test_in_subprocess`
(`_mesh_util`).
"""

import numpy as np
import pytest
from _mesh_util import inputs
from _mesh_util import needs_mesh
from _mesh_util import pair
from _mesh_util import rerun_on_mesh

import spec_decode as sd
from spec_decode.parallel.partitioning import Partitioner

_INNER = 'SPEC_DECODE_TREE_SHARDING_SUBPROCESS'
TREE = (2, 2, 1)


@needs_mesh
@pytest.mark.parametrize('data,model', [(2, 4), (8, 1)])
def test_sharded_tree_matches_unsharded(data, model):
  # t = 1: the sharded program must also draw what the unsharded one does
  # (greedy is the same program without the draws).
  temperature = 1.0
  target, draft = pair()
  kw = dict(
    tree=TREE,
    temperature=temperature,
    max_decode_len=10,
    seed=np.arange(8) + 5,
  )
  ref = sd.generate(target, inputs(), draft=draft, **kw)
  p = Partitioner(data=data, model=model)
  out = sd.generate(
    p.shard_params(target), inputs(), draft=p.shard_params(draft), **kw
  )
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  np.testing.assert_array_equal(
    out.stats.row_accepted_histogram, ref.stats.row_accepted_histogram
  )
  assert len(set(ref.lengths.tolist())) > 1


def test_in_subprocess():
  assert '2 passed' in rerun_on_mesh(__file__, _INNER)

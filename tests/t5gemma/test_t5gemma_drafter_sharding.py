"""The feature draft and the early-exit self-draft on a sharded T5Gemma
target give the unsharded tokens.

A target of each version saved by transformers (`_t5gemma_util.py`)
loads into its shards with `sd.Model.load(path, partitioner=p)`; each
drafter is built on that sharded target as an eval run builds it (the
feature draft from the target's last layer with a random fusion, the
early exit from its first layer). On a (2, 4) and an (8, 1) mesh:
speculative greedy equals unsharded plain greedy, and at temperature 1
with per-row seeds the sample equals the unsharded call's token for token
(a draft's weights steer which draws are accepted, so the sample sees a
drafter that proposes otherwise on the mesh). Float32 rounding on the mesh
could still flip a draw within about 1e-6 of a boundary
(`tests/drafters/test_drafter_sharding.py`); these inputs have none. The
mesh tests run in the 8-device subprocess of `test_in_subprocess`
(`_mesh_util`).
"""

import numpy as np
import pytest
from _mesh_util import needs_mesh
from _mesh_util import rerun_on_mesh
from _t5gemma_util import ENCODER
from _t5gemma_util import hf_model
from _t5gemma_util import save

import spec_decode as sd
from spec_decode.parallel.partitioning import Partitioner

pytest.importorskip('transformers')

_INNER = 'SPEC_DECODE_T5GEMMA_DRAFTER_SHARDING_SUBPROCESS'
LENGTH = 12
MESHES = [(2, 4), (8, 1)]
DRAFTERS = ['feature', 'early_exit']


@pytest.fixture(scope='module', params=[1, 2], ids=['t5gemma', 't5gemma2'])
def target_path(request, tmp_path_factory):
  v = request.param
  return save(hf_model(v), tmp_path_factory.mktemp(f't{v}'))


def _drafter(name: str, target):
  if name == 'feature':
    return sd.drafters.FeatureDraft.init(target, num_layers=1, seed=3)
  return sd.drafters.EarlyExit.of(target, 1)


def _decode(target, drafter, temperature: float):
  return sd.generate(
    target,
    ENCODER,
    draft=drafter,
    gamma=3,
    temperature=temperature,
    max_decode_len=LENGTH,
    seed=np.arange(len(ENCODER)) + 5,
  )


@needs_mesh
@pytest.mark.parametrize('data,model', MESHES)
@pytest.mark.parametrize('name', DRAFTERS)
def test_sharded_drafter_matches_unsharded(target_path, name, data, model):
  target = sd.Model.load(target_path)
  plain = sd.generate(target, ENCODER, max_decode_len=LENGTH)
  sampled = _decode(target, _drafter(name, target), 1.0)
  sharded = sd.Model.load(target_path, partitioner=Partitioner(data, model))
  assert sharded.partitioner is not None
  drafter = _drafter(name, sharded)
  greedy = _decode(sharded, drafter, 0.0)
  np.testing.assert_array_equal(greedy.tokens, plain.tokens)
  out = _decode(sharded, drafter, 1.0)
  np.testing.assert_array_equal(out.tokens, sampled.tokens)
  np.testing.assert_array_equal(out.lengths, sampled.lengths)
  np.testing.assert_array_equal(
    out.stats.row_accepted_histogram, sampled.stats.row_accepted_histogram
  )
  # The sample is the drafter's to steer: some draws are accepted.
  assert np.sum(sampled.stats.accepted_histogram[1:]) > 0


# Two versions, two drafters, two meshes in one 8-device process: a few
# minutes on a shared 2-core CPU (`make test-slow`).
@pytest.mark.slow
def test_in_subprocess():
  stdout = rerun_on_mesh(__file__, _INNER)
  n = 2 * len(DRAFTERS) * len(MESHES)
  assert f'{n} passed' in stdout, stdout[-3000:]

"""Sharded T5Gemma decoding on 8 host CPU devices gives the unsharded
tokens.

A target and a draft of each version, saved by transformers
(`_t5gemma_util.py`: 4 query heads on 2 key/value heads), load straight
into their shards with `sd.Model.load(path, partitioner=p)`; on a 4 x 2
(`data` x `model`) mesh the query and key/value heads, MLP and vocabulary
are split over `model` and the rows over `data` (3 rows padded to 4). The
mesh tests run in the 8-device subprocess of `test_in_subprocess`
(`_mesh_util`: XLA fixes the CPU device count when JAX starts).
"""

import jax
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

_INNER = 'SPEC_DECODE_T5GEMMA_SHARDING_SUBPROCESS'
LENGTH = 12


def _spec(x: jax.Array) -> tuple:
  spec = tuple(x.sharding.spec)
  return spec + (None,) * (x.ndim - len(spec))


@pytest.fixture(scope='module', params=[1, 2], ids=['t5gemma', 't5gemma2'])
def saved(request, tmp_path_factory):
  v = request.param
  target = save(hf_model(v), tmp_path_factory.mktemp(f't{v}'))
  draft = save(
    hf_model(v, encoder_layers=1, decoder_layers=1, seed=1),
    tmp_path_factory.mktemp(f'd{v}'),
  )
  return target, draft


@needs_mesh
def test_sharded_greedy_equals_unsharded(saved):
  """Plain greedy unsharded, then speculative greedy with the target and
  the draft sharded (version 2 also: a tree with an unsharded draft, which
  is replicated onto the target's mesh)."""
  target_path, draft_path = saved
  target = sd.Model.load(target_path)
  plain = sd.generate(target, ENCODER, max_decode_len=LENGTH)

  p = Partitioner(data=4, model=2)
  s_target = sd.Model.load(target_path, partitioner=p)
  s_draft = sd.Model.load(draft_path, partitioner=p)
  layer = s_target.params['decoder']['layers_0']['attention']
  assert _spec(layer['query']['kernel']) == (None, 'model')
  assert _spec(layer['key']['kernel']) == (None, 'model')
  assert _spec(layer['out']['kernel']) == ('model', None)
  enc = p.shard_batch(np.concatenate([ENCODER, ENCODER[-1:]]))
  state = jax.jit(s_target.init_state, static_argnums=1)(enc, LENGTH)
  for keys in state.cache.keys + state.cross.keys:
    assert _spec(keys) == ('data', None, 'model', None)

  out = sd.generate(
    s_target, ENCODER, draft=s_draft, gamma=3, max_decode_len=LENGTH
  )
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  if target.config.version == 2:
    out = sd.generate(
      s_target,
      ENCODER,
      draft=sd.Model.load(draft_path),
      tree=(2, 1),
      max_decode_len=LENGTH,
    )
    np.testing.assert_array_equal(out.tokens, plain.tokens)


def test_in_subprocess():
  stdout = rerun_on_mesh(__file__, _INNER)
  assert '1 skipped' in stdout, stdout[-3000:]

"""Sharded decoding on 8 host CPU devices gives the unsharded tokens.

The mesh tests run in the 8-device subprocess of `test_in_subprocess`
(`_mesh_util`: XLA fixes the CPU device count when JAX starts).
"""

import _mesh_util
import jax
import numpy as np
import pytest
from _mesh_util import config
from _mesh_util import inputs
from _mesh_util import needs_mesh
from _mesh_util import rerun_on_mesh

import spec_decode as sd
from spec_decode.parallel import multihost
from spec_decode.parallel.partitioning import Partitioner

_INNER = 'SPEC_DECODE_SHARDING_SUBPROCESS'


@pytest.fixture(scope='module')
def pair():
  return _mesh_util.pair(eos_scale=2.0)


@pytest.fixture(scope='module')
def references(pair):
  """Unsharded outputs, greedy and sampled, keyed by temperature: the
  default call (the same seed must give the same sample on any mesh)."""
  target, draft = pair
  kw = dict(draft=draft, gamma=3, max_decode_len=10, seed=np.arange(8) + 5)
  return {
    t: sd.generate(target, inputs(), temperature=t, **kw) for t in (0.0, 1.0)
  }


def _spec(x: jax.Array) -> tuple:
  """The mesh axes of each dimension of `x` (trailing None kept)."""
  spec = tuple(x.sharding.spec)
  return spec + (None,) * (x.ndim - len(spec))


def _shard(p: Partitioner, model: sd.Model) -> sd.Model:
  return p.shard_params(model)


@needs_mesh
@pytest.mark.parametrize('data,model', [(2, 4), (8, 1)])
@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_sharded_speculative_matches_unsharded(
  pair, references, data, model, temperature
):
  target, draft = pair
  p = Partitioner(data=data, model=model)
  out = sd.generate(
    _shard(p, target),
    inputs(),
    draft=_shard(p, draft),
    gamma=3,
    temperature=temperature,
    max_decode_len=10,
    seed=np.arange(8) + 5,
  )
  ref = references[temperature]
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  np.testing.assert_array_equal(
    out.stats.accepted_histogram, ref.stats.accepted_histogram
  )
  assert len(set(ref.lengths.tolist())) > 1  # rows end at different lengths
  if temperature > 0:
    assert 0.0 < ref.stats.alpha < 1.0
    # The same q (a bfloat16 draft against a float32 one moves alpha by
    # about 1e-3; the sharded sums differ by rounding only).
    np.testing.assert_allclose(out.stats.alpha, ref.stats.alpha, rtol=1e-5)


@needs_mesh
@pytest.mark.parametrize('data,model', [(2, 4), (8, 1)])
def test_sharded_drafting_copy_rounds_as_the_unsharded_one(pair, data, model):
  """A sharded draft proposes with the unsharded drafting copy's weights."""
  _, draft = pair
  sharded = _shard(Partitioner(data=data, model=model), draft)
  copy, ref = sharded.for_drafting(), draft.for_drafting()
  assert copy is not sharded and copy.packed is None
  assert ref.packed is not None  # Unsharded: packed for the CPU kernel.
  assert copy.partitioner == sharded.partitioner
  assert sharded.for_drafting() is copy
  for a, b, s in zip(
    jax.tree.leaves(copy.params),
    jax.tree.leaves(ref.params),
    jax.tree.leaves(sharded.params),
    strict=True,
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert a.sharding == s.sharding


@needs_mesh
def test_replicated_draft_and_padded_batch(pair, references):
  """An unsharded draft is replicated; 5 rows are padded to 6 and back."""
  target, draft = pair
  p = Partitioner(data=2, model=4)
  out = sd.generate(
    _shard(p, target),
    inputs()[:5],
    draft=draft,
    gamma=3,
    temperature=1.0,
    max_decode_len=10,
    seed=np.arange(5) + 5,
  )
  ref = references[1.0]
  np.testing.assert_array_equal(out.tokens, ref.tokens[:5])
  np.testing.assert_array_equal(
    out.stats.row_iterations, ref.stats.row_iterations[:5]
  )


@needs_mesh
def test_init_in_shards_equals_unsharded_init():
  p = Partitioner(data=2, model=4)
  sharded = sd.Model.init(config(), seed=3, partitioner=p)
  plain = sd.Model.init(config(), seed=3)
  assert sharded.partitioner == p
  for a, b in zip(
    jax.tree.leaves(plain.params), jax.tree.leaves(sharded.params), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  attn = sharded.params['decoder']['layers_0']['self_attention']
  assert _spec(attn['query']['kernel']) == (None, 'model')
  assert _spec(attn['out']['kernel']) == ('model', None)
  assert _spec(sharded.params['token_embedder']['embedding']) == ('model', None)
  assert len(attn['query']['kernel'].sharding.device_set) == 8


@needs_mesh
def test_decode_state_is_sharded_on_batch_and_heads():
  p = Partitioner(data=2, model=4)
  target = sd.Model.init(config(), seed=0, partitioner=p)
  enc = p.shard_batch(inputs())
  state = jax.jit(lambda m, e: m.init_state(e, 12))(target, enc)
  assert _spec(state.cache.keys[0]) == ('data', 'model', None, None)
  assert _spec(state.cross.values[1]) == ('data', 'model', None, None)
  assert _spec(state.cross.encoder_valid) == ('data', None)
  assert _spec(state.cache.index) == ('data',)


@needs_mesh
def test_load_restores_into_shards(tmp_path, pair):
  target, _ = pair
  target.save(str(tmp_path / 'ours'))
  p = Partitioner(data=2, model=4)
  loaded = sd.Model.load(str(tmp_path / 'ours'), partitioner=p)
  assert loaded.partitioner == p
  mlp = loaded.params['encoder']['layers_0']['mlp']['wi_0']['kernel']
  assert _spec(mlp) == (None, 'model')
  for a, b in zip(
    jax.tree.leaves(target.params), jax.tree.leaves(loaded.params), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@needs_mesh
def test_global_batch_input(pair, references):
  """The multi-host input path (one process here): a global jax.Array."""
  target, draft = pair
  p = Partitioner(data=8, model=1)
  rows = inputs()[multihost.local_batch_slice(8)]
  enc = multihost.global_batch(p, rows, 8)
  assert _spec(enc) == ('data', None)
  out = sd.generate(
    _shard(p, target),
    enc,
    draft=_shard(p, draft),
    gamma=3,
    temperature=0.0,
    max_decode_len=10,
    seed=np.arange(8) + 5,
  )
  np.testing.assert_array_equal(out.tokens, references[0.0].tokens)


def test_in_subprocess():
  stdout = rerun_on_mesh(__file__, _INNER)
  # Everything but this test ran inside.
  assert '1 skipped' in stdout, stdout[-3000:]


@needs_mesh
def test_indivisible_dimension_is_replicated():
  p = Partitioner(data=2, model=4)
  assert tuple(p.mesh_axes(('batch', 'heads'), (4, 6))) == ('data', None)
  assert tuple(p.mesh_axes(('batch', 'heads'), (4, 8))) == ('data', 'model')

"""Multi-host helpers, in one process (where local means global), and the
exit code of `spec-decode` on a bad multi-process environment."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from spec_decode.parallel import multihost
from spec_decode.parallel.partitioning import Partitioner


@pytest.fixture
def clean_env(monkeypatch):
  for name in (
    'JAX_COORDINATOR_ADDRESS',
    multihost.MULTIHOST_ENV,
    'TPU_WORKER_HOSTNAMES',
  ):
    monkeypatch.delenv(name, raising=False)
  return monkeypatch


def test_initialize_is_a_noop_on_one_host(clean_env):
  assert not multihost.initialize()
  clean_env.setenv('TPU_WORKER_HOSTNAMES', 'only-host')
  assert not multihost.initialize()


def test_initialize_is_requested_by_the_environment(clean_env):
  clean_env.setenv('TPU_WORKER_HOSTNAMES', 'w0,w1,w2,w3')
  assert multihost._requested(None)
  clean_env.delenv('TPU_WORKER_HOSTNAMES')
  clean_env.setenv(multihost.MULTIHOST_ENV, '1')
  assert multihost._requested(None)
  assert multihost._requested('10.0.0.2:8476')


def test_local_batch_slice_splits_in_process_order():
  rows = [multihost.local_batch_slice(32, i, 4) for i in range(4)]
  assert rows == [slice(0, 8), slice(8, 16), slice(16, 24), slice(24, 32)]
  assert multihost.local_batch_slice(6) == slice(0, 6)
  with pytest.raises(ValueError, match='does not split'):
    multihost.local_batch_slice(10, 0, 4)


def test_global_batch_and_gather_round_trip():
  p = Partitioner()
  rows = np.arange(12, dtype=np.int32).reshape(4, 3)
  x = multihost.global_batch(p, rows)
  assert x.shape == (4, 3) and not multihost.is_global(x)
  np.testing.assert_array_equal(multihost.local_data(x), rows)
  tree = multihost.to_host({'a': x, 'b': jax.numpy.ones(2)})
  assert isinstance(tree['a'], np.ndarray)
  np.testing.assert_array_equal(tree['a'], rows)
  np.testing.assert_array_equal(tree['b'], np.ones(2))


def test_partitioner_rules_and_validation():
  p = Partitioner()
  assert p.data_size == jax.device_count() and p.model_size == 1
  assert p.mesh.axis_names == ('data', 'model')
  spec = p.mesh_axes(('embed', 'joined_kv'))
  assert tuple(spec) == (None, 'model')
  assert tuple(p.mesh_axes(('batch', 'length', 'heads', 'kv'))) == (
    'data',
    None,
    'model',
    None,
  )
  assert tuple(p.replicated().mesh_axes(('vocab', 'embed'))) == (None, None)
  with pytest.raises(ValueError, match='disagree'):
    Partitioner(model=2, num_partitions=4)
  with pytest.raises(ValueError, match='devices'):
    Partitioner(data=jax.device_count() + 1, model=1)
  assert Partitioner(model_parallel_submesh=(1, 1, 1, 1)) == p
  assert hash(Partitioner()) == hash(p)


@pytest.mark.parametrize('value', ['0', '-1', ' two '])
def test_a_bad_process_count_is_refused_before_a_start(clean_env, value):
  clean_env.setenv('JAX_NUM_PROCESSES', value)
  with pytest.raises(
    ValueError, match=r'\$JAX_NUM_PROCESSES must be an int >= 1'
  ):
    multihost.initialize()  # Refused on one host too, not ignored.
  clean_env.setenv('JAX_NUM_PROCESSES', '2')
  clean_env.setenv('JAX_PROCESS_ID', '-1')
  with pytest.raises(ValueError, match=r'\$JAX_PROCESS_ID must be an int >= 0'):
    multihost.initialize()


@pytest.mark.parametrize('value', ['0', '-1'])
def test_spec_decode_exits_2_on_a_bad_process_count(clean_env, capsys, value):
  from spec_decode import main  # pylint: disable=g-import-not-at-top

  clean_env.setenv('JAX_NUM_PROCESSES', value)
  for command in ('eval', 'infer', 'train', 'bench'):
    assert main.run([command, '--gin_file=configs/missing.gin']) == 2
    err = capsys.readouterr().err
    assert err == (
      f'spec-decode {command}: $JAX_NUM_PROCESSES must be an int >= 1, '
      f'got {value!r}\n'
    )


def test_spec_decode_eval_with_a_bad_process_count_exits_2_untraced():
  env = dict(os.environ, JAX_NUM_PROCESSES='two', JAX_PLATFORMS='cpu')
  env.pop('JAX_COORDINATOR_ADDRESS', None)
  done = subprocess.run(
    [sys.executable, '-m', 'spec_decode.main', 'eval'],
    env=env,
    cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 2, done.stderr
  assert done.stderr.endswith(
    "spec-decode eval: $JAX_NUM_PROCESSES must be an int >= 1, got 'two'\n"
  )
  assert 'Traceback' not in done.stderr

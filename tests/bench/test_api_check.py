"""`bench/accel/api_check`: every JAX API check passes on the CPU, and a
broken one is reported (not raised), with the checks after it still run."""

import jax
import jax.numpy as jnp

from spec_decode.bench.accel import api_check


def _raises():
  raise RuntimeError('deliberately broken')


def _long_traceback():
  raise RuntimeError('Traceback (most recent call last):' + 'x' * 2000 + 'END')


def _wrong_value():
  api_check._same(jnp.add(1, 1), 3)  # pylint: disable=protected-access


def test_every_check_passes_on_the_cpu():
  results = api_check.check()
  assert [r['api'] for r in results] == [name for name, _ in api_check.CHECKS]
  assert [r for r in results if not r['ok']] == []
  for r in results:
    assert r['error'] is None and r['seconds'] >= 0.0
    assert isinstance(r['warnings'], list)
  names = ' '.join(r['api'] for r in results)
  for api in (
    'jax.random.key',
    'fold_in',
    'split',
    'uniform',
    'categorical',
    'jax.tree.map',
    'lax.fori_loop',
    'lax.while_loop',
    'lax.scan',
    'lax.dynamic_update_slice',
    'static_argnames',
    'jax.default_matmul_precision',
    'config.jax_default_matmul_precision',
    'jax.Array.delete',
    'jax.clear_caches',
    'NamedSharding',
    'jax.block_until_ready',
    'flax.struct.dataclass',
    'lax.top_k',
    'jax.core.Tracer',
  ):
    assert api in names, api
  assert results[-1]['api'] == 'jax.clear_caches'  # drops compiled programs


def test_a_broken_check_is_reported_and_the_rest_still_run():
  first, last = api_check.CHECKS[0], api_check.CHECKS[-1]
  broken = [
    ('broken', _raises),
    ('wrong', _wrong_value),
    ('long', _long_traceback),
  ]
  results = api_check.check([first, *broken, last])
  names = [first[0]] + [name for name, _ in broken] + [last[0]]
  assert [r['api'] for r in results] == names
  assert [r['ok'] for r in results] == [True, False, False, False, True]
  assert results[1]['error'] == 'RuntimeError: deliberately broken'
  assert results[2]['error'].startswith('AssertionError: got 2, want 3')
  # A long error keeps its start and its end (where a traceback's cause is).
  long = results[3]['error']
  assert len(long) <= 600 and long.startswith('RuntimeError: Traceback')
  assert long.endswith('xxxEND')


def test_versions_name_this_jax_and_device():
  v = api_check.versions()
  assert v['jax'] == jax.__version__
  assert v['platform'] == 'cpu' and v['device_count'] == jax.device_count()
  for key in ('python', 'jaxlib', 'flax', 'numpy', 'device_kind'):
    assert isinstance(v[key], str) and v[key], key

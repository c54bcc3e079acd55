"""A tiny call of every JAX API the decode, bench and test code relies on.

Why this exists: the package pins jax/jaxlib 0.10.2, but the accelerator
machine has another JAX (0.11.x, CUDA) that cannot be explored there: a run
brings back only what a script prints. JAX's changelog between the two
removes or changes APIs (`jax.core` names, config options, `lax.top_k`'s
`is_stable`, mesh axis types, ...). `check()` calls each API we depend on
once on tiny arrays, each inside try/except, and says which work; a check
fails on an exception or when the result is not what our code assumes (e.g.
`lax.top_k` keeping the lower index of a tie first). It never raises, and
its last check, `jax.clear_caches()`, drops every compiled program. Run it
first on a new machine. It imports only the standard library, numpy, jax
and flax (never `spec_decode`), so it also runs without the package, in a
few seconds on a CPU (`main` prints a line per check; `--json` writes them):

  PYTHONPATH=spec_decode/bench/accel python -c \
    'import sys, api_check; sys.exit(api_check.main(sys.argv[1:]))' --json X
"""

import argparse
import glob
import importlib.metadata
import json
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# (api name, a function that raises when the API is missing or misbehaves).
Check = tuple[str, Callable[[], None]]
# Every check, in order of definition (`_check`); `jax.clear_caches` last.
CHECKS: list[Check] = []
_MOVING = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def _check(api: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
  """Registers the decorated function in `CHECKS` under the name `api`."""

  def register(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS.append((api, fn))
    return fn

  return register


def _expect(condition: Any, message: str) -> None:
  """Raises `AssertionError(message)` unless `condition` (kept under -O)."""
  if not condition:
    raise AssertionError(message)


def _same(got: Any, want: Any) -> None:
  got, want = np.asarray(got), np.asarray(want)
  _expect(
    got.shape == want.shape and np.array_equal(got, want),
    f'got {got.tolist()}, want {want.tolist()}',
  )


def _close(got: Any, want: Any) -> None:
  """`got` equals `want` to 1e-5: transcendentals differ a little by device."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  _expect(
    got.shape == want.shape and np.allclose(got, want, rtol=0, atol=1e-5),
    f'got {got.tolist()}, want {want.tolist()}',
  )


def _mesh_1x1() -> jax.sharding.Mesh:
  """A `('data', 'model')` mesh over the first device (as partitioning.py)."""
  devices = np.asarray(jax.devices()[:1], dtype=object).reshape(1, 1)
  return jax.sharding.Mesh(devices, ('data', 'model'))


@_check('jax.devices / device_count / process_index')
def _devices() -> None:
  _expect(jax.device_count() >= 1 and jax.local_device_count() >= 1, 'none')
  _expect(isinstance(jax.default_backend(), str), 'default_backend')
  _expect(0 <= jax.process_index() < jax.process_count(), 'process index')


@_check('jax.random.key (typed; jax.dtypes.prng_key)')
def _random_key() -> None:
  key = jax.random.key(0)
  typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
  _expect(typed and key.shape == (), f'key: {key.dtype}, {key.shape}')


@_check('jax.random.fold_in / split / key_data')
def _random_fold_in_split() -> None:
  keys = jax.random.split(jax.random.fold_in(jax.random.key(0), 7), 3)
  _expect(keys.shape == (3,), f'split shape {keys.shape}')
  data = np.asarray(jax.random.key_data(keys))
  _expect(len(np.unique(data, axis=0)) == 3, 'split repeats a key')


@_check('jax.random.wrap_key_data / key_impl')
def _random_key_data_roundtrip() -> None:
  keys = jax.random.split(jax.random.key(1), 2)
  again = jax.random.wrap_key_data(
    jax.random.key_data(keys), impl=jax.random.key_impl(keys)
  )
  _same(jax.random.key_data(again), jax.random.key_data(keys))


@_check('jax.random.uniform / normal / bernoulli')
def _random_uniform() -> None:
  @jax.jit
  def draw(key):
    a, b, c = jax.random.split(key, 3)
    u = jax.random.uniform(a, (64,), jnp.float32)
    return u, jax.random.normal(b, (3,)), jax.random.bernoulli(c, 0.0, (5,))

  u, normal, coin = draw(jax.random.key(0))
  _expect(u.dtype == jnp.float32, f'dtype {u.dtype}')
  _expect(bool(jnp.all((u >= 0) & (u < 1))), 'uniform outside [0, 1)')
  _expect(normal.shape == (3,) and not coin.any(), 'normal / bernoulli')


@_check('jax.random.categorical')
def _random_categorical() -> None:
  logits = jnp.array([-jnp.inf, 0.0, -jnp.inf], jnp.float32)
  keys = jax.random.split(jax.random.key(0), 4)
  draws = jax.jit(jax.vmap(lambda k: jax.random.categorical(k, logits)))(keys)
  _same(draws, np.ones(4, np.int32))


@_check('jax.tree.map / flatten / unflatten / leaves / structure')
def _tree() -> None:
  tree = {'a': jnp.arange(3), 'b': (jnp.ones(2), None)}
  leaves, treedef = jax.tree.flatten(tree)
  again = jax.tree.unflatten(treedef, [x * 2 for x in leaves])
  doubled = jax.tree.map(lambda x: x * 2, tree)
  _same(again['a'], doubled['a'])
  _expect(jax.tree.structure(doubled) == treedef, 'structure changed')
  _expect(len(jax.tree.leaves(doubled)) == len(leaves) == 2, 'leaves')


@_check('jax.tree_util *_with_path / keystr')
def _tree_paths() -> None:
  tree = {'a': [jnp.zeros(1), jnp.ones(1)]}
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  names = [jax.tree_util.keystr(path) for path, _ in flat]
  _expect(names == ["['a'][0]", "['a'][1]"], f'paths {names}')
  _expect(len(jax.tree_util.tree_leaves_with_path(tree)) == 2, 'leaves')
  out = jax.tree_util.tree_map_with_path(lambda p, x: x + len(p), tree)
  _same(out['a'][1], [3.0])


@_check('jax.tree_util.register_pytree_node_class / register_dataclass')
def _tree_registration() -> None:
  @jax.tree_util.register_pytree_node_class
  class Box:
    def __init__(self, x):
      self.x = x

    def tree_flatten(self):
      return (self.x,), None

    @classmethod
    def tree_unflatten(cls, _, children):
      return cls(*children)

  class Packed:
    def __init__(self, data, n):
      self.data, self.n = data, n

  jax.tree_util.register_dataclass(
    Packed, data_fields=['data'], meta_fields=['n']
  )
  f = jax.jit(lambda b, p: Box(b.x + p.data * p.n))
  _same(f(Box(jnp.ones(2)), Packed(jnp.ones(2), 3)).x, [4.0, 4.0])


@_check('jax.jit(static_argnames / static_argnums, donate_argnums)')
def _jit_static() -> None:
  f = jax.jit(lambda x, n: x * n, static_argnames=('n',))
  _same(f(jnp.ones(2), n=3), [3.0, 3.0])
  _same(f(jnp.ones(2), n=4), [4.0, 4.0])
  g = jax.jit(lambda x, n: x + n, static_argnums=(1,), donate_argnums=(0,))
  _same(g(jnp.zeros(2), 2), [2.0, 2.0])


@_check('lax.fori_loop')
def _fori_loop() -> None:
  total = jax.jit(lambda n: lax.fori_loop(0, n, lambda i, s: s + i, 0))(5)
  _expect(int(total) == 10, f'sum 0..4 = {int(total)}')


@_check('lax.while_loop')
def _while_loop() -> None:
  def run(x):
    return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2), x)

  i, v = jax.jit(run)((jnp.int32(0), jnp.float32(1)))
  _expect(int(i) == 5 and float(v) == 32.0, f'got {int(i)}, {float(v)}')


@_check('lax.scan')
def _scan() -> None:
  carry, ys = lax.scan(lambda c, x: (c + x, c + x), 0, jnp.arange(4))
  _expect(int(carry) == 6, f'carry {int(carry)}')
  _same(ys, [0, 1, 3, 6])


@_check('lax.cond / switch / map')
def _cond_switch_map() -> None:
  f = jax.jit(lambda p, x: lax.cond(p, lambda y: y + 1, lambda y: y - 1, x))
  _expect(int(f(True, 1)) == 2 and int(f(False, 1)) == 0, 'cond')
  branches = [lambda y: y, lambda y: y * 10]
  _expect(int(jax.jit(lambda i: lax.switch(i, branches, 3))(1)) == 30, 'sw')
  _same(lax.map(lambda y: y * 2, jnp.arange(3)), [0, 2, 4])


@_check('lax.dynamic_update_slice / dynamic_slice (and _in_dim)')
def _dynamic_slices() -> None:
  @jax.jit
  def run(buf, i):
    buf = lax.dynamic_update_slice(buf, jnp.full((1, 2), 7), (i, 0))
    buf = lax.dynamic_update_slice_in_dim(buf, jnp.full((1, 2), 5), i + 1, 0)
    row = lax.dynamic_slice(buf, (i, 0), (1, 2))
    return buf, row, lax.dynamic_slice_in_dim(buf, i, 2, axis=0)

  buf, row, rows = run(jnp.zeros((4, 2), jnp.int32), 1)
  _same(buf[:, 0], [0, 7, 5, 0])
  _same(row, [[7, 7]])
  _same(rows[:, 1], [7, 5])


@_check('lax.top_k (ties: lower index first)')
def _top_k_ties() -> None:
  values, index = lax.top_k(jnp.array([[1.0, 3.0, 3.0, 0.0]]), 2)
  _same(values, [[3.0, 3.0]])
  # beam/rules.py and beam/draft_trees.py rely on ties keeping the lower
  # index first (jax 0.11 added `is_stable`, True by default).
  _same(index, [[1, 2]])


@_check('lax iota / bitcast / cummax / cummin / rsqrt / stop_gradient')
def _lax_elementwise() -> None:
  @jax.jit
  def run(x):
    grad = jax.grad(lambda y: (y * lax.stop_gradient(y)).sum())(x)
    iota = lax.broadcasted_iota(jnp.int32, (2, 3), 1)[1]
    bits = lax.bitcast_convert_type(jnp.float32(1.0), jnp.uint32)
    return iota, bits, lax.cummax(x), lax.cummin(x), lax.rsqrt(x[:1]), grad

  x = jnp.array([4.0, 1.0, 3.0])
  want = ([0, 1, 2], 0x3F800000, [4.0, 4, 4], [4.0, 1, 1], [0.5], x)
  for value, expected in zip(run(x), want, strict=True):
    _close(value, expected)


@_check('lax.platform_dependent')
def _platform_dependent() -> None:
  f = jax.jit(
    lambda x: lax.platform_dependent(
      x, cpu=lambda y: y + 1, default=lambda y: y + 2
    )
  )
  want = 1 if jax.default_backend() == 'cpu' else 2
  _expect(int(f(0)) == want, f'platform_dependent gave {int(f(0))}')


@_check('jax.numpy ops, bfloat16, dot(precision=HIGHEST)')
def _numpy_ops() -> None:
  @jax.jit
  def run(x):
    return (
      jnp.take_along_axis(x, jnp.array([[2], [0]]), 1)[:, 0],
      jnp.take(x, jnp.array([1]), axis=1)[:, 0],
      jnp.einsum('ij,ij->i', x, x),
      jnp.pad(x[0, 1:2], (1, 1)),
      jnp.cumsum(x[0]),
      jnp.argmax(x, axis=1).astype(x.dtype),
      jnp.repeat(x[0, :2], 2),
      jnp.where(x > 2, x, jnp.full_like(x, -1))[1],
      jnp.clip(x[1], 3.5, 4.5),
      x[0].astype(jnp.bfloat16),
      jnp.dot(x, x.T, precision=lax.Precision.HIGHEST)[0],
    )

  got = run(jnp.arange(6, dtype=jnp.float32).reshape(2, 3))
  want = (
    [2, 3], [1, 4], [5, 50], [0, 1, 0], [0, 1, 3], [2, 2], [0, 0, 1, 1],
    [3, 4, 5], [3.5, 4, 4.5], [0, 1, 2], [5, 14],
  )  # fmt: skip
  for value, expected in zip(got, want, strict=True):
    _same(value, np.asarray(expected, np.float32))
  _expect(got[9].dtype == jnp.bfloat16, f'astype: {got[9].dtype}')


@_check('jax.nn / jax.scipy.special (gammaincc, ndtri)')
def _nn() -> None:
  @jax.jit
  def run(z):
    logits = jnp.stack([z, z])
    return (
      jax.nn.one_hot(jnp.array([1]), 3),
      jnp.exp(jax.nn.log_softmax(logits)),
      jax.nn.softmax(logits),
      jax.nn.logsumexp(logits),
      jnp.stack([jax.nn.gelu(z), jax.nn.silu(z), jax.nn.relu(z)]),
      jax.scipy.special.gammaincc(z + 1, z + 1),
      jax.scipy.special.ndtri(z + 0.5),
    )

  want = ([[0, 1, 0]], [0.5] * 2, [0.5] * 2, np.log(2), [0] * 3, np.exp(-1), 0)
  for value, expected in zip(run(jnp.float32(0.0)), want, strict=True):
    _close(value, expected)


@_check('jax.vmap / value_and_grad / vjp / custom_vjp / eval_shape')
def _transforms() -> None:
  _same(jax.vmap(lambda v: v.sum())(jnp.ones((2, 3))), [3.0, 3.0])
  value, grad = jax.value_and_grad(lambda v: (v**2).sum())(jnp.ones(2))
  _expect(float(value) == 2.0, 'value')
  _same(grad, [2.0, 2.0])
  _, pullback = jax.vjp(lambda v: v * 3, jnp.ones(2))
  _same(pullback(jnp.ones(2))[0], [3.0, 3.0])
  f = jax.custom_vjp(lambda v: v)
  f.defvjp(lambda v: (v, None), lambda _, g: (g * 5,))
  _same(jax.grad(lambda v: f(v).sum())(jnp.ones(2)), [5.0, 5.0])
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  spec = jax.ShapeDtypeStruct((2, 3), jnp.float32, sharding=sharding)
  out = jax.eval_shape(lambda x: x.sum(0), spec)
  _expect(out.shape == (3,) and out.dtype == jnp.float32, f'{out}')


@_check('jax.core.Tracer')
def _core_tracer() -> None:
  seen = []
  jax.jit(lambda x: seen.append(isinstance(x, jax.core.Tracer)) or x)(1.0)
  _expect(seen == [True], f'inside jit: {seen}')
  _expect(not isinstance(jnp.ones(1), jax.core.Tracer), 'outside jit')


@_check('jax.debug.callback / named_scope')
def _debug_callback() -> None:
  got = []
  f = jax.jit(lambda x: jax.debug.callback(lambda v: got.append(int(v)), x))
  f(jnp.int32(4))
  jax.effects_barrier()
  _expect(got == [4], f'callback saw {got}')
  with jax.named_scope('api_check'):
    _same(jax.jit(lambda x: x + 1)(1), 2)


@_check('jax.default_matmul_precision / config.jax_default_matmul_precision')
def _matmul_precision() -> None:
  before = jax.config.jax_default_matmul_precision  # bench/accel/identity.py
  _expect(before is None or isinstance(before, str), f'{before!r}')
  a = jnp.ones((2, 2), jnp.float32)
  with jax.default_matmul_precision('float32'):
    inside = jax.config.jax_default_matmul_precision
    _expect(inside == 'float32', f'inside: {inside!r}')
    _same(jax.jit(jnp.dot)(a, a), np.full((2, 2), 2.0))
  _expect(jax.config.jax_default_matmul_precision == before, 'not restored')


@_check('jax.config.read / update (conftest, multihost options)')
def _config_read_update() -> None:
  # tests/conftest.py: read, then update (here to the same value).
  before = jax.config.read('jax_disable_most_optimizations')
  jax.config.update('jax_disable_most_optimizations', before)
  _expect(isinstance(before, bool), f'{before!r}')
  _expect(jax.config.jax_enable_x64 in (True, False), 'jax_enable_x64')
  # parallel/multihost.py sets this before jax.distributed.initialize.
  _expect(hasattr(jax.config, 'jax_cpu_collectives_implementation'), 'gone')


@_check('jax.Array.delete / is_deleted')
def _array_delete() -> None:
  x = jax.block_until_ready(jnp.ones(4) + 1)
  x.delete()
  _expect(x.is_deleted(), 'not deleted')


@_check('jax.block_until_ready / device_put / device_get')
def _block_until_ready() -> None:
  out = jax.block_until_ready({'a': jnp.ones(2) * 2, 'b': [jnp.zeros(1)]})
  _same(out['a'], [2.0, 2.0])
  x = jax.device_put(np.arange(3), jax.devices()[0])
  _expect(isinstance(x, jax.Array), type(x).__name__)
  _same(jax.device_get(x), [0, 1, 2])


@_check('jax.sharding Mesh (Auto axes) / NamedSharding / PartitionSpec')
def _sharding_mesh() -> None:
  mesh, p = _mesh_1x1(), jax.sharding.PartitionSpec
  sharding = jax.sharding.NamedSharding(mesh, p('data', None))
  x = jax.device_put(jnp.ones((2, 3)), sharding)
  _expect(x.sharding.spec == p('data', None), f'{x.sharding}')
  replicated = jax.sharding.NamedSharding(mesh, p())
  _expect(replicated.is_fully_replicated, 'P() not replicated')
  _expect(dict(mesh.shape) == {'data': 1, 'model': 1}, f'{mesh.shape}')
  # partitioning.py's sharding constraints assume Auto axes, a concrete
  # Mesh's default (jax 0.11 made Explicit the default of AbstractMesh).
  axis_type = getattr(jax.sharding, 'AxisType', None)
  types = tuple(getattr(mesh, 'axis_types', ()))
  _expect(axis_type is None or set(types) == {axis_type.Auto}, f'{types}')


@_check('lax.with_sharding_constraint / jax.make_array_from_*')
def _sharded_arrays() -> None:
  p = jax.sharding.PartitionSpec
  sharding = jax.sharding.NamedSharding(_mesh_1x1(), p('data', None))
  f = jax.jit(lambda x: lax.with_sharding_constraint(x * 2, sharding))
  _same(f(jnp.ones((2, 2))), np.full((2, 2), 2.0))
  rows = np.arange(6).reshape(2, 3)
  a = jax.make_array_from_callback(rows.shape, sharding, lambda i: rows[i])
  _same(a, rows)
  _same(jax.make_array_from_process_local_data(sharding, rows, None), rows)
  indices = sharding.addressable_devices_indices_map((2, 1))
  _expect(len(indices) == 1, f'{indices}')


@_check('jax.experimental mesh_utils / multihost_utils')
def _experimental() -> None:
  from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils as mu  # pylint: disable=g-import-not-at-top

  grid = mesh_utils.create_device_mesh((1, 1), jax.devices()[:1])
  _expect(np.shape(grid) == (1, 1), f'{np.shape(grid)}')
  gathered = np.asarray(mu.process_allgather(np.array([1, 2])))
  _expect(gathered.reshape(-1).tolist() == [1, 2], f'{gathered.tolist()}')
  _expect(int(mu.broadcast_one_to_all(np.int64(3))) == 3, 'broadcast')


@_check('jax.distributed.is_initialized / initialize / shutdown')
def _distributed() -> None:
  _expect(isinstance(jax.distributed.is_initialized(), bool), 'not a bool')
  for name in ('initialize', 'shutdown'):
    _expect(callable(getattr(jax.distributed, name)), name)


@_check('jax.ffi include_dir / ffi_call / register_ffi_target / pycapsule')
def _ffi() -> None:
  # kernels/build.py compiles against the headers (and says so if absent).
  _expect(isinstance(jax.ffi.include_dir(), str), 'include_dir')
  for name in ('ffi_call', 'register_ffi_target', 'pycapsule'):
    _expect(callable(getattr(jax.ffi, name)), name)


@_check('jax.profiler.trace / ProfileData.from_file')
def _profiler() -> None:
  _expect(callable(jax.profiler.ProfileData.from_file), 'from_file')
  if jax.default_backend() != 'cpu':
    return  # bench/profile.py traces the CPU only (a GPU trace needs CUPTI).
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp):
      jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.ones(2)))
    paths = glob.glob(os.path.join(tmp, '**', '*.xplane.pb'), recursive=True)
    _expect(paths, 'no .xplane.pb written')
    data = jax.profiler.ProfileData.from_file(paths[0])
    _expect(len(list(data.planes)) > 0, 'no planes')


@_check('flax.struct.dataclass / field(pytree_node=False)')
def _flax_struct() -> None:
  import flax.struct  # pylint: disable=g-import-not-at-top

  @flax.struct.dataclass
  class State:
    x: jax.Array
    n: int = flax.struct.field(pytree_node=False, default=2)

  out = jax.jit(lambda s: s.replace(x=s.x * s.n))(State(jnp.ones(2)))
  _same(out.x, [2.0, 2.0])
  _expect(len(jax.tree.leaves(out)) == 1, 'static field became a leaf')


@_check('flax.linen Module / with_logical_partitioning / get_partition_spec')
def _flax_linen() -> None:
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  class Dense(nn.Module):
    @nn.compact
    def __call__(self, x):
      init = nn.with_logical_partitioning(nn.initializers.ones, ('a', 'b'))
      return x @ self.param('w', init, (x.shape[-1], 2), jnp.float32)

  x = jnp.ones((1, 3))
  variables = Dense().init(jax.random.key(0), x)
  spec = nn.get_partition_spec(variables)['params']['w']
  _expect(spec == jax.sharding.PartitionSpec('a', 'b'), f'{spec}')
  _expect(isinstance(variables['params']['w'], nn.Partitioned), 'not boxed')
  _same(Dense().apply(nn.meta.unbox(variables), x), [[3.0, 3.0]])


@_check('flax.traverse_util / flax.serialization (msgpack)')
def _flax_traverse_serialization() -> None:
  import flax.serialization  # pylint: disable=g-import-not-at-top
  import flax.traverse_util  # pylint: disable=g-import-not-at-top

  flat = flax.traverse_util.flatten_dict({'a': {'b': np.arange(2)}}, sep='/')
  _expect(list(flat) == ['a/b'], f'{list(flat)}')
  back = flax.traverse_util.unflatten_dict(flat, sep='/')
  blob = flax.serialization.msgpack_serialize(back)
  _same(flax.serialization.msgpack_restore(blob)['a']['b'], [0, 1])


@_check('jax.clear_caches')
def _clear_caches() -> None:
  jax.clear_caches()  # Last: drops every compiled program.
  _same(jax.jit(lambda x: x * 2)(2), 4)


def _run_one(api: str, fn: Callable[[], None]) -> dict[str, Any]:
  t0 = time.perf_counter()
  error = None
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    try:
      fn()
    except Exception as e:  # noqa: BLE001  Reported, never raised.
      error = f'{type(e).__name__}: {e}'
  if error and len(error) > 600:  # A callback's traceback ends in its cause.
    error = f'{error[:200]} ... {error[-395:]}'
  moving = [w for w in caught if issubclass(w.category, _MOVING)]
  return {
    'api': api,
    'ok': error is None,
    'error': error,
    'seconds': time.perf_counter() - t0,
    'warnings': sorted({f'{w.category.__name__}: {w.message}' for w in moving}),
  }


def check(checks: Sequence[Check] | None = None) -> list[dict[str, Any]]:
  """Runs each check (default: `CHECKS`) in order; never raises.

  Args:
    checks: `(api name, function)` pairs; a function fails by raising.

  Returns:
    One dict per check: `api` (its name), `ok`, `error` (`'Type: message'`,
    its middle cut beyond 600 characters, or None), `seconds`, and
    `warnings`: the deprecation and future warnings the call raised.
  """
  return [_run_one(*c) for c in (CHECKS if checks is None else checks)]


def versions() -> dict[str, Any]:
  """Python, jax, jaxlib, flax, numpy, the device and plugins; never raises.

  A value that cannot be read is None; `jax_plugins` maps each installed
  jax-cuda*/jax-rocm*/libtpu* distribution to its version.
  """
  out: dict[str, Any] = {'python': platform.python_version()}
  for name in ('jax', 'jaxlib', 'flax', 'numpy'):
    try:
      out[name] = importlib.metadata.version(name)
    except Exception:  # noqa: BLE001  Not installed as a distribution.
      out[name] = None
  out.update(platform=None, device_kind=None, device_count=None, jax_plugins={})
  try:
    out['platform'] = jax.devices()[0].platform
    out['device_kind'] = jax.devices()[0].device_kind
    out['device_count'] = jax.device_count()
  except Exception:  # noqa: BLE001  No backend: left None.
    pass
  try:
    for dist in importlib.metadata.distributions():
      name = (dist.metadata['Name'] or '').lower().replace('_', '-')
      if name.startswith(('jax-cuda', 'jax-rocm', 'libtpu')):
        out['jax_plugins'][name] = dist.version
  except Exception:  # noqa: BLE001  Left as found so far.
    pass
  return out


def main(argv: Sequence[str] | None = None) -> int:
  """Prints the versions and one line per check; 1 when any check fails."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--json', help='also write the results here (JSON)')
  args = parser.parse_args(argv)
  doc = {'versions': versions(), 'checks': check()}
  print(json.dumps(doc['versions'], sort_keys=True))
  for r in doc['checks']:
    line = f'{"ok  " if r["ok"] else "FAIL"} {r["seconds"]:6.3f}s {r["api"]}'
    print(line + (f'  -- {r["error"]}' if r['error'] else ''))
    for note in r['warnings']:
      print(f'            warning: {note}')
  failed = sum(not r['ok'] for r in doc['checks'])
  print(f'api_check: {len(doc["checks"]) - failed} ok, {failed} failed')
  if args.json:
    with open(args.json, 'w', encoding='utf-8') as f:
      json.dump(doc, f, indent=1)
  return 1 if failed else 0

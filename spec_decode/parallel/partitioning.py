"""Device meshes and logical-axis sharding, in the manner of T5X.

A `Partitioner` owns a 2-D `jax.sharding.Mesh` with axes `('data', 'model')`
and a priority-ordered list of logical-axis rules. Every parameter of the T5
network is annotated with logical axis names (`network.py`: `embed`,
`joined_kv`, `mlp`, `vocab`, `heads`, `relpos_buckets`); the rules map those
names, and the names of activations and decode state (`batch`, `length`,
`heads`, `kv`), to mesh axes:

    batch -> data        vocab, mlp, heads, joined_kv -> model
    embed, kv, length, relpos_buckets, ... -> replicated

which is T5X's 1-D parameter / 1-D activation layout (Megatron-style model
parallelism on `model`, data parallelism on `data`).

How the pieces use it:
  * `Model.init(cfg, seed, partitioner=p)` initializes every parameter
    directly in its shards (one jitted init with `out_shardings`).
  * `Model.load(path, partitioner=p)` puts each tensor into its shards as it
    is read (`param_shardings_flat`).
  * `sd.generate` sees the partitioner on its models, places the encoder
    tokens and row keys with the batch on `data`, and runs the usual jitted
    loop; the models constrain their decode state (KV caches `[B, H, Dh, L]`:
    batch on `data`, heads on `model`), so the whole speculative loop is one
    sharded XLA program.
  * A small draft can be replicated on the same mesh: `p.replicated()` is a
    partitioner whose rules shard only the batch.

A dimension whose size the mesh axis does not divide (e.g. 6 heads on 4
model shards) is replicated instead, with a log message.

Gin: the knobs (`num_partitions`, `model_parallel_submesh`, `rules`) are
plain constructor arguments; entry points wrap `Partitioner` with
`gin.external_configurable`, the library has no gin decorators.
"""

import logging
import math
from collections.abc import Sequence
from typing import Any

import flax.traverse_util
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from spec_decode.checkpoints import assemble
from spec_decode.t5 import network
from spec_decode.t5.config import T5Config
from spec_decode.t5gemma import network as t5gemma_network
from spec_decode.t5gemma.config import T5GemmaConfig

DATA = 'data'
MODEL = 'model'

LogicalAxisRules = Sequence[tuple[str, str | None]]

# Logical axes of arrays that are not parameters.
TOKENS_AXES = ('batch', 'length')  # encoder tokens [B, S], masks [B, S]
ROW_AXES = ('batch',)  # row keys, cache index, lengths [B]
KV_AXES = ('batch', 'heads', 'kv', 'length')  # caches [B, H, Dh, L]
LOGITS_AXES = ('batch', 'length', 'vocab')  # logits [B, T, V]

_STATE_AXES_BY_RANK = {1: ROW_AXES, 2: TOKENS_AXES, 4: KV_AXES}

_log = logging.getLogger(__name__)


def standard_logical_axis_rules(
  additional_rules: LogicalAxisRules | None = None,
) -> tuple:
  """T5X's default rules (1-D parameter and activation partitioning).

  Args:
    additional_rules: `(logical, mesh_axis_or_None)` pairs appended after the
      defaults (earlier rules take precedence for the same logical name).

  Returns:
    A tuple of `(logical_name, mesh_axis or None)` pairs.
  """
  rules = [
    ('batch', DATA),
    ('vocab', MODEL),
    ('embed', None),
    ('mlp', MODEL),
    ('heads', MODEL),
    ('kv', None),
    ('joined_kv', MODEL),
    ('relpos_buckets', None),
    ('abspos_buckets', None),
    ('length', None),
    ('layers', None),
    ('stack', None),
    ('mlp_activations', None),
  ]
  return tuple(rules) + tuple(tuple(r) for r in additional_rules or ())


def replicated_params_rules() -> tuple:
  """Rules that shard only the batch: parameters and heads replicated."""
  return tuple(
    (name, DATA if name == 'batch' else None)
    for name, _ in standard_logical_axis_rules()
  )


def _make_mesh(data: int, model: int, devices: Sequence[Any]) -> Mesh:
  """A `(data, model)` mesh over `devices`, topology-aware when possible."""
  devices = list(devices)
  try:
    grid = mesh_utils.create_device_mesh((data, model), devices)
  except (ValueError, AssertionError, NotImplementedError):
    # A device subset or an unusual topology: plain row-major order.
    grid = np.asarray(devices, dtype=object).reshape(data, model)
  return Mesh(grid, (DATA, MODEL))


class Partitioner:
  """A `('data', 'model')` device mesh plus logical-axis rules.

  `Partitioner(data=2, model=4)` is a 2 x 4 mesh: batch rows split over 2
  groups, each group holding the model split 4 ways. T5X's knobs are also
  accepted: `num_partitions` (= `model`) or `model_parallel_submesh`
  (an `(x, y, z, cores)` tile whose product is `model`; the physical layout
  is left to `jax.experimental.mesh_utils`).

  Partitioners compare equal when mesh and rules are equal; a `Model`
  carries its partitioner as static data.
  """

  def __init__(
    self,
    data: int | None = None,
    model: int | None = None,
    *,
    num_partitions: int | None = None,
    model_parallel_submesh: Sequence[int] | None = None,
    rules: LogicalAxisRules | None = None,
    devices: Sequence[Any] | None = None,
  ):
    """Builds the mesh.

    Args:
      data: size of the `data` axis; default all devices left after `model`.
      model: size of the `model` axis; default `num_partitions`, else the
        product of `model_parallel_submesh`, else 1.
      num_partitions: T5X's name for `model`.
      model_parallel_submesh: T5X's `(x, y, z, cores)` model tile.
      rules: logical-axis rules; default `standard_logical_axis_rules()`.
      devices: the devices to use; default `jax.devices()` (the first
        `data * model` of them when both are given).

    Raises:
      ValueError: inconsistent sizes, or more devices asked for than exist.
    """
    sizes = [
      s
      for s in (
        model,
        num_partitions,
        math.prod(model_parallel_submesh) if model_parallel_submesh else None,
      )
      if s
    ]
    if len(set(sizes)) > 1:
      raise ValueError(
        f'model={model}, num_partitions={num_partitions} and '
        f'model_parallel_submesh={model_parallel_submesh} disagree'
      )
    model = sizes[0] if sizes else 1
    devices = list(jax.devices() if devices is None else devices)
    if data is None:
      if len(devices) % model:
        raise ValueError(
          f'{len(devices)} devices do not split into model '
          f'partitions of {model}'
        )
      data = len(devices) // model
    for name, value in (('data', data), ('model', model)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive int, got {value!r}')
    if data * model > len(devices):
      raise ValueError(
        f'a {data} x {model} mesh needs {data * model} '
        f'devices; {len(devices)} available'
      )
    self.mesh = _make_mesh(data, model, devices[: data * model])
    self.rules = tuple(
      tuple(r)
      for r in (standard_logical_axis_rules() if rules is None else rules)
    )

  # -- identity --------------------------------------------------------------
  def _key(self):
    return (self.mesh, self.rules)

  def __eq__(self, other) -> bool:
    return isinstance(other, Partitioner) and self._key() == other._key()

  def __hash__(self) -> int:
    return hash(self._key())

  def __repr__(self) -> str:
    return f'Partitioner(data={self.data_size}, model={self.model_size})'

  @property
  def data_size(self) -> int:
    return self.mesh.shape[DATA]

  @property
  def model_size(self) -> int:
    return self.mesh.shape[MODEL]

  def with_rules(self, rules: LogicalAxisRules) -> 'Partitioner':
    """The same mesh with other rules."""
    new = object.__new__(Partitioner)
    new.mesh = self.mesh
    new.rules = tuple(tuple(r) for r in rules)
    return new

  def replicated(self) -> 'Partitioner':
    """Same mesh, parameters replicated (for a small draft)."""
    return self.with_rules(replicated_params_rules())

  # -- logical -> mesh ------------------------------------------------------
  def mesh_axes(
    self, logical: Sequence[str | None], shape: Sequence[int] | None = None
  ) -> PartitionSpec:
    """Mesh `PartitionSpec` for an array with logical axis names.

    Rules are tried in order; a mesh axis is used at most once per array (a
    later rule for the same name may then apply). With `shape`, a dimension
    the mesh axis does not divide stays replicated.
    """
    used = set()
    spec = []
    for i, name in enumerate(logical):
      axis = None
      for rule_name, mesh_axis in self.rules:
        if rule_name == name and mesh_axis not in used:
          axis = mesh_axis
          break
      if axis is not None and shape is not None:
        size = self.mesh.shape[axis]
        if shape[i] % size:
          _log.info(
            '%s of size %d does not split %d ways on %r: replicated',
            name,
            shape[i],
            size,
            axis,
          )
          axis = None
      if axis is not None:
        used.add(axis)
      spec.append(axis)
    return PartitionSpec(*spec)

  def sharding(
    self, logical: Sequence[str | None], shape: Sequence[int] | None = None
  ) -> NamedSharding:
    return NamedSharding(self.mesh, self.mesh_axes(logical, shape))

  @property
  def replicated_sharding(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  # -- parameters ------------------------------------------------------------
  def param_shardings_flat(self, config: T5Config) -> dict[str, NamedSharding]:
    """`'a/b/kernel'` -> `NamedSharding`, from the network's logical axes
    (T5's, or T5Gemma's for a `T5GemmaConfig`)."""
    if isinstance(config, T5GemmaConfig):
      specs = t5gemma_network.param_specs(config)
      return {
        name: self.sharding(axes, shape)
        for name, (axes, shape) in specs.items()
      }
    axes = flax.traverse_util.flatten_dict(
      network.logical_axes(config), sep='/'
    )
    shapes = assemble.expected_shapes(config)
    return {
      name: self.sharding(tuple(axes[name]), shapes[name]) for name in shapes
    }

  def param_shardings(self, config: T5Config) -> Any:
    """Nested tree of `NamedSharding`s matching the parameter tree."""
    return flax.traverse_util.unflatten_dict(
      self.param_shardings_flat(config), sep='/'
    )

  def put_params(self, config: T5Config, params: Any) -> Any:
    """Moves a parameter tree into its shards."""
    return jax.device_put(params, self.param_shardings(config))

  def shard_params(self, model):
    """`model` with its parameters in their shards and this partitioner."""
    return type(model)(
      model.config,
      self.put_params(model.config, model.params),
      model.vocabulary,
      partitioner=self,
    )

  # -- activations and decode state ------------------------------------------
  def constrain(self, x: jax.Array, logical: Sequence[str | None]):
    """`with_sharding_constraint` by logical names (inside jit)."""
    return jax.lax.with_sharding_constraint(x, self.sharding(logical, x.shape))

  def constrain_state(self, state: Any, axes_by_rank=None) -> Any:
    """Constrains a decode-state pytree: every leaf has a leading batch axis.

    Rank 4 leaves are keys/values `[B, H, Dh, L]` (batch on `data`, heads on
    `model`), rank 2 `[B, S]` masks and rank 1 `[B]` indices (batch on
    `data`); other ranks are sharded on the batch only. `axes_by_rank`
    replaces those layouts (T5Gemma's `[B, L, K, Dh]`:
    `t5gemma.network.STATE_AXES_BY_RANK`).
    """

    def one(x):
      return jax.lax.with_sharding_constraint(
        x, self.state_sharding(x.shape, axes_by_rank)
      )

    return jax.tree.map(one, state)

  def state_sharding(
    self, shape: Sequence[int], axes_by_rank=None
  ) -> NamedSharding:
    """The sharding `constrain_state` gives a decode-state leaf of `shape`."""
    axes = (axes_by_rank or _STATE_AXES_BY_RANK).get(
      len(shape), ('batch',) + (None,) * (len(shape) - 1)
    )
    return self.sharding(axes, tuple(shape))

  def batch_sharding(self, ndim: int) -> NamedSharding:
    """Batch (dimension 0) on `data`, the rest replicated."""
    return NamedSharding(
      self.mesh,
      PartitionSpec(*self.mesh_axes(('batch',) + (None,) * (ndim - 1))),
    )

  def padded_batch(self, batch: int) -> int:
    """The smallest multiple of the `data` size that holds `batch` rows."""
    return -(-batch // self.data_size) * self.data_size

  def shard_batch(self, x: Any) -> jax.Array:
    """Places a host array (same value on every process) batch-sharded.

    The batch must be a multiple of the `data` size (`padded_batch`).
    """
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return jax.device_put(x, self.batch_sharding(x.ndim))
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    sharding = self.batch_sharding(x.ndim)
    return jax.make_array_from_callback(
      x.shape, sharding, lambda index: np.asarray(x[index])
    )

  def place(self, lm: Any) -> Any:
    """Puts a language model on this mesh.

    A `Model` without a partitioner gets replicated parameters (and
    `replicated()` as its partitioner, so its caches are batch-sharded); a
    sharded `Model` on another mesh is an error; any other pytree (a table
    draft, a drafter) is replicated.
    """
    if lm is None:
      return None
    own = getattr(lm, 'partitioner', None)
    if own is not None:
      if own.mesh != self.mesh:
        raise ValueError(
          f'target and draft are sharded on different meshes ({self} vs {own})'
        )
      return lm
    if hasattr(lm, 'config') and hasattr(lm, 'params'):
      return self.replicated().shard_params(lm)
    return jax.device_put(lm, self.replicated_sharding)

"""Small-K matmul `x @ W` for decoding on CPU, callable inside `jax.jit`.

Decoding multiplies a few rows (K = 1..32 tokens) by large weight matrices;
the cost is reading W. XLA:CPU's dot costs 2.5-4.5x more at K = 2..16 than at
K = 1, which eats speculative decoding's gain. `smallm.cc` reads W once for
all K rows, from a layout packed once at load time, and runs as an XLA FFI
custom call, so it works inside `lax.while_loop` / `lax.scan` with no host
round trip.

  packed = ops.pack(w)            # w: [D, N], once, at load time
  y = ops.matmul(x, packed)       # x: [..., D] -> [..., N], inside jit

Packed layouts (`Packed.data`; `Packed.n` is the logical N):
  float32:  [P, D, 16], P = ceil(N / 16): data[p, d, c] = W[d, 16p + c],
            zero where 16p + c >= N.
  bfloat16: [Q, D, 32], Q = ceil(N / 32): data[q, d, 2j + h] =
            W[d, 32q + 16h + j] rounded to bfloat16 (h in {0, 1}), zero past
            N. Products accumulate in float32 with x kept in float32.

`matmul` uses the kernel when the library is built for this machine, the
computation is lowered for CPU (`lax.platform_dependent`), and K <= `max_k`;
otherwise it computes the same product with `jnp.einsum` on the same packed
array (TPU, GPU, no compiler, or `SPEC_DECODE_KERNEL=0`).
"""

import ctypes
import dataclasses
import functools
import math
import os
import threading
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from spec_decode.kernels import build as build_lib

_TARGET_F32 = 'spec_decode_smallm_f32'
_TARGET_BF16 = 'spec_decode_smallm_bf16'
_PANEL = {np.dtype(np.float32): 16, np.dtype(ml_dtypes.bfloat16): 32}

# Above this many rows XLA's GEMM is compute-efficient and the kernel's extra
# passes over W stop paying; `matmul` falls back to einsum.
MAX_K = 32


@functools.partial(
  jax.tree_util.register_dataclass, data_fields=['data'], meta_fields=['n']
)
@dataclasses.dataclass(frozen=True)
class Packed:
  """Weights `[D, N]` in the kernel's layout (see module docstring).

  A pytree: `data` is the leaf, `n` static, so a `Packed` can sit in a
  parameter tree and pass through `jit`, `scan` and `device_put`.
  """

  data: jax.Array | np.ndarray  # [P, D, 16] float32 or [Q, D, 32] bfloat16
  n: int

  @property
  def d(self) -> int:
    return self.data.shape[-2]

  @property
  def shape(self) -> tuple[int, int]:
    """The logical shape `[D, N]` of the packed matrix."""
    return (self.d, self.n)

  @property
  def dtype(self):
    return self.data.dtype


def pack(w, dtype=jnp.float32, *, host: bool = False) -> Packed:
  """Packs `w: [D, N]` once, for `matmul`.

  Args:
    w: [D, N] weights, numpy or jax array (numpy is packed on the host, so a
      checkpoint is not held twice on the device).
    dtype: float32, or bfloat16 to halve the bytes read (weights rounded to
      bfloat16, products still accumulated in float32).
    host: keep `data` a numpy array. By default it is a jax array: a numpy
      leaf passed to a jitted function is copied in on every call.

  Returns:
    A `Packed` whose `data` has the layout in the module docstring.
  """
  dtype = np.dtype(dtype)
  if dtype not in _PANEL:
    raise ValueError(f'pack: dtype must be float32 or bfloat16, got {dtype}')
  if w.ndim != 2:
    raise ValueError(f'pack: w must be [D, N], got shape {w.shape}')
  xp = np if isinstance(w, np.ndarray) else jnp
  d, n = w.shape
  cols = _PANEL[dtype]
  panels = -(-n // cols)
  w = xp.pad(w.astype(dtype), ((0, 0), (0, panels * cols - n)))
  data = w.reshape(d, panels, cols).transpose(1, 0, 2)  # [P, D, cols]
  if cols == 32:
    # [Q, D, h, j] -> [Q, D, j, h]: a 32-bit lane j holds columns j, 16 + j.
    data = data.reshape(panels, d, 2, 16).transpose(0, 1, 3, 2)
    data = data.reshape(panels, d, 32)
  if xp is np:
    data = np.ascontiguousarray(data)
    if not host:
      data = jax.device_put(data)
  return Packed(data=data, n=n)


def unpack(packed: Packed) -> jax.Array:
  """The `[D, N]` float32 matrix `packed` represents (for tests, checks)."""
  data = jnp.asarray(packed.data).astype(jnp.float32)
  q, d, cols = data.shape
  if cols == 32:
    data = data.reshape(q, d, 16, 2).transpose(0, 1, 3, 2)
  return (
    data.reshape(q, d, cols).transpose(1, 0, 2).reshape(d, -1)[:, : packed.n]
  )


# --------------------------------------------------------------------------
# Library loading.

_lock = threading.Lock()
_state = {}  # 'lib' -> ctypes.CDLL, or 'error' -> str


def _disabled() -> bool:
  return os.environ.get('SPEC_DECODE_KERNEL', '1').lower() in (
    '0',
    'false',
    'off',
    'no',
  )


def _load():
  """Builds (if needed), loads and registers the library once; or None."""
  with _lock:
    if 'lib' in _state or 'error' in _state:
      return _state.get('lib')
    try:
      path = build_lib.build()
      lib = ctypes.CDLL(str(path))
      lib.smallm_isa.restype = ctypes.c_char_p
      lib.smallm_threads.restype = ctypes.c_int
      for name, fn in (
        (_TARGET_F32, lib.SmallmF32),
        (_TARGET_BF16, lib.SmallmBf16),
      ):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn), platform='cpu')
      if lib.smallm_isa().decode() != 'avx512':
        warnings.warn(
          'spec_decode.kernels: this CPU (or -march) has no AVX-512; the '
          f'kernel runs its {lib.smallm_isa().decode()} path, slower than '
          'the AVX-512 one.',
          stacklevel=3,
        )
      _state['lib'] = lib
    except (build_lib.BuildError, OSError, AttributeError) as e:
      _state['error'] = str(e)
      warnings.warn(
        'spec_decode.kernels: small-K matmul kernel unavailable, using '
        f'jnp.einsum instead ({e})',
        stacklevel=3,
      )
    return _state.get('lib')


def available() -> bool:
  """True if the kernel is built, loaded and not disabled by the env."""
  return not _disabled() and _load() is not None


def info() -> dict:
  """ISA and thread count of the loaded library, or why there is none."""
  if _disabled():
    return {'available': False, 'reason': 'SPEC_DECODE_KERNEL=0'}
  lib = _load()
  if lib is None:
    return {'available': False, 'reason': _state.get('error', '')}
  return {
    'available': True,
    'isa': lib.smallm_isa().decode(),
    'threads': lib.smallm_threads(),
    'library': str(build_lib.library_path()),
  }


# --------------------------------------------------------------------------
# The op.


def _einsum(x2: jax.Array, data: jax.Array, n: int) -> jax.Array:
  """`x2 @ W` straight from the packed layout: [K, D] -> [K, N] float32."""
  data = data.astype(jnp.float32)
  q, d, cols = data.shape
  if cols == 32:
    y = jnp.einsum(
      'kd,qdjh->kqhj',
      x2,
      data.reshape(q, d, 16, 2),
      precision=jax.lax.Precision.HIGHEST,
    )
  else:
    y = jnp.einsum('kd,pdc->kpc', x2, data, precision=jax.lax.Precision.HIGHEST)
  return y.reshape(x2.shape[0], q * cols)[:, :n]


def _kernel(x2: jax.Array, data: jax.Array, n: int) -> jax.Array:
  target = _TARGET_BF16 if data.dtype == jnp.bfloat16 else _TARGET_F32
  call = jax.ffi.ffi_call(
    target,
    jax.ShapeDtypeStruct((x2.shape[0], n), jnp.float32),
    # Under vmap the batch dim joins K and the packed weights get a leading
    # 1; the kernel folds both (batched weights are rejected).
    vmap_method='expand_dims',
  )
  return call(x2, data)


def matmul(
  x: jax.Array,
  packed: Packed,
  *,
  use_kernel: bool | None = None,
  max_k: int = MAX_K,
) -> jax.Array:
  """`x @ W` for `W` packed by `pack`; works inside jit, scan, while_loop.

  Args:
    x: [..., D]; all leading dims are flattened into K rows.
    packed: from `pack(w)`, w: [D, N].
    use_kernel: None = kernel when `available()`; False forces the einsum
      path (same packed input, same result up to rounding); True raises if
      the kernel is unavailable.
    max_k: rows above which the einsum path is used.

  Returns:
    [..., N], in x's dtype (computed in float32).
  """
  if x.shape[-1] != packed.d:
    raise ValueError(f'matmul: x has D={x.shape[-1]}, weights D={packed.d}')
  lead = x.shape[:-1]
  k = math.prod(lead)
  x2 = x.reshape(k, packed.d).astype(jnp.float32)
  data = jnp.asarray(packed.data)
  if use_kernel is None:
    use_kernel = available()
  elif use_kernel and not available():
    raise RuntimeError(f'matmul: kernel unavailable: {info()}')
  if use_kernel and 0 < k <= max_k and packed.n > 0:
    y = jax.lax.platform_dependent(
      x2,
      data,
      cpu=functools.partial(_kernel, n=packed.n),
      default=functools.partial(_einsum, n=packed.n),
    )
  else:
    y = _einsum(x2, data, packed.n)
  return y.reshape(*lead, packed.n).astype(x.dtype)


def pack_params(params, dtype=jnp.float32, min_elements: int = 0) -> dict:
  """Packs every 2-D `kernel` in a (nested dict) parameter tree.

  Returns a tree with the same nesting that holds only the packed kernels,
  meant for a separate Flax collection (e.g. `{'params': params, 'packed':
  pack_params(params)}`); the parameter tree itself keeps the canonical
  `[D, N]` layout, as checkpoints do. Flax boxes (`nn.Partitioned`) are
  unboxed first.

  Args:
    params: nested dict of arrays, e.g. `variables['params']`.
    dtype: float32 or bfloat16, as in `pack`.
    min_elements: leave kernels smaller than this unpacked.
  """
  out = {}
  for key, value in params.items():
    value = getattr(value, 'value', value)  # nn.Partitioned and friends
    if isinstance(value, dict) or hasattr(value, 'items'):
      sub = pack_params(value, dtype, min_elements)
      if sub:
        out[key] = sub
    elif (
      key == 'kernel'
      and getattr(value, 'ndim', 0) == 2
      and value.size >= min_elements
    ):
      out[key] = pack(
        value if isinstance(value, jax.Array) else np.asarray(value), dtype
      )
  return out

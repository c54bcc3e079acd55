"""T5X `scalable_t5` checkpoints read into our per-layer layout.

`scalable_t5` differs from `examples/t5` in three ways a checkpoint shows:
  * attention kernels are 3-D (`query [embed, heads, kv]`, `out [heads, kv,
    embed]`); ours are 2-D (`[embed, heads * kv]`, a row-major reshape);
  * every layer holds its own `relpos_bias` (`per_layer_relpos_bias`);
  * with `scan_layers = True` the layers are one stacked module
    (`encoder/encoder/...`, `decoder/decoder/...`) whose parameters carry
    the layer axis at `param_scan_axis` (1 by default: `query [embed,
    layers, heads, kv]`, a norm's `scale [embed, layers]`).

Approach: unstack at load time. Each of our `layers_i` tensors is read as
slice `i` of the stacked tensor (TensorStore reads only the chunks it
needs) and reshaped to our 2-D kernel, so a scanned checkpoint becomes the
same per-layer tree as any other, and decoding runs the unrolled layers with
the per-row cache exactly as for every model (a scanned network would have
to carry stacked caches through `lax.scan` in each decode step, for nothing
in speed: an inference step runs every layer once either way).

The layer axis is read from the stored shapes (the one axis of the size of
the stack's layer count, consistent over all stacked tensors), not from the
gin file's `param_scan_axis`; where shapes leave it open, T5X's default (1).
"""

import re

import numpy as np

from spec_decode.checkpoints import assemble
from spec_decode.checkpoints.assemble import CheckpointError
from spec_decode.checkpoints.assemble import Shape
from spec_decode.t5.config import T5Config

_LAYER = re.compile(r'^(encoder|decoder)/layers_(\d+)/(.*)$')
_DEFAULT_SCAN_AXIS = 1


def _merges(shape: Shape, want: Shape) -> bool:
  """Whether `shape` reshapes to `want` by merging neighbouring dims."""
  i = 0
  for w in want:
    p = 1
    while i < len(shape) and p < w:
      p *= shape[i]
      i += 1
    if p != w:
      return False
  return all(d == 1 for d in shape[i:])


def _without(shape: Shape, axis: int) -> Shape:
  return shape[:axis] + shape[axis + 1 :]


class T5XLayoutSource:
  """A `T5XSource` seen in our names and shapes (see the module doc)."""

  def __init__(self, source, config: T5Config):
    self._source = source
    self.description = source.description
    stored = source.shapes()
    want = assemble.expected_shapes(config)
    layers = {
      'encoder': config.num_encoder_layers,
      'decoder': config.num_decoder_layers,
    }
    self._plan = {}  # ours -> (stored name, scanned?, layer)
    stacked = {}
    for name, shape in want.items():
      m = _LAYER.match(name)
      scanned = m and f'{m[1]}/{m[1]}/{m[3]}'
      if name in stored:
        self._plan[name] = (name, False, None)
      elif scanned and scanned in stored:
        self._plan[name] = (scanned, True, int(m[2]))
        stacked[scanned] = (shape, layers[m[1]])
    self._axis = self._scan_axis(stored, stacked)
    self._shapes = {}
    used = set()
    for name, (src, scanned, _) in self._plan.items():
      shape = stored[src]
      if scanned:
        shape = _without(shape, self._axis)
      if shape != want[name] and _merges(shape, want[name]):
        shape = want[name]
      self._shapes[name] = shape
      used.add(src)
    for name in set(stored) - used:
      self._shapes[f'(T5X) {name}'] = stored[name]
    self._hint = _hint(config, stored)

  def _scan_axis(self, stored, stacked) -> int:
    axes = None
    for name, (want, n_layers) in stacked.items():
      shape = stored[name]
      ok = {
        a
        for a in range(len(shape))
        if shape[a] == n_layers and _merges(_without(shape, a), want)
      }
      axes = ok if axes is None else axes & ok
    if axes is None:
      return _DEFAULT_SCAN_AXIS
    if not axes:
      raise CheckpointError(
        f'{self.description}: the scanned (stacked) parameters have no '
        'layer axis common to all of them of the configured layer count; '
        'num_encoder_layers / num_decoder_layers disagree with the checkpoint'
      )
    return _DEFAULT_SCAN_AXIS if _DEFAULT_SCAN_AXIS in axes else min(axes)

  def shapes(self) -> dict[str, Shape]:
    return dict(self._shapes)

  def check(self, config: T5Config) -> None:
    """`assemble.check_shapes`, with a hint for a per-layer mismatch."""
    try:
      assemble.check_shapes(config, self._shapes, self.description)
    except CheckpointError as e:
      raise CheckpointError(f'{e}{self._hint}') from None

  def read(self, name: str, dtype: np.dtype) -> np.ndarray:
    src, scanned, layer = self._plan[name]
    if scanned:
      arr = self._source.read_slice(src, self._axis, layer, dtype)
    else:
      arr = self._source.read(src, dtype)
    return np.ascontiguousarray(arr.reshape(self._shapes[name]))


def _hint(config: T5Config, stored: dict[str, Shape]) -> str:
  per_layer = any(
    re.search(r'(layers_\d+|encoder/encoder|decoder/decoder)/relpos_bias', n)
    for n in stored
  )
  if per_layer and not config.per_layer_relpos_bias:
    return (
      ' (the checkpoint holds a relative position table per layer, as T5X '
      'scalable_t5 and UMT5 do: use its scalable_t5 gin file, or set '
      'T5Config.per_layer_relpos_bias=True)'
    )
  # Per stack: `encoder/relpos_bias/...` (a scanned per-layer table is
  # `encoder/encoder/relpos_bias/...`).
  if config.per_layer_relpos_bias and any(
    re.fullmatch(r'(en|de)coder/relpos_bias/rel_embedding', n) for n in stored
  ):
    return (
      ' (the checkpoint has one relative position table per stack, as '
      'examples/t5 does: set T5Config.per_layer_relpos_bias=False)'
    )
  return ''

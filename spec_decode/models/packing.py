"""The decoder's weights as the small-K CPU kernel multiplies them.

`pack_decoder` packs the weights a decoder step multiplies by (the Flax
collection `'packed'` of a `Model` on the CPU kernel, `spec_decode.kernels`);
`rounded_for_drafting` rounds the same weights to bfloat16 in the canonical
tree, for a drafting copy that is not packed (`Model.for_drafting`).
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.t5.config import T5Config

# Decoder weights `score` multiplies by, per layer (cross-attention keys and
# values are projected once per input, from many rows: not packed).
_DECODE_DENSE = (
  ('self_attention', 'query'),
  ('self_attention', 'key'),
  ('self_attention', 'value'),
  ('self_attention', 'out'),
  ('encoder_decoder_attention', 'query'),
  ('encoder_decoder_attention', 'out'),
)


def pack_decoder(config: T5Config, params: Any, dtype: Any = None) -> Any:
  """The decoder's weights in the small-K kernel's layout.

  Args:
    config: the model's config.
    params: its canonical parameter tree.
    dtype: float32 or bfloat16; default: bfloat16 if `config.param_dtype`
      is, else float32.

  Returns:
    A tree for the Flax collection `'packed'`, nested like `params`: a
    `kernels.ops.Packed` under `kernel` for every dense layer a decoder step
    uses, and the transposed embedding under `token_embedder/attend` when
    the logits are tied to it.
  """
  from spec_decode.kernels import ops  # pylint: disable=g-import-not-at-top

  if dtype is None:
    dtype = (
      jnp.bfloat16
      if jnp.dtype(config.param_dtype) == jnp.bfloat16
      else jnp.float32
    )

  def pack(w):
    return ops.pack(np.asarray(w), dtype)

  dec = params['decoder']
  packed_dec = {}
  for i in range(config.num_decoder_layers):
    layer = dec[f'layers_{i}']
    out = {}
    for block, name in _DECODE_DENSE:
      out.setdefault(block, {})[name] = {
        'kernel': pack(layer[block][name]['kernel'])
      }
    out['mlp'] = {
      name: {'kernel': pack(sub['kernel'])}
      for name, sub in layer['mlp'].items()
    }
    packed_dec[f'layers_{i}'] = out
  packed = {'decoder': packed_dec}
  if config.logits_via_embedding:
    emb = np.asarray(params['token_embedder']['embedding'])
    packed['token_embedder'] = {'attend': pack(emb.T)}
  else:
    packed_dec['logits_dense'] = {'kernel': pack(dec['logits_dense']['kernel'])}
  return packed


def rounded_for_drafting(config: T5Config, params: Any) -> Any:
  """`params` with the weights `pack_decoder` packs rounded to bfloat16
  (kept in their dtype and shards; the rest shared): what a drafting copy
  multiplies by, packed or not (`Model.for_drafting`)."""

  def packed(path) -> bool:
    names = [getattr(k, 'key', None) for k in path]
    if names[0] == 'token_embedder':
      return bool(config.logits_via_embedding)
    if names[0] != 'decoder' or names[-1] != 'kernel':
      return False
    if names[1] == 'logits_dense':
      return not config.logits_via_embedding
    return str(names[1]).startswith('layers_') and (
      names[2] == 'mlp' or tuple(names[2:4]) in _DECODE_DENSE
    )

  def round_one(path, x):
    if not packed(path) or x.dtype != jnp.float32:
      return x
    return jnp.asarray(x).astype(jnp.bfloat16).astype(x.dtype)

  return jax.tree_util.tree_map_with_path(round_one, params)

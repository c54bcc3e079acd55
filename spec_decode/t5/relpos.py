"""T5's relative position biases: log-spaced buckets and the per-head table.

One table per stack (T5, mT5: `encoder/relpos_bias`) or one per layer (T5X
`scalable_t5`, UMT5: `encoder/layers_i/relpos_bias`, with
`T5Config.per_layer_relpos_bias`); LongT5's encoder uses the same table for
its local blocks and a second one (`global_relpos_bias`) for the transient
global tokens.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from spec_decode.t5.config import T5Config


def relative_position_bucket(
  relative_position: jax.Array,
  bidirectional: bool,
  num_buckets: int,
  max_distance: int,
) -> jax.Array:
  """T5's log-spaced buckets of `key_pos - query_pos` (Mesh TF's arithmetic)."""
  n = -relative_position
  bucket = jnp.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    bucket += (n < 0).astype(n.dtype) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  n_safe = jnp.maximum(n, 1).astype(jnp.float32)
  large = max_exact + (
    jnp.log(n_safe / max_exact)
    / math.log(max_distance / max_exact)
    * (num_buckets - max_exact)
  ).astype(n.dtype)
  large = jnp.minimum(large, num_buckets - 1)
  return bucket + jnp.where(n < max_exact, n, large)


class RelativePositionBiases(nn.Module):
  """Per-head bias `[B, H, Tq, Tk]` from query and key positions."""

  config: T5Config
  bidirectional: bool

  @nn.compact
  def __call__(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """`q_pos [B, Tq]`, `k_pos [B, Tk]` int32 -> bias `[B, H, Tq, Tk]`."""
    cfg = self.config
    table = self.param(
      'rel_embedding',
      nn.with_logical_partitioning(
        nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform'),
        ('heads', 'relpos_buckets'),
      ),
      (cfg.num_heads, cfg.relative_attention_num_buckets),
      cfg.param_dtype,
    )
    buckets = relative_position_bucket(
      k_pos[:, None, :] - q_pos[:, :, None],
      self.bidirectional,
      cfg.relative_attention_num_buckets,
      cfg.relative_attention_max_distance,
    )  # [B, Tq, Tk]
    bias = jnp.take(table.astype(cfg.dtype).T, buckets, axis=0)
    return jnp.transpose(bias, (0, 3, 1, 2))

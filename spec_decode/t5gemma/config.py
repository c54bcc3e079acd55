"""`T5GemmaConfig`: the hyperparameters of T5Gemma and T5Gemma 2.

T5Gemma (version 1, adapted from Gemma 2) and T5Gemma 2 (version 2, from
Gemma 3) share one network with a few switches (`network.py`):

  * version 1: a cross-attention block per decoder layer, attention-logit
    soft-capping, one RoPE base, the encoder's and the decoder's own
    embeddings (the decoder's is the output head unless untied), the
    encoder's sliding band `|q - k| <= window`;
  * version 2: QK-norm, one merged decoder attention (self and cross keys in
    one softmax; no RoPE on the cross keys), a RoPE base per layer type, one
    embedding for encoder, decoder and head (plus the end-of-image row), the
    encoder's sliding band `-(window // 2) <= q - k < (window + 1) // 2`,
    and no attention-logit soft-cap (transformers applies none in version 2
    whatever the config says; neither do we).

Both: grouped-query attention, sliding and global layers interleaved
(`layer_types`), RMSNorm scaled by `1 + w` before and after each sublayer,
embeddings scaled by `sqrt(d)`, GeGLU with the tanh gelu, scores scaled by
`query_pre_attn_scalar ** -0.5`, final-logit soft-capping, and the decoder
starting from BOS (2) rather than T5's 0.
"""

import dataclasses
import json
from typing import Any

import jax.numpy as jnp

SLIDING = 'sliding'
GLOBAL = 'global'
LAYER_TYPES = (SLIDING, GLOBAL)

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2


@dataclasses.dataclass(frozen=True)
class Rope:
  """Rotary embedding of one layer type.

  Attributes:
    theta: the base.
    factor: linear position scaling (transformers' `'linear'` rope type:
      frequencies divided by it); 1.0 is the default rope.
  """

  theta: float = 10_000.0
  factor: float = 1.0


@dataclasses.dataclass(frozen=True)
class StackConfig:
  """One stack (encoder or decoder).

  Attributes:
    num_layers: layers.
    emb_dim: hidden size D.
    mlp_dim: GeGLU hidden size.
    num_heads: query heads H.
    num_kv_heads: key/value heads K (H a multiple of K: grouped queries).
    head_dim: Dh.
    layer_types: per layer, `SLIDING` or `GLOBAL`.
    sliding_window: the sliding layers' window W (a decoder query at
      position p sees keys p - W < k <= p); None when no layer slides.
    rope_global: the global layers' rotary embedding.
    rope_local: the sliding layers' (version 1: the same as global).
    query_pre_attn_scalar: scores are scaled by its inverse square root.
    attn_logit_softcap: tanh soft-cap of attention scores (version 1), or
      None.
    rms_eps: RMSNorm epsilon.
  """

  num_layers: int
  emb_dim: int
  mlp_dim: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  layer_types: tuple[str, ...]
  sliding_window: int | None = None
  rope_global: Rope = Rope()
  rope_local: Rope = Rope()
  query_pre_attn_scalar: float = 256.0
  attn_logit_softcap: float | None = None
  rms_eps: float = 1e-6

  def __post_init__(self):
    object.__setattr__(self, 'layer_types', tuple(self.layer_types))
    if len(self.layer_types) != self.num_layers:
      raise ValueError(
        f'{len(self.layer_types)} layer_types for {self.num_layers} layers'
      )
    unknown = set(self.layer_types) - set(LAYER_TYPES)
    if unknown:
      raise ValueError(f'unknown layer types {sorted(unknown)}')
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f'num_heads {self.num_heads} is not a multiple of num_kv_heads '
        f'{self.num_kv_heads}'
      )
    if SLIDING in self.layer_types and not self.sliding_window:
      raise ValueError('sliding layers need a sliding_window >= 1')

  @property
  def groups(self) -> int:
    """Query heads per key/value head."""
    return self.num_heads // self.num_kv_heads

  def window(self, layer_type: str) -> int | None:
    """The window of a layer type (None: global)."""
    return self.sliding_window if layer_type == SLIDING else None

  def rope(self, layer_type: str) -> Rope:
    return self.rope_local if layer_type == SLIDING else self.rope_global


def layer_pattern(num_layers: int, global_every: int) -> tuple[str, ...]:
  """transformers' default `layer_types`: every `global_every`-th layer
  global, the others sliding (T5Gemma: 2, T5Gemma 2: 6, Gemma 3's
  `sliding_window_pattern`)."""
  return tuple(
    SLIDING if (i + 1) % global_every else GLOBAL for i in range(num_layers)
  )


def pattern_stack(global_every: int, **fields) -> StackConfig:
  """A `StackConfig` with `layer_pattern`'s layer types: what the gin size
  files (`gin/models/t5gemma*/`) build, as they cannot spell out a
  42-entry tuple per size."""
  types = layer_pattern(fields['num_layers'], global_every)
  return StackConfig(layer_types=types, **fields)


@dataclasses.dataclass(frozen=True)
class T5GemmaConfig:
  """T5Gemma (version 1) or T5Gemma 2 (version 2), text only.

  Attributes:
    version: 1 (T5Gemma) or 2 (T5Gemma 2).
    vocab_size: embedding rows V.
    encoder: the encoder stack.
    decoder: the decoder stack (version 2: the encoder's width).
    final_logit_softcap: tanh soft-cap of the output logits, or None.
    tie_head: the output head is the decoder's embedding (version 2:
      always; it is also the encoder's).
    eoi_token_index: version 2's end-of-image id, whose embedding is the
      learned unscaled `eoi_embedding` row; None in version 1.
    image_token_index: version 2's image placeholder id; encoder inputs
      holding it are refused (the vision tower is not implemented).
    ring_margin: slots a sliding layer's cache keeps past its window: the
      most new tokens one decoder call may write (a chain's gamma + 1, a
      tree's nodes). Memory of the sliding layers is `window + margin - 1`
      slots per row, whatever the output length. The default 96 holds
      tree='auto''s calibration tree (76 nodes and its root), the widest
      call any decode path makes; against windows of 4096 (published
      T5Gemma and T5Gemma 2) it adds 2%.
    dtype: activation dtype.
    param_dtype: parameter dtype.
    cpu_sum_block: float32 products on the CPU sum their inner dimension in
      blocks of this many terms (`layers/dot.py`; 0: XLA's own dot).
  """

  version: int
  vocab_size: int
  encoder: StackConfig
  decoder: StackConfig
  final_logit_softcap: float | None = None
  tie_head: bool = True
  eoi_token_index: int | None = None
  image_token_index: int | None = None
  ring_margin: int = 96
  dtype: Any = 'float32'
  param_dtype: Any = 'float32'
  cpu_sum_block: int = 128

  def __post_init__(self):
    object.__setattr__(self, 'dtype', jnp.dtype(self.dtype))
    object.__setattr__(self, 'param_dtype', jnp.dtype(self.param_dtype))
    if self.version not in (1, 2):
      raise ValueError(f'version must be 1 or 2, got {self.version!r}')
    if self.version == 2:
      if not self.tie_head:
        raise ValueError('T5Gemma 2 ties its head to the embedding')
      if self.encoder.emb_dim != self.decoder.emb_dim:
        raise ValueError('T5Gemma 2 needs equal encoder and decoder widths')
    if self.ring_margin < 1:
      raise ValueError(f'ring_margin must be >= 1, got {self.ring_margin}')

  @property
  def bos_id(self) -> int:
    """The decoder's start token."""
    return BOS_ID

  @property
  def qk_norm(self) -> bool:
    return self.version == 2

  @property
  def merged_attention(self) -> bool:
    return self.version == 2

  @property
  def shared_embedding(self) -> bool:
    """One embedding for encoder, decoder and head (version 2)."""
    return self.version == 2

  def replace(self, **changes) -> 'T5GemmaConfig':
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out['dtype'] = str(self.dtype)
    out['param_dtype'] = str(self.param_dtype)
    out['family'] = 't5gemma'
    return out

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> 'T5GemmaConfig':
    d = {k: v for k, v in d.items() if k != 'family'}

    def stack(s):
      s = dict(s)
      s['rope_global'] = Rope(**s['rope_global'])
      s['rope_local'] = Rope(**s['rope_local'])
      return StackConfig(**s)

    d['encoder'], d['decoder'] = stack(d['encoder']), stack(d['decoder'])
    return cls(**d)

  @classmethod
  def from_json(cls, text: str) -> 'T5GemmaConfig':
    return cls.from_dict(json.loads(text))

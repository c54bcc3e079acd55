"""T5 hyperparameters, with the field names of T5X's `examples/t5` T5Config."""

import dataclasses
import json
from typing import Any
from typing import Sequence

import jax.numpy as jnp

from spec_decode.core.ids import EOS_ID  # noqa: F401 (re-exported)
from spec_decode.core.ids import PAD_ID  # noqa: F401
from spec_decode.core.ids import UNK_ID  # noqa: F401
from spec_decode.t5 import gin_file


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of a T5 encoder-decoder.

  The first twelve fields mean what they mean in T5X's `T5Config`. T5 v1.1 is
  `mlp_activations=('gelu', 'linear')`, `logits_via_embedding=False`; original
  T5 is `('relu',)` with `logits_via_embedding=True` (tied embeddings, logits
  scaled by `emb_dim ** -0.5`).

  The config is frozen and hashable: it is static data under `jax.jit`.
  """

  vocab_size: int
  dtype: Any = jnp.float32  # Activation dtype; logits are always float32.
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ('relu',)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  float32_attention_logits: bool = False
  # Fields T5X hard-codes in its layers; Hugging Face configs set them.
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  param_dtype: Any = jnp.float32  # Storage dtype of the weights.
  # One relative-position table per layer (T5X `scalable_t5`, HF UMT5:
  # `layers_i/relpos_bias`) instead of one per stack (`encoder/relpos_bias`).
  per_layer_relpos_bias: bool = False
  # The encoder's self-attention: 'full' (T5), or LongT5's 'local' (each
  # token sees `local_radius` tokens either side) or 'transient-global'
  # (local plus one summary token per `global_block_size` input tokens).
  encoder_attention: str = 'full'
  local_radius: int = 127
  global_block_size: int = 16
  # Decoding on the CPU backend multiplies the decoder's weights with the
  # small-K kernel (`spec_decode.kernels`) when it is built for this machine
  # (`Model` packs them at construction); False keeps XLA's dot everywhere.
  cpu_kernel: bool = True
  # Float32 products on the CPU backend sum their inner dimension in blocks
  # of this many terms (`layers/dot.py`), which keeps transformers' float32
  # precision; 0 leaves the sum to XLA (up to 512 terms in order: 1.3x the
  # error; a teacher-forcing forward pass takes ~1.36x as long with blocks on
  # a 2-core CPU, `spec-decode bench sum_blocks`).
  cpu_sum_block: int = 128

  def __post_init__(self):
    object.__setattr__(self, 'dtype', jnp.dtype(self.dtype))
    object.__setattr__(self, 'param_dtype', jnp.dtype(self.param_dtype))
    object.__setattr__(self, 'mlp_activations', tuple(self.mlp_activations))
    for name in (
      'vocab_size',
      'emb_dim',
      'num_heads',
      'head_dim',
      'mlp_dim',
      'num_encoder_layers',
      'num_decoder_layers',
      'local_radius',
      'global_block_size',
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(
          f'T5Config.{name} must be a positive int, got {value!r}'
        )
    if not isinstance(self.cpu_sum_block, int) or self.cpu_sum_block < 0:
      raise ValueError(
        'T5Config.cpu_sum_block must be an int >= 0 (0: XLA sums), got '
        f'{self.cpu_sum_block!r}'
      )
    if self.encoder_attention not in ENCODER_ATTENTIONS:
      raise ValueError(
        f'T5Config.encoder_attention must be one of {ENCODER_ATTENTIONS}, '
        f'got {self.encoder_attention!r}'
      )
    if self.per_layer_relpos_bias and self.encoder_attention != 'full':
      raise ValueError(
        'T5Config: per_layer_relpos_bias needs encoder_attention="full" '
        '(LongT5 has one table per stack)'
      )
    for act in self.mlp_activations:
      if act not in _KNOWN_ACTIVATIONS:
        raise ValueError(
          f'T5Config.mlp_activations: unknown activation '
          f'{act!r}; known: {sorted(_KNOWN_ACTIVATIONS)}'
        )

  def replace(self, **changes) -> 'T5Config':
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d['dtype'] = jnp.dtype(self.dtype).name
    d['param_dtype'] = jnp.dtype(self.param_dtype).name
    d['mlp_activations'] = list(self.mlp_activations)
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> 'T5Config':
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
      raise ValueError(f'T5Config: unknown fields {sorted(unknown)}')
    return cls(**d)

  @classmethod
  def from_json(cls, text: str) -> 'T5Config':
    return cls.from_dict(json.loads(text))

  @classmethod
  def from_gin(
    cls,
    path: str,
    bindings: Sequence[str] = (),
    search_paths: Sequence[str] = (),
    **overrides,
  ) -> 'T5Config':
    """The config a model gin file binds: ours (`models/t5_1_1/xxl.gin`, or
    the short name `t5_1_1_xxl`) or T5X's own, unchanged (t5x need not be
    installed). Reads hyperparameters only: no weights are allocated.

    Args:
      path: the gin file (see `gin_file.resolve`).
      bindings: extra bindings read after the file, e.g.
        `("ACTIVATION_DTYPE = 'bfloat16'",)`.
      search_paths: directories includes are looked up in first (T5X's
        `--gin_search_paths`).
      **overrides: fields replaced after reading (e.g. `vocab_size=64`).

    Raises:
      FileNotFoundError: the file or one it includes does not exist.
      ValueError: what the file binds cannot make a T5Config (the message
        names the binding).
    """
    model_file = cls.read_gin(path, bindings, search_paths)
    return cls.from_model_file(model_file, **overrides)

  @classmethod
  def read_gin(
    cls,
    path: str,
    bindings: Sequence[str] = (),
    search_paths: Sequence[str] = (),
  ) -> gin_file.ModelFile:
    """Everything a model gin file binds (config fields checked against
    ours, vocabulary), for callers that need more than the config."""
    names = [f.name for f in dataclasses.fields(cls)]
    return gin_file.read(path, bindings, search_paths, fields=names)

  @classmethod
  def from_model_file(
    cls, model_file: gin_file.ModelFile, **overrides
  ) -> 'T5Config':
    """The config of a read model gin file (`overrides` replace fields)."""
    fields = {**model_file.config, **overrides}
    if 'vocab_size' not in fields:
      raise ValueError(f'{model_file.path}: binds no T5Config.vocab_size')
    return cls(**fields)


ENCODER_ATTENTIONS = ('full', 'local', 'transient-global')
_KNOWN_ACTIVATIONS = frozenset(
  {'relu', 'gelu', 'gelu_exact', 'silu', 'swish', 'linear'}
)

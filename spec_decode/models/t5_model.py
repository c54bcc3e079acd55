"""`Model`: a T5 network with its weights, behind the language-model protocol.

A `Model` is a pytree: the parameter tree is its leaves; the config and the
vocabulary are static aux data. Decoding loops take it as a jit argument.

On the CPU backend a `Model` also carries the decoder's weights packed for
the small-K matmul kernel (`spec_decode.kernels`): a second child of the
pytree (so a jit argument, never a baked-in constant), applied as the Flax
collection `'packed'`. It is built when the model is constructed, if
`config.cpu_kernel` is on, the default backend is the CPU and the kernel
library is available (`SPEC_DECODE_KERNEL=0` turns it off), or explicitly
by `pack_for_cpu()`. Only decoding (`init_state`/`score`) uses it; teacher
forcing and the encoder (many rows at once) keep XLA's dot (`layers/dot.py`).
The parameter tree, and so every checkpoint, keeps the canonical layout.
"""

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checkpoints
from spec_decode.checkpoints import gin_model
from spec_decode.models.packing import pack_decoder
from spec_decode.models.packing import rounded_for_drafting
from spec_decode.models.t5gemma_model import T5GemmaModel
from spec_decode.t5 import cache as cache_lib
from spec_decode.t5 import network
from spec_decode.t5.config import PAD_ID
from spec_decode.t5.config import T5Config
from spec_decode.t5gemma.config import T5GemmaConfig


@flax.struct.dataclass(kw_only=True)
class T5DecodeState:
  """Decoding state of one batch.

  Attributes:
    cross: encoder keys/values per decoder layer, `[B, H, Dh, S]`, and the
      encoder padding mask `[B, S]`.
    cache: self-attention keys/values per layer `[B, H, Dh, L]` and the
      per-row index `[B] int32`.
  """

  cross: network.CrossAttentionKV
  cache: cache_lib.KVCache


@jax.tree_util.register_pytree_node_class
class Model:
  """T5 encoder-decoder weights plus config (and optional vocabulary).

  Attributes:
    config: the `T5Config` (static).
    params: the canonical parameter tree (T5X names and layouts).
    vocabulary: optional sentencepiece vocabulary (static).
    packed: None, or the decoder's weights packed for the CPU kernel, a
      tree for the Flax collection `'packed'` (see `pack_decoder`).
    partitioner: None, or the `spec_decode.Partitioner` (static) whose mesh
      holds the parameters in their shards; the decode state is then
      constrained to it (batch on `data`, heads on `model`). Sharded models
      are never packed.
  """

  partitioner: Any = None

  def __init__(
    self,
    config: T5Config,
    params: Any,
    vocabulary: Any = None,
    packed: Any = None,
    partitioner: Any = None,
  ):
    """Wraps weights; packs them for the CPU kernel when that is on.

    Args:
      config: hyperparameters.
      params: parameter tree.
      vocabulary: optional vocabulary.
      packed: packed decoder weights; None packs them here if
        `cpu_kernel_enabled(config)` and `params` are concrete arrays.
    """
    default_packing = (
      packed is None
      and partitioner is None
      and cpu_kernel_enabled(config)
      and _concrete(params)
    )
    if default_packing:
      packed = pack_decoder(config, params)
    self.config = config
    self.params = params
    self.vocabulary = vocabulary
    self.packed = packed
    self.partitioner = partitioner
    # Packed here by default (not by an explicit `pack_for_cpu`): drafting
    # may then repack in bfloat16 (`for_drafting`).
    self._default_packing = default_packing
    # Sharded where an unsharded model would have been packed by default:
    # drafting rounds the same weights (`for_drafting`).
    self._sharded_on_kernel = (
      packed is None
      and partitioner is not None
      and cpu_kernel_enabled(config)
      and _concrete(params)
    )
    self._drafting_copy = None

  # -- pytree ---------------------------------------------------------------
  def tree_flatten(self):
    return (self.params, self.packed), (
      self.config,
      self.vocabulary,
      self.partitioner,
    )

  @classmethod
  def tree_unflatten(cls, aux, children):
    # Not through __init__: never packs (the leaves may be tracers).
    model = object.__new__(cls)
    model.config, model.vocabulary, model.partitioner = aux
    model.params, model.packed = children
    return model

  def __repr__(self) -> str:
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.params))
    return f'Model({self.config}, {n:,} parameters)'

  # -- construction ---------------------------------------------------------
  @property
  def module(self) -> network.Transformer:
    return network.Transformer(self.config)

  @classmethod
  def init(
    cls,
    config: T5Config,
    seed: int = 0,
    vocabulary: Any = None,
    partitioner: Any = None,
  ) -> 'Model':
    """Random weights with T5X's initializers (created in their shards when
    a `partitioner` is given; the values do not depend on it)."""
    params = _init_params(config, jax.random.key(seed), partitioner)
    return cls(config, params, vocabulary, partitioner=partitioner)

  @classmethod
  def load(
    cls,
    path: str,
    partitioner: Any = None,
    *,
    config: T5Config | None = None,
    gin_file: str | None = None,
    dtype: Any = None,
    vocabulary: Any = None,
    progress: bool = False,
    search_paths: Sequence[str] = (),
  ) -> 'Model':
    """Loads our orbax directory, a Hugging Face T5 dir or a T5X checkpoint.

    A Hugging Face T5Gemma or T5Gemma 2 directory gives a `T5GemmaModel`
    (sharded too: query and key/value heads on `model`).

    Args:
      path: our directory, a Hugging Face T5 directory, or a T5X checkpoint
        (or model) directory.
      partitioner: a `Partitioner`: each tensor is restored straight into
        its shards, and the model carries the partitioner.
      config: hyperparameters; required for T5X unless `gin_file` is given.
        For our and Hugging Face directories it replaces the stored config
        (the shapes must still agree).
      gin_file: a model gin file giving the hyperparameters, instead of
        `config`: ours (`models/t5_1_1/xxl.gin`, `models/t5gemma/2b_2b.gin`)
        or T5X's own, unchanged.
        When the checkpoint stores no vocabulary (T5X), the vocabulary the
        gin file names (a local sentencepiece file, or seqio's
        ByteVocabulary) is used, size-checked before any weight is read.
      dtype: parameter storage dtype (e.g. `'bfloat16'`); default the
        config's `param_dtype` (float32). Activations follow `config.dtype`.
      vocabulary: overrides (or supplies, for T5X) the vocabulary.
      progress: show a tqdm progress bar over tensors.
      search_paths: directories the gin file's includes are looked up in
        first (T5X's `--gin_search_paths`).

    Raises:
      FileNotFoundError: `path` or a file it needs does not exist.
      CheckpointError: unknown format, corrupt file, or weights disagreeing
        with the config.
    """
    if config is not None and gin_file is not None:
      raise ValueError('pass config or gin_file, not both')
    gin_vocab = None
    if gin_file is not None:
      # A T5 or a T5Gemma model gin file (`checkpoints/gin_model.py`).
      config, gin_vocab = gin_model.read(gin_file, search_paths=search_paths)
    ckpt = checkpoints.read(
      path,
      config=config,
      dtype=dtype,
      vocabulary=vocabulary,
      progress=progress,
      shardings=partitioner.param_shardings_flat if partitioner else None,
      fallback_vocabulary=gin_vocab,
    )
    if isinstance(ckpt.config, T5GemmaConfig):
      return T5GemmaModel(
        ckpt.config, ckpt.params, ckpt.vocabulary, partitioner=partitioner
      )
    return cls(
      ckpt.config, ckpt.params, ckpt.vocabulary, partitioner=partitioner
    )

  def save(self, path: str) -> None:
    """Writes parameters (orbax), config (JSON) and vocabulary to `path`."""
    checkpoints.write(path, self.config, self.params, self.vocabulary)

  @classmethod
  def from_gin(
    cls,
    gin_file: str,
    seed: int = 0,
    vocabulary: Any = None,
    search_paths: Sequence[str] = (),
    **overrides,
  ) -> 'Model':
    """Random weights for the network a model gin file describes.

    Args:
      gin_file: ours (`models/t5_1_1/small.gin`, `t5_1_1_small`; a
        T5Gemma one, `models/t5gemma/s_s.gin`, gives a `T5GemmaModel`) or
        T5X's own model file, unchanged (`checkpoints/gin_model.py`).
      seed: seed of the initialization.
      vocabulary: the vocabulary; default the sentencepiece file the gin file
        names, when it is a local file.
      search_paths: directories includes are looked up in first.
      **overrides: config fields replaced (e.g. `vocab_size=64`).
    """
    config, gin_vocab = gin_model.read(
      gin_file, search_paths=search_paths, **overrides
    )
    if vocabulary is None:
      vocabulary = gin_vocab
    if isinstance(config, T5GemmaConfig):
      return T5GemmaModel.init(config, seed=seed, vocabulary=vocabulary)
    return cls.init(config, seed=seed, vocabulary=vocabulary)

  def param_axes(self) -> Any:
    """Logical axis names per parameter, as a tree of `PartitionSpec`s."""
    return network.logical_axes(self.config)

  def with_params(self, params: Any) -> 'Model':
    """Same config and vocabulary, new weights (moved to the device once, so
    jitted calls do not copy host arrays in on every call; packed again for
    the CPU kernel when that is on; put into their shards when sharded)."""
    if self.partitioner is not None:
      return Model(
        self.config,
        self.partitioner.put_params(self.config, params),
        self.vocabulary,
        partitioner=self.partitioner,
      )
    return Model(
      self.config, jax.tree.map(jnp.asarray, params), self.vocabulary
    )

  # -- CPU kernel -----------------------------------------------------------
  def pack_for_cpu(self, dtype: Any = None) -> 'Model':
    """This model with its decoder weights packed for the small-K kernel.

    Packs whatever the config, backend or environment say (off the CPU, or
    without the library, the packed weights are multiplied by an einsum).

    Args:
      dtype: float32 or bfloat16 (half the bytes read; weights rounded);
        default: bfloat16 if `config.param_dtype` is, else float32.
    """
    return Model(
      self.config,
      self.params,
      self.vocabulary,
      packed=pack_decoder(self.config, self.params, dtype),
    )

  def for_drafting(self) -> 'Model':
    """The copy of this model that proposes when it is a draft.

    Where the CPU kernel packed this model's decoder in float32 by default,
    the copy drafts with the weights a decoder step multiplies by (those
    `pack_decoder` packs) rounded to bfloat16: unsharded, packed in
    bfloat16 for the kernel, so a draft step reads half the bytes, which on
    a CPU halves it at small batches (the bench draft: 2.4 -> 1.4 ms at
    batch 1, 3.3 -> 2.2 ms at 8, equal at 32); sharded (never packed), the
    same rounded weights in their shards, so that a draft proposes from the
    same weights on any mesh and a seed gives the same sample sharded or
    not, up to float32 rounding (XLA's sums depend on the rows a product
    sees and on the model axis: docs/guarantees.md). The proposals can
    differ from the float32 model's by rounding; exactness does not depend
    on them, since the target checks every token. Otherwise
    (no kernel, bfloat16 weights, or packed by an explicit `pack_for_cpu`,
    e.g. `pack_for_cpu(jnp.float32)` to draft in float32) the model itself.
    Built once per model.
    """
    if getattr(self, '_drafting_copy', None) is not None:
      return self._drafting_copy
    unsharded = getattr(self, '_default_packing', False) and (
      _packed_dtype(self.packed) == jnp.float32
    )
    if not unsharded and not getattr(self, '_sharded_on_kernel', False):
      return self
    params = rounded_for_drafting(self.config, self.params)
    if unsharded:
      copy = Model(
        self.config,
        params,
        self.vocabulary,
        packed=pack_decoder(self.config, params, jnp.bfloat16),
      )
    else:
      copy = Model(
        self.config, params, self.vocabulary, partitioner=self.partitioner
      )
    self._drafting_copy = copy._drafting_copy = copy
    return copy

  def unpacked(self) -> 'Model':
    """This model without packed weights: decoding uses XLA's dot."""
    model = object.__new__(Model)
    model.config, model.params = self.config, self.params
    model.vocabulary, model.packed = self.vocabulary, None
    return model

  def _decode_variables(self) -> dict[str, Any]:
    if self.packed is None:
      return {'params': self.params}
    return {'params': self.params, network.PACKED: self.packed}

  # -- scoring --------------------------------------------------------------
  def logits(self, encoder_tokens, decoder_input_tokens) -> jax.Array:
    """Teacher-forced float32 logits `[B, T, V]`."""
    return _logits_jit(
      self,
      jnp.asarray(encoder_tokens, jnp.int32),
      jnp.asarray(decoder_input_tokens, jnp.int32),
    )

  def features(self, encoder_tokens, decoder_input_tokens) -> jax.Array:
    """Teacher-forced final decoder hidden states, float32 `[B, T, D]`.

    `features[:, t]` is the hidden state (after the final norm, before the
    vocabulary projection) from which `logits(...)[:, t]` is computed.
    """
    return _features_jit(
      self,
      jnp.asarray(encoder_tokens, jnp.int32),
      jnp.asarray(decoder_input_tokens, jnp.int32),
    )

  def log_probs(self, encoder_tokens, decoder_tokens) -> jax.Array:
    """`log p(x_t | x_<t, input)` at temperature 1, `[B, T]`.

    `decoder_tokens [B, T]` are targets; the start id 0 is prepended
    internally. Every position is scored, including padding after EOS:
    callers mask what they do not want.
    """
    return _log_probs_jit(
      self,
      jnp.asarray(encoder_tokens, jnp.int32),
      jnp.asarray(decoder_tokens, jnp.int32),
    )

  # -- language-model protocol ------------------------------------------------
  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def init_state(self, encoder_tokens: jax.Array, length: int) -> T5DecodeState:
    cfg = self.config
    cross = self.module.apply(
      self._decode_variables(),
      encoder_tokens,
      method=network.Transformer.prepare_decoder,
    )
    cache = cache_lib.KVCache.zeros(
      cfg.num_decoder_layers,
      encoder_tokens.shape[0],
      length,
      cfg.num_heads,
      cfg.head_dim,
      cfg.dtype,
    )
    return self._constrain(T5DecodeState(cross=cross, cache=cache))

  def score(self, state: T5DecodeState, tokens: jax.Array):
    logits, cache = self.module.apply(
      self._decode_variables(),
      tokens,
      state.cross,
      state.cache,
      method=network.Transformer.decode,
    )
    return logits, self._constrain(state.replace(cache=cache))

  def score_with_features(self, state: T5DecodeState, tokens: jax.Array):
    """`score`, plus the decoder's final hidden states.

    Returns:
      `logits [B, T, V]` float32, `features [B, T, D]` float32 (after the
      final norm, before the vocabulary projection: `features[:, t]`
      produced `logits[:, t]`) and the new state, as `score` returns them.
    """
    logits, features, cache = self.module.apply(
      self._decode_variables(),
      tokens,
      state.cross,
      state.cache,
      method=network.Transformer.decode,
      return_features=True,
    )
    return logits, features, self._constrain(state.replace(cache=cache))

  def score_tree(self, state: T5DecodeState, tokens: jax.Array, attention):
    """Scores tree nodes `tokens [B, T]` (`protocol.TreeLanguageModel`).

    `attention` (a static `core.tree_shape.TreeAttention`) places them in
    scratch slots with their depths' positions and an ancestor mask; the
    index is unchanged. Returns `logits [B, T, V]` and the state.
    """
    logits, _, state = self.score_tree_with_features(state, tokens, attention)
    return logits, state

  def score_tree_with_features(
    self, state: T5DecodeState, tokens: jax.Array, attention
  ):
    """`score_tree`, plus the final hidden states `[B, T, D]` float32."""
    logits, features, cache = self.module.apply(
      self._decode_variables(),
      tokens,
      state.cross,
      state.cache,
      method=network.Transformer.decode,
      return_features=True,
      tree=attention,
    )
    return logits, features, self._constrain(state.replace(cache=cache))

  def project(self, features: jax.Array) -> jax.Array:
    """Logits `[..., V]` float32 of final hidden states `[..., D]` (as
    `score_with_features` returns them): the vocabulary projection alone,
    in the activation dtype, so `project(features)` recomputes the logits
    the scoring call gave them."""
    return self.module.apply(
      self._decode_variables(),
      features.astype(self.config.dtype),
      method=network.Transformer.project,
    ).astype(jnp.float32)

  def commit_tree(
    self, state: T5DecodeState, slots: jax.Array, count: jax.Array
  ) -> T5DecodeState:
    """Moves scratch slots `index + slots[b, j]` to `index + j`, j < count,
    and advances the index by `count` (`KVCache.commit_path`)."""
    return self._constrain(
      state.replace(cache=state.cache.commit_path(slots, count))
    )

  def _constrain(self, state: T5DecodeState) -> T5DecodeState:
    if self.partitioner is None:
      return state
    return self.partitioner.constrain_state(state)

  def rollback(self, state: T5DecodeState, index: jax.Array) -> T5DecodeState:
    return state.replace(cache=state.cache.rollback(index))

  def reorder_beams(
    self, state: T5DecodeState, rows: jax.Array
  ) -> T5DecodeState:
    """Beam search's reorder (`protocol.BeamReorder`): the self-attention
    cache follows `rows [N]`; the encoder keys and values stay (`rows[i]`
    decodes the same input as row i, so they are equal)."""
    return self._constrain(state.replace(cache=state.cache.gather(rows)))


def cpu_kernel_enabled(config: T5Config) -> bool:
  """Whether a new `Model` of `config` packs its weights for the kernel.

  True when `config.cpu_kernel` is on, JAX's default backend is the CPU and
  the kernel library is built and loadable for this machine (and not turned
  off by `SPEC_DECODE_KERNEL=0`).
  """
  if not config.cpu_kernel or jax.default_backend() != 'cpu':
    return False
  from spec_decode.kernels import ops  # pylint: disable=g-import-not-at-top

  return ops.available()


def _packed_dtype(packed: Any) -> Any:
  """The dtype of packed weights (None when not packed)."""
  leaves = jax.tree.leaves(packed)
  return leaves[0].dtype if leaves else None


def _concrete(params: Any) -> bool:
  leaves = jax.tree.leaves(params)
  return bool(leaves) and all(
    isinstance(x, (np.ndarray, jax.Array))
    and not isinstance(x, jax.core.Tracer)
    for x in leaves
  )


def _init_params(
  config: T5Config, key: jax.Array, partitioner: Any = None
) -> Any:
  module = network.Transformer(config)
  if partitioner is None:
    variables = jax.jit(module.init)(key, *network.dummy_inputs())
    return nn.meta.unbox(variables['params'])
  init = lambda k: nn.meta.unbox(
    module.init(k, *network.dummy_inputs())['params']
  )
  return jax.jit(init, out_shardings=partitioner.param_shardings(config))(key)


def shift_right(tokens: jax.Array) -> jax.Array:
  """Decoder inputs from targets: start id 0, then the targets minus one."""
  start = jnp.full(tokens.shape[:-1] + (1,), PAD_ID, tokens.dtype)
  return jnp.concatenate([start, tokens[..., :-1]], axis=-1)


@jax.jit
def _logits_jit(model: Model, encoder_tokens, decoder_input_tokens):
  return model.module.apply(
    {'params': model.params}, encoder_tokens, decoder_input_tokens
  )


@jax.jit
def _features_jit(model: Model, encoder_tokens, decoder_input_tokens):
  _, features = model.module.apply(
    {'params': model.params},
    encoder_tokens,
    decoder_input_tokens,
    return_features=True,
  )
  return features


@jax.jit
def _log_probs_jit(model: Model, encoder_tokens, decoder_tokens):
  logits = _logits_jit(model, encoder_tokens, shift_right(decoder_tokens))
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.take_along_axis(logp, decoder_tokens[..., None], axis=-1)[..., 0]

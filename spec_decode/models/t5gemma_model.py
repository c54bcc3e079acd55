"""`T5GemmaModel`: a T5Gemma or T5Gemma 2 network behind the protocol.

Like the T5 `Model`, a pytree: the parameters are its leaves, the config
and the vocabulary static aux data, so decoding loops take it as a jit
argument. It scores chains (`score`) and trees (`score_tree`) of new tokens
in one call, rolls back by index, commits tree paths and reorders beams.

The loops feed T5's start id 0 as decoder input 0; the network reads the
input at position 0 as T5Gemma's BOS (2), so decoding starts where
transformers' `generate` starts.
"""

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checkpoints
from spec_decode.t5gemma import cache as cache_lib
from spec_decode.t5gemma import network
from spec_decode.t5gemma.config import T5GemmaConfig


@flax.struct.dataclass(kw_only=True)
class T5GemmaDecodeState:
  """Decoding state of one batch.

  Attributes:
    cross: encoder keys/values per decoder layer `[B, S, K, Dh]` and the
      encoder padding mask `[B, S]`.
    cache: the self-attention `RingKVCache` (global layers `[B, L, K, Dh]`,
      sliding layers `[B, min(L, W + margin - 1), K, Dh]`), its slot tables
      and the per-row index `[B] int32`.
  """

  cross: network.CrossKV
  cache: cache_lib.RingKVCache


@jax.tree_util.register_pytree_node_class
class T5GemmaModel:
  """T5Gemma weights plus config (and optional vocabulary).

  Attributes:
    config: the `T5GemmaConfig` (static).
    params: the parameter tree (`t5gemma/network.py`).
    vocabulary: optional sentencepiece vocabulary (static).
    partitioner: None, or the `spec_decode.Partitioner` (static) whose mesh
      holds the parameters (query and key/value heads, MLP and vocabulary
      on `model`); the decode state is then constrained to it (rows on
      `data`, key/value heads on `model`: `network.STATE_AXES_BY_RANK`).
  """

  def __init__(
    self,
    config: T5GemmaConfig,
    params: Any,
    vocabulary=None,
    *,
    partitioner: Any = None,
  ):
    self.config = config
    self.params = params
    self.vocabulary = vocabulary
    self.partitioner = partitioner

  # -- pytree ---------------------------------------------------------------
  def tree_flatten(self):
    return (self.params,), (self.config, self.vocabulary, self.partitioner)

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(aux[0], children[0], aux[1], partitioner=aux[2])

  def __repr__(self) -> str:
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.params))
    return f'T5GemmaModel(version {self.config.version}, {n:,} parameters)'

  @property
  def module(self) -> network.Transformer:
    return network.Transformer(self.config)

  # -- construction ---------------------------------------------------------
  @classmethod
  def init(
    cls, config: T5GemmaConfig, seed: int = 0, vocabulary: Any = None
  ) -> 'T5GemmaModel':
    """Random weights (normal 0.02 kernels, unit-normal embeddings)."""
    module = network.Transformer(config)
    variables = jax.jit(module.init)(
      jax.random.key(seed), *network.dummy_inputs()
    )
    return cls(config, nn.meta.unbox(variables['params']), vocabulary)

  @classmethod
  def load(cls, path: str, partitioner: Any = None, **kwargs) -> 'T5GemmaModel':
    """A Hugging Face T5Gemma or T5Gemma 2 directory (`Model.load` reads
    them too and hands them here); each tensor goes into its shards on
    `partitioner`'s mesh as it is read; `kwargs` as `checkpoints.read`'s."""
    shardings = partitioner.param_shardings_flat if partitioner else None
    ckpt = checkpoints.read(path, shardings=shardings, **kwargs)
    if not isinstance(ckpt.config, T5GemmaConfig):
      raise checkpoints.CheckpointError(f'{path}: not a T5Gemma checkpoint')
    return cls(
      ckpt.config, ckpt.params, ckpt.vocabulary, partitioner=partitioner
    )

  def param_axes(self) -> Any:
    """Logical axis names per parameter, as a tree of `PartitionSpec`s."""
    boxed = jax.eval_shape(
      self.module.init, jax.random.key(0), *network.dummy_inputs()
    )
    return nn.get_partition_spec(boxed)['params']

  def unpacked(self) -> 'T5GemmaModel':
    """Itself: a T5Gemma model's weights are never packed for the CPU
    kernel (what T5's `Model.unpacked` undoes), so training reads them as
    they are."""
    return self

  # -- inputs ---------------------------------------------------------------
  def check_encoder_tokens(self, tokens: np.ndarray) -> None:
    """Refuses image inputs (T5Gemma 2's vision tower is not implemented).

    Raises:
      ValueError: `tokens` hold the image placeholder id.
    """
    image = self.config.image_token_index
    if image is not None and np.any(np.asarray(tokens) == image):
      raise ValueError(
        f'encoder_tokens hold the image token id {image}: T5Gemma 2 image '
        'inputs are not supported (text only; the vision tower is not '
        'implemented)'
      )

  def _tokens(self, tokens) -> jax.Array:
    if not isinstance(tokens, jax.core.Tracer):
      self.check_encoder_tokens(np.asarray(tokens))
    return jnp.asarray(tokens, jnp.int32)

  # -- teacher forcing ------------------------------------------------------
  def logits(self, encoder_tokens, decoder_input_tokens) -> jax.Array:
    """Teacher-forced float32 logits `[B, T, V]` (input 0 read as BOS)."""
    return _logits_jit(
      self,
      self._tokens(encoder_tokens),
      jnp.asarray(decoder_input_tokens, jnp.int32),
    )

  def features(self, encoder_tokens, decoder_input_tokens) -> jax.Array:
    """Teacher-forced final decoder hidden states, float32 `[B, T, D]`."""
    return _features_jit(
      self,
      self._tokens(encoder_tokens),
      jnp.asarray(decoder_input_tokens, jnp.int32),
    )

  def log_probs(self, encoder_tokens, decoder_tokens) -> jax.Array:
    """`log p(x_t | x_<t, input)` at temperature 1, `[B, T]` (BOS is
    prepended internally; every position is scored)."""
    return _log_probs_jit(
      self,
      self._tokens(encoder_tokens),
      jnp.asarray(decoder_tokens, jnp.int32),
    )

  # -- language-model protocol ----------------------------------------------
  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def feature_size(self) -> int:
    """D of the features `score_with_features` returns."""
    return self.config.decoder.emb_dim

  def init_state(self, encoder_tokens, length: int) -> T5GemmaDecodeState:
    cfg = self.config
    cross = self.module.apply(
      {'params': self.params},
      encoder_tokens,
      method=network.Transformer.prepare_decoder,
    )
    cache = cache_lib.RingKVCache.zeros(
      cfg.decoder, encoder_tokens.shape[0], length, cfg.ring_margin, cfg.dtype
    )
    return self._constrain(T5GemmaDecodeState(cross=cross, cache=cache))

  def _constrain(self, state: T5GemmaDecodeState) -> T5GemmaDecodeState:
    if self.partitioner is None:
      return state
    return self.partitioner.constrain_state(state, network.STATE_AXES_BY_RANK)

  def _decode(self, state, tokens, tree=None):
    return self.module.apply(
      {'params': self.params},
      tokens,
      state.cross,
      state.cache,
      tree,
      method=network.Transformer.decode,
    )

  def score(self, state: T5GemmaDecodeState, tokens: jax.Array):
    logits, _, cache = self._decode(state, tokens)
    return logits, self._constrain(state.replace(cache=cache))

  def score_with_features(self, state: T5GemmaDecodeState, tokens):
    """`score`, plus the final hidden states `[B, T, D]` float32."""
    logits, features, cache = self._decode(state, tokens)
    return logits, features, self._constrain(state.replace(cache=cache))

  def score_tree(self, state: T5GemmaDecodeState, tokens, attention):
    """Scores tree nodes `tokens [B, T]` (`protocol.TreeLanguageModel`);
    the sliding window is counted from each node's own position."""
    logits, _, cache = self._decode(state, tokens, attention)
    return logits, self._constrain(state.replace(cache=cache))

  def score_tree_with_features(self, state, tokens, attention):
    """`score_tree`, plus the final hidden states `[B, T, D]` float32."""
    logits, features, cache = self._decode(state, tokens, attention)
    return logits, features, self._constrain(state.replace(cache=cache))

  def project(self, features: jax.Array) -> jax.Array:
    """Soft-capped logits `[..., V]` of final hidden states `[..., D]`."""
    return self.module.apply(
      {'params': self.params},
      features.astype(self.config.dtype),
      method=network.Transformer.project,
    ).astype(jnp.float32)

  def embed(self, tokens: jax.Array) -> jax.Array:
    """The decoder's scaled embeddings `[..., D]` of `tokens` (ids as
    given: the caller reads position 0 as BOS)."""
    return self.module.apply(
      {'params': self.params},
      tokens,
      method=network.Transformer.embed_decoder,
    )

  def commit_tree(self, state, slots, count) -> T5GemmaDecodeState:
    """Moves the accepted path to the next slots (`commit_path`)."""
    return self._constrain(
      state.replace(cache=state.cache.commit_path(slots, count))
    )

  def rollback(self, state, index) -> T5GemmaDecodeState:
    return self._constrain(state.replace(cache=state.cache.rollback(index)))

  def reorder_beams(self, state, rows) -> T5GemmaDecodeState:
    """Beam search's reorder: the self-attention cache follows `rows [N]`;
    the encoder's keys and values stay (equal across a row's beams)."""
    return self._constrain(state.replace(cache=state.cache.gather(rows)))


def shift_right(tokens: jax.Array) -> jax.Array:
  """Decoder inputs from targets: BOS, then the targets minus one."""
  start = jnp.full(tokens.shape[:-1] + (1,), 2, tokens.dtype)
  return jnp.concatenate([start, tokens[..., :-1]], axis=-1)


@jax.jit
def _logits_jit(model: T5GemmaModel, encoder_tokens, decoder_input_tokens):
  return model.module.apply(
    {'params': model.params}, encoder_tokens, decoder_input_tokens
  )[0]


@jax.jit
def _features_jit(model: T5GemmaModel, encoder_tokens, decoder_input_tokens):
  return model.module.apply(
    {'params': model.params}, encoder_tokens, decoder_input_tokens
  )[1]


@jax.jit
def _log_probs_jit(model: T5GemmaModel, encoder_tokens, decoder_tokens):
  logits = _logits_jit(model, encoder_tokens, shift_right(decoder_tokens))
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.take_along_axis(logp, decoder_tokens[..., None], axis=-1)[..., 0]

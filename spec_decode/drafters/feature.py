"""An EAGLE-style feature draft for T5 encoder-decoders.

EAGLE (Li et al. 2024) drafts with one small decoder layer over the target's
own hidden states: at decoder input t it reads the target's final hidden
state of input t - 1 and the embedding of token t, and predicts the
target's hidden state of input t, which the target's own (frozen) output
projection turns into the next-token distribution. This is that draft for
T5, with what an encoder-decoder adds:

  * the draft is `num_layers` T5 decoder layers (self-attention, then
    cross-attention, then the MLP) after a fusion `fc([embedding;
    feature])` (`[2D] -> [D]`) and before a final RMS norm, so its output
    lives where the target's features do (after the final norm);
  * its cross-attention reads the target's encoder output through the
    target's own encoder-side keys and values: draft layer i attends with
    its own query and output projections to the keys and values the target
    computed once per input for its decoder layer `cross_layers[i]`
    (default: the last `num_layers` layers). No draft encoder runs and no
    keys or values are projected or stored twice; the draft reads them
    from the target's decode state (`DraftContext.target_state`);
  * the token embedding and the output projection are the target's
    (frozen, not stored with the draft);
  * optionally a draft vocabulary (`draft_vocab`, FR-Spec / EAGLE-3): N
    token ids (the most frequent outputs of the training data), the only
    ones the draft proposes. Its logits are the N rows' of the target's
    output projection alone (`draft_logits`, N x D multiply-adds instead
    of V x D per draft token; the chain draws over the N ids); its q is
    zero at every other token, so Algorithm 1's residual max(p - q, 0)
    produces those from the target with exactly their probability;
  * optionally a narrower feed-forward (`mlp_dim` below the target's),
    started from the target layer's `mlp_dim` hidden units of largest
    weight norm (`from_target`).

Drafting (`propose`): the loop hands the draft the target's features of
the last K inputs (`DraftContext.recent_features`, K = G + 1), so every
input the last verification accepted comes with the target's own feature
(from that call, no second target call). The draft re-feeds the inputs
committed since its last call as one block: the last A + 1, A the most
tokens the previous iteration accepted (`core.drafter.accepted_bound`; G
in a chain, a tree's depth, the previous tree's after a switch to a
shallower one; A + 1 <= K), each with the target's feature of the input
before it
(overwriting what it had cached there from its own predicted features,
EAGLE's correction), takes its predicted feature of the newest input,
draws token n + 1 from `project(feature)`, and then drafts autoregressively
over its own predicted features: input n + i reads the draft's feature of
input n + i - 1. Its self-attention cache (`FeatureState`) is its own.

Exactness: `q` is the sampler's distribution of the logits each token was
drawn from, whatever the features; the features change only how often
tokens are accepted.

Trees (`propose_tree`): the same block, then one call per depth over the
internal nodes of that depth with the tree's ancestor mask
(`core.tree_draft.expand`), each node reading its parent's predicted
feature.

Checkpoint (`save`/`load`): `params/` (orbax, the draft network only),
`feature_draft.json` (its shape, `cross_layers`, the draft vocabulary's
ids (absent: the full vocabulary) and the target's config for a check at
load), and the vocabulary. Load with the target:
`FeatureDraft.load(path, target)`.
"""

import os
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.drafters import feature_t5gemma
from spec_decode.drafters import on_target
from spec_decode.kernels import ops as kernel_ops
from spec_decode.models import t5_model
from spec_decode.models import t5gemma_model
from spec_decode.t5 import cache as cache_lib
from spec_decode.t5 import network
from spec_decode.t5.config import T5Config

_MASK_VALUE = -1e10


def _bias(mask: jax.Array) -> jax.Array:
  return jnp.where(mask, 0.0, _MASK_VALUE).astype(jnp.float32)


class FeatureNet(nn.Module):
  """The draft network: fusion, T5 decoder layers, final norm.

  `config` is the target's with `num_decoder_layers` the draft's layers
  (and possibly another `mlp_dim`); `emb_dim`, `num_heads` and `head_dim`
  are the target's (the cross-attention reads the target's keys).
  """

  config: T5Config

  def setup(self):
    cfg = self.config
    self.fc = network.Dense(cfg, cfg.emb_dim, ('mlp', 'embed'))
    self.relpos_bias = network.RelativePositionBiases(cfg, False)
    self.layers = [
      network.DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)
    ]
    self.norm = network.RMSNorm(cfg)

  def __call__(
    self,
    features: jax.Array,
    embedded: jax.Array,
    cross: network.CrossAttentionKV,
    cache: cache_lib.KVCache | None = None,
    tree: Any = None,
  ):
    """Predicted features `[B, T, D]` float32 of inputs `[B, T]`.

    Args:
      features: `[B, T, D]` the feature of the input before each one.
      embedded: `[B, T, D]` the inputs' token embeddings.
      cross: per draft layer, the target's encoder-side keys and values.
      cache: None (teacher forcing: positions 0..T-1), or the draft's cache
        (positions `index + t`, index advanced by T).
      tree: a `core.tree_shape.TreeAttention` (with a cache): tree nodes in
        scratch slots, index unchanged (as `network.Decoder`).

    Returns:
      The predicted features and the new cache (None without one).
    """
    b, t = embedded.shape[:2]
    q_pos, k_pos, visible = cache_lib.self_attention_layout(cache, b, t, tree)
    self_bias = self.relpos_bias(q_pos, k_pos) + _bias(visible)
    cross_bias = _bias(cross.encoder_valid[:, None, None, :])
    dtype = self.config.dtype
    x = self.fc(
      jnp.concatenate([embedded.astype(dtype), features.astype(dtype)], -1)
    )
    x, new_cache = network.run_decoder_layers(
      self.layers, x, (self_bias, cross_bias), cross, cache, tree
    )
    return self.norm(x).astype(jnp.float32), new_cache


@flax.struct.dataclass(kw_only=True)
class FeatureState:
  """The feature draft's own state.

  Attributes:
    cache: self-attention keys and values of the draft's layers, per row
      its own index (`t5.cache.KVCache`).
  """

  cache: cache_lib.KVCache


@flax.struct.dataclass(kw_only=True)
class FeatureDraft(on_target.FeatureDrafting):
  """An EAGLE-style draft on a frozen T5 target (module docstring).

  Attributes:
    params: the draft network's parameters (`FeatureNet`).
    target: the target `Model` (frozen: its embedding, output projection
      and, through the decode state, its encoder-side keys and values).
    net_config: the draft network's `T5Config` (static).
    cross_layers: the target decoder layer whose encoder-side keys and
      values each draft layer reads (static).
    packed: None, or the network's weights packed for the CPU kernel.
    draft_vocab: None (the full vocabulary), or the draft vocabulary: `[N]`
      int32 distinct token ids, ascending (`with_draft_vocab`).
    vocab_kernel: None, or the target's output projection of those ids
      `[D, N]` float32 (a `kernels.ops.Packed` in the drafting copy).
  """

  params: Any
  target: Any
  net_config: T5Config = flax.struct.field(pytree_node=False)
  cross_layers: tuple[int, ...] = flax.struct.field(pytree_node=False)
  packed: Any = None
  draft_vocab: Any = None
  vocab_kernel: Any = None

  # -- shapes -----------------------------------------------------------------
  @property
  def num_layers(self) -> int:
    return self.net_config.num_decoder_layers

  @property
  def net(self) -> FeatureNet:
    return FeatureNet(self.net_config)

  def __repr__(self) -> str:
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.params))
    return (
      f'FeatureDraft(num_layers={self.num_layers}, '
      f'mlp_dim={self.net_config.mlp_dim}, cross_layers={self.cross_layers}, '
      f'draft_vocab={self.draft_vocab_size}, {n:,} parameters)'
    )

  # -- construction -----------------------------------------------------------
  @classmethod
  def init(
    cls,
    target: t5_model.Model,
    num_layers: int = 1,
    mlp_dim: int | None = None,
    seed: int = 0,
    from_target: bool = True,
    cross_layers: tuple[int, ...] | None = None,
    draft_vocab: Any = None,
  ) -> 'FeatureDraft':
    """A fresh draft for `target` (a `T5GemmaFeatureDraft` for a T5Gemma
    target: T5Gemma layers).

    Args:
      target: the target `Model`.
      num_layers: draft decoder layers.
      mlp_dim: their MLP width (default the target's; T5Gemma: only that).
      seed: initialization seed.
      from_target: start each draft layer as a copy of the target layer
        whose keys and values it reads (and the relative-position table and
        final norm as the target's); the fusion `fc` is random either way.
        A narrower `mlp_dim` keeps the target MLP's `mlp_dim` hidden units
        of largest weight norm; a wider one stays random.
      cross_layers: target layers read by each draft layer (default the
        last `num_layers`).
      draft_vocab: None (the full vocabulary) or token ids
        (`with_draft_vocab`).
    """
    refuse_t5_only_options(target, mlp_dim=mlp_dim, draft_vocab=draft_vocab)
    if isinstance(target, t5gemma_model.T5GemmaModel):
      return feature_t5gemma.T5GemmaFeatureDraft.init(
        target, num_layers, seed, from_target, cross_layers
      )
    tcfg = target.config
    cross_layers = on_target.cross_layers_for(
      num_layers, tcfg.num_decoder_layers, cross_layers
    )
    cfg = net_config(tcfg, num_layers, mlp_dim)
    params = _init_params(cfg, seed)
    if from_target:
      params = _copy_from_target(params, target.params, cross_layers, cfg)
    return cls(
      params=params,
      target=target,
      net_config=cfg,
      cross_layers=cross_layers,
    ).with_draft_vocab(draft_vocab)

  def with_draft_vocab(self, ids: Any) -> 'FeatureDraft':
    """This draft proposing only the tokens `ids` (None: all of them).

    Args:
      ids: distinct token ids in [0, V), any order (kept ascending), or
        None.

    Raises:
      ValueError: `ids` is empty, not 1-D, repeats an id or names one
        outside the target's vocabulary.
    """
    if ids is None:
      return self.replace(draft_vocab=None, vocab_kernel=None)
    ids = np.asarray(ids)
    v = self.vocab_size
    if (
      ids.ndim != 1
      or not ids.size
      or not np.issubdtype(ids.dtype, np.integer)
      or len(np.unique(ids)) != ids.size
      or ids.min() < 0
      or ids.max() >= v
    ):
      raise ValueError(
        f'draft_vocab must be distinct token ids in [0, {v}), at least '
        f'one, got {ids.shape} {ids.dtype} ids'
      )
    ids = np.sort(ids).astype(np.int32)
    return self.replace(
      draft_vocab=jnp.asarray(ids),
      vocab_kernel=output_rows(self.target, ids),
    )

  def with_params(self, params: Any) -> 'FeatureDraft':
    return self.replace(params=jax.tree.map(jnp.asarray, params), packed=None)

  def pack_for_cpu(self, dtype: Any = jnp.float32) -> 'FeatureDraft':
    """The network's weights packed for the small-K CPU kernel."""
    return self.replace(packed=kernel_ops.pack_params(self.params, dtype))

  def for_drafting(self) -> 'FeatureDraft':
    """What proposes in a decode (`protocol.DraftingCopy`): where the CPU
    kernel is on, the network packed in bfloat16 and the target's
    drafting copy (bfloat16 output projection), as a model draft gets.
    Only the proposals can change (by rounding), never the output. On a
    sharded target the same weights: the network is packed alike (the
    draft is replicated on the mesh) and the target's copy rounds its
    shards as the unsharded copy rounds its packing."""
    if self.packed is not None or not t5_model.cpu_kernel_enabled(
      self.net_config
    ):
      return self
    copy = getattr(self, '_drafting_copy', None)
    if copy is None:  # Built once per draft (packing is host work).
      copy = self.replace(target=self.target.for_drafting()).pack_for_cpu(
        jnp.bfloat16
      )
      if self.draft_vocab is not None:  # Its rows as the target's copy.
        copy = copy.replace(
          vocab_kernel=kernel_ops.pack(self.vocab_kernel, jnp.bfloat16)
        )
      object.__setattr__(self, '_drafting_copy', copy)
    return copy

  # -- the network ------------------------------------------------------------
  def embed(self, tokens: jax.Array) -> jax.Array:
    """The target's token embeddings `[..., D]` (activation dtype)."""
    emb = self.target.params['token_embedder']['embedding']
    return jnp.take(emb, tokens, axis=0).astype(self.net_config.dtype)

  def apply_net(self, features, tokens, cross, cache=None, tree=None):
    """`FeatureNet` on `tokens [B, T]` with `features [B, T, D]` (the
    feature of the input before each token): `(predicted [B, T, D], cache)`."""
    variables = {'params': self.params}
    if self.packed is not None:
      variables[network.PACKED] = self.packed
    return self.net.apply(
      variables, features, self.embed(tokens), cross, cache, tree
    )

  def run_tokens(self, features, tokens, positions, cross, cache, tree=None):
    """`apply_net` for the shared drafting loop (`on_target`): a T5
    draft reads no positions."""
    del positions
    return self.apply_net(features, tokens, cross, cache, tree)

  def logits(self, features: jax.Array) -> jax.Array:
    """The target's output projection of features `[..., D]`: `[..., V]`;
    with a draft vocabulary, -inf outside it (q = 0 there)."""
    if self.draft_vocab is None:
      return self.target.project(features)
    small = self.draft_logits(features)
    full = jnp.full(small.shape[:-1] + (self.vocab_size,), -jnp.inf)
    return full.at[..., self.draft_vocab].set(small)

  def draft_logits(self, features: jax.Array) -> jax.Array:
    """Logits `[..., N]` float32 of the draft vocabulary's ids (`logits`
    without one): the N columns of the output projection alone."""
    if self.draft_vocab is None:
      return self.logits(features)
    kernel = self.vocab_kernel
    if isinstance(kernel, kernel_ops.Packed):
      return kernel_ops.matmul(features.astype(jnp.float32), kernel)
    dtype = self.net_config.dtype
    return jnp.dot(features.astype(dtype), kernel.astype(dtype)).astype(
      jnp.float32
    )

  def teacher_forced(
    self,
    encoder_tokens: jax.Array,
    decoder_inputs: jax.Array,
    target_features: jax.Array,
  ) -> jax.Array:
    """Predicted features `[B, T, D]` of inputs 0..T-1, each from the
    target's feature of the input before it (`target_features [B, T, D]`,
    the target's teacher-forced features of the same inputs)."""
    tstate = self.target.init_state(encoder_tokens, 1)
    return self.teacher_forced_from(
      self.cross(tstate), decoder_inputs, target_features
    )

  def teacher_forced_from(self, cross, decoder_inputs, target_features):
    """`teacher_forced` given the draft layers' keys and values."""
    prev = jnp.pad(target_features[:, :-1], ((0, 0), (1, 0), (0, 0)))
    return self.apply_net(prev, decoder_inputs, cross)[0]

  # -- drafter protocol -------------------------------------------------------
  def init_draft(self, encoder_tokens: jax.Array, length: int) -> FeatureState:
    cfg = self.net_config
    return FeatureState(
      cache=cache_lib.KVCache.zeros(
        cfg.num_decoder_layers,
        encoder_tokens.shape[0],
        length,
        cfg.num_heads,
        cfg.head_dim,
        cfg.dtype,
      )
    )

  # -- checkpoints ------------------------------------------------------------
  def save(self, path: str) -> None:
    """Writes the draft network to a new directory `path` (module
    docstring); the target is not saved.

    Raises:
      FileExistsError: `path` exists and is not empty.
    """
    info = {
      'num_layers': self.num_layers,
      'mlp_dim': self.net_config.mlp_dim,
      'cross_layers': list(self.cross_layers),
    }
    if self.draft_vocab is not None:
      info['draft_vocab'] = [int(i) for i in np.asarray(self.draft_vocab)]
    on_target.save_feature_draft(self, path, info)

  @classmethod
  def load(cls, path: str, target: t5_model.Model) -> 'FeatureDraft':
    """Reads a draft written by `save`, for `target` (a T5Gemma draft
    for a T5Gemma target: `T5GemmaFeatureDraft.load`). Checks the
    family and the target's shape before reading any weights.

    Raises:
      FileNotFoundError: `path` holds no feature draft.
      ValueError: the draft was trained for another family's target or
        for a target of another shape.
    """
    path = os.path.abspath(os.fspath(path))
    if isinstance(target, t5gemma_model.T5GemmaModel):
      return feature_t5gemma.T5GemmaFeatureDraft.load(path, target)
    info = on_target.read_feature_info(path, target.config)
    _check_target(info['target_config'], target.config, path)
    cfg = net_config(target.config, info['num_layers'], info['mlp_dim'])
    abstract = jax.eval_shape(lambda: _init_params(cfg, 0))
    # A checkpoint from before draft vocabularies has the full one.
    return cls(
      params=on_target.restore_params(path, abstract),
      target=target,
      net_config=cfg,
      cross_layers=tuple(info['cross_layers']),
    ).with_draft_vocab(info.get('draft_vocab'))


def refuse_t5_only_options(target: Any, **options: Any) -> None:
  """Raises ValueError naming the first of `options` (e.g. `mlp_dim`,
  `draft_vocab`, `draft_vocab_size`) that is not None when `target` is a
  T5Gemma model: its feature draft's layers have the target's shape and it
  keeps the full vocabulary. Nothing to check for a T5 target."""
  if not isinstance(target, t5gemma_model.T5GemmaModel):
    return
  for name, value in options.items():
    if value is not None:
      raise ValueError(
        f"{name} is for T5 targets: a T5Gemma feature draft has the target's "
        f'MLP width and full vocabulary; set {name} = None'
      )


def is_feature_draft_dir(path: str) -> bool:
  return os.path.isfile(os.path.join(path, on_target.INFO_FILE))


def net_config(
  target_config: T5Config, num_layers: int, mlp_dim: int | None = None
) -> T5Config:
  """The draft network's config: the target's, `num_layers` decoder layers
  (and `mlp_dim`), no dropout."""
  return target_config.replace(
    num_decoder_layers=int(num_layers),
    num_encoder_layers=1,
    mlp_dim=int(mlp_dim or target_config.mlp_dim),
    dropout_rate=0.0,
  )


def output_rows(target: Any, ids: np.ndarray) -> jax.Array:
  """The columns `[D, N]` float32 of `target`'s output projection (T5:
  `logits_dense`, or the tied embedding over sqrt(D)) for token `ids`."""
  params, cfg = target.params, target.config
  if cfg.logits_via_embedding:
    emb = jnp.take(params['token_embedder']['embedding'], ids, axis=0)
    return (emb.T / np.sqrt(cfg.emb_dim)).astype(jnp.float32)
  kernel = params['decoder']['logits_dense']['kernel']
  return jnp.take(kernel, jnp.asarray(ids), axis=1).astype(jnp.float32)


def _init_params(cfg: T5Config, seed: int) -> Any:
  b, d = 1, cfg.emb_dim
  net = FeatureNet(cfg)
  cross = network.CrossAttentionKV(
    keys=tuple(
      jnp.zeros((b, cfg.num_heads, cfg.head_dim, 1), cfg.dtype)
      for _ in range(cfg.num_decoder_layers)
    ),
    values=tuple(
      jnp.zeros((b, cfg.num_heads, cfg.head_dim, 1), cfg.dtype)
      for _ in range(cfg.num_decoder_layers)
    ),
    encoder_valid=jnp.ones((b, 1), bool),
  )
  x = jnp.zeros((b, 1, d), jnp.float32)
  variables = net.init(jax.random.key(seed), x, x, cross)
  return nn.meta.unbox(variables['params'])


def _copy_from_target(params, target_params, cross_layers, cfg):
  """Draft layer i as the target's layer `cross_layers[i]` (module doc);
  copies, never the target's own buffers (a training step donates the
  draft's parameters)."""
  params = jax.tree.map(_copy, params)
  dec = target_params['decoder']
  out = dict(params)
  out['relpos_bias'] = jax.tree.map(_copy, dec['relpos_bias'])
  out['norm'] = jax.tree.map(_copy, dec['decoder_norm'])
  for i, j in enumerate(cross_layers):
    src = dec[f'layers_{j}']
    layer = dict(params[f'layers_{i}'])
    for name, sub in layer.items():
      width = src['mlp']['wo']['kernel'].shape[0]
      if name == 'encoder_decoder_attention':
        layer[name] = {k: src[name][k] for k in sub}
      elif name != 'mlp' or cfg.mlp_dim == width:
        layer[name] = src[name]
      elif cfg.mlp_dim < width:
        layer[name] = _narrowed_mlp(src[name], cfg.mlp_dim)
    out[f'layers_{i}'] = jax.tree.map(_copy, layer)
  return out


def _narrowed_mlp(mlp: dict, width: int) -> dict:
  """The target MLP's `width` hidden units with the largest product of
  their input and output weight norms (structured pruning: the units that
  move the output most), in their original order."""
  norm = lambda w, axis: np.linalg.norm(np.asarray(w, np.float32), axis=axis)
  score = norm(mlp['wo']['kernel'], 1)
  for name, sub in mlp.items():
    if name != 'wo':
      score = score * norm(sub['kernel'], 0)
  keep = np.sort(np.argsort(-score, kind='stable')[:width])
  return {
    name: {
      'kernel': jnp.take(sub['kernel'], keep, axis=0 if name == 'wo' else 1)
    }
    for name, sub in mlp.items()
  }


def _copy(x):
  return jnp.array(x, copy=True)


_SHAPE_FIELDS = (
  'emb_dim',
  'num_heads',
  'head_dim',
  'vocab_size',
  'num_decoder_layers',
  'relative_attention_num_buckets',
)


def _check_target(saved: dict, config: T5Config, path: str) -> None:
  on_target.check_target(
    path,
    [
      f'{k} {saved.get(k)} != {getattr(config, k)}'
      for k in _SHAPE_FIELDS
      if saved.get(k) != getattr(config, k)
    ],
  )

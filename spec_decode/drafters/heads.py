"""Medusa / blockwise-parallel heads: a drafter reading the target's features.

Stern et al. (2018) and Cai et al. (Medusa, 2024) put K small heads on the
frozen target's final decoder hidden state. Head k (1-based) reads the
hidden state `h_{n-1}` that predicted output token n (the newest input) and
predicts output token n + k, so one target call both verifies the previous
block and yields the features for the next one: no draft network runs.

Each head is Medusa's residual block `x + SiLU(x W + b)` (`depth` of them)
followed by a vocabulary projection `[D, V]`. The blocks start at zero
(identity) and the projection at the target's own output projection
(`decoder/logits_dense/kernel`, or the tied embedding scaled by
1/sqrt(D)), so an untrained head predicts exactly what the target's base
head predicts from `h`. With `share_projection` all heads use one
projection (a checkpoint K times smaller in its largest tensor).

Proposals are independent per head (a chain of G tokens), and `q[b, k]` is
the sampler's distribution of head k + 1, the one its token was drawn from,
so verification stays exact (`core/drafter.py`). Trees
(`propose_tree`) are Medusa's Cartesian products: every node at depth d
gets its children from head d + 1. The heads keep no per-position state:
whatever the previous iteration accepted (a deeper tree's, a larger
gamma's), they read only the target's feature of input n - 1, which the
loop's window holds.

Checkpoint format (`Heads.save`): `params/` (orbax: `weights`, `biases`,
`projection`), `heads.json` (num_heads, depth, emb_dim, vocab_size,
share_projection) and the vocabulary as `Model.save` writes it.
"""

import json
import os
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checkpoints
from spec_decode.core import drafter
from spec_decode.core import sampling
from spec_decode.core import tree_draft
from spec_decode.core.decode_settings import DecodeSettings

INFO_FILE = 'heads.json'


@flax.struct.dataclass(kw_only=True)
class HeadsState:
  """Drafter state (the heads keep none; a counter gives it a batch axis).

  Attributes:
    calls: `[B] int32` proposals made so far.
  """

  calls: jax.Array


@flax.struct.dataclass(kw_only=True)
class Heads:
  """K Medusa heads on the target's final hidden state.

  Attributes:
    weights: `[K, R, D, D] float32` residual-block kernels (R = depth).
    biases: `[K, R, D] float32` residual-block biases.
    projection: `[P, D, V] float32` vocabulary projections; P = K (one per
      head) or 1 (shared by every head).
    vocabulary: the target's vocabulary or None (static).
  """

  weights: jax.Array
  biases: jax.Array
  projection: jax.Array
  vocabulary: Any = flax.struct.field(pytree_node=False, default=None)

  # The loop scores the target with features and passes them in
  # `DraftContext.target_features`.
  uses_target_features = True

  # -- shapes -----------------------------------------------------------------
  @property
  def num_heads(self) -> int:
    return self.weights.shape[0]

  @property
  def depth(self) -> int:
    return self.weights.shape[1]

  @property
  def emb_dim(self) -> int:
    return self.weights.shape[-1]

  @property
  def vocab_size(self) -> int:
    return self.projection.shape[-1]

  @property
  def share_projection(self) -> bool:
    return self.projection.shape[0] == 1

  def __repr__(self) -> str:
    return (
      f'Heads(num_heads={self.num_heads}, depth={self.depth}, '
      f'emb_dim={self.emb_dim}, vocab_size={self.vocab_size}, '
      f'share_projection={self.share_projection})'
    )

  # -- construction -----------------------------------------------------------
  @classmethod
  def init(
    cls,
    target: Any,
    num_heads: int,
    depth: int = 1,
    seed: int = 0,
    share_projection: bool = False,
    init_scale: float = 0.0,
  ) -> 'Heads':
    """Heads for `target` (a `Model`), starting as its base head.

    Args:
      target: the target `Model`; its output projection (or tied embedding
        / sqrt(D)) initializes every head's projection.
      num_heads: K >= 1.
      depth: residual blocks per head, R >= 1.
      seed: seeds the block kernels when `init_scale > 0`.
      share_projection: one projection for all heads (P = 1).
      init_scale: standard deviation of the block kernels times sqrt(D);
        0 (Medusa's choice) makes every block the identity.
    """
    if num_heads < 1 or depth < 1:
      raise ValueError(
        f'num_heads and depth must be >= 1, got {num_heads}, {depth}'
      )
    proj = target_projection(target)
    d = proj.shape[0]
    shape = (num_heads, depth, d, d)
    if init_scale:
      key = jax.random.key(seed)
      weights = jax.random.normal(key, shape, jnp.float32) * (
        init_scale / np.sqrt(d)
      )
    else:
      weights = jnp.zeros(shape, jnp.float32)
    copies = 1 if share_projection else num_heads
    return cls(
      weights=weights,
      biases=jnp.zeros((num_heads, depth, d), jnp.float32),
      projection=jnp.tile(proj[None], (copies, 1, 1)),
      vocabulary=getattr(target, 'vocabulary', None),
    )

  # -- the heads --------------------------------------------------------------
  def hidden(self, features: jax.Array, num: int | None = None) -> jax.Array:
    """Residual blocks: `features [..., D]` -> `[..., num, D]`, heads 1..num."""
    num = self.num_heads if num is None else num
    x = features.astype(jnp.float32)
    h = jnp.broadcast_to(x[..., None, :], x.shape[:-1] + (num, x.shape[-1]))
    for r in range(self.depth):
      w = self.weights[:num, r]
      b = self.biases[:num, r]
      h = h + jax.nn.silu(jnp.einsum('...kd,kde->...ke', h, w) + b)
    return h

  def logits(self, features: jax.Array, num: int | None = None) -> jax.Array:
    """`features [..., D]` -> float32 logits `[..., num, V]` of heads 1..num.

    Head k's logits at the hidden state of input t predict output token
    t + 1 + k (the target's own logits there predict token t + 1).
    """
    num = self.num_heads if num is None else num
    h = self.hidden(features, num)
    if self.share_projection:
      return jnp.einsum('...kd,dv->...kv', h, self.projection[0])
    return jnp.einsum('...kd,kdv->...kv', h, self.projection[:num])

  # -- drafter protocol -------------------------------------------------------
  def init_draft(self, encoder_tokens: jax.Array, length: int) -> HeadsState:
    del length
    return HeadsState(calls=jnp.zeros((encoder_tokens.shape[0],), jnp.int32))

  def propose(
    self,
    state: HeadsState,
    context: drafter.DraftContext,
    settings: DecodeSettings,
  ) -> tuple[drafter.Proposal, HeadsState]:
    """Tokens n+1..n+G from heads 1..G, each drawn independently.

    Raises:
      ValueError: `settings.gamma` exceeds the number of heads, or the
        context carries no target features.
    """
    gamma = int(settings.gamma)
    if gamma > self.num_heads:
      raise ValueError(
        f'gamma={gamma} needs {gamma} heads, these heads have '
        f'{self.num_heads}; use gamma <= {self.num_heads}'
      )
    if context.target_features is None:
      raise ValueError(
        'Heads needs DraftContext.target_features (the loop fills them '
        'for drafters with uses_target_features)'
      )
    logits = self.logits(context.target_features, gamma)  # [B, G, V]
    sampler = settings.sampler
    if sampler.is_greedy:
      tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
      q = None
    else:
      q = sampler.probs(logits)
      tokens = jnp.stack(
        [
          jax.vmap(sampling.sample)(context.keys[:, k], q[:, k])
          for k in range(gamma)
        ],
        axis=1,
      )
    return drafter.full_proposal(tokens, q), state.replace(
      calls=state.calls + 1
    )

  def propose_tree(
    self,
    state: HeadsState,
    context: drafter.DraftContext,
    settings: DecodeSettings,
    shape,
  ) -> tuple[drafter.TreeProposal, HeadsState]:
    """Medusa's Cartesian tree: a depth-d node's children come from head
    d + 1 (its top-k when greedy; draws without replacement, per parent,
    when sampling), whatever the node's own token."""
    depth = shape.depth
    if depth > self.num_heads:
      raise ValueError(
        f'a tree of depth {depth} needs {depth} heads, these heads have '
        f'{self.num_heads}'
      )
    if context.target_features is None:
      raise ValueError(
        'Heads needs DraftContext.target_features (the loop fills them '
        'for drafters with uses_target_features)'
      )
    logits = self.logits(context.target_features, depth)  # [B, D, V]

    def level_logits(level, tokens, carry):
      del tokens
      d, t = level.depth, len(level.fed)
      head = jnp.broadcast_to(
        logits[:, d : d + 1], (logits.shape[0], t, logits.shape[-1])
      )
      return head, carry

    proposal, _ = tree_draft.expand(
      shape, settings.sampler, logits[:, 0], level_logits, None, context.keys
    )
    return proposal, state.replace(calls=state.calls + 1)

  # -- checkpoints ------------------------------------------------------------
  def save(self, path: str) -> None:
    """Writes the heads to a new directory `path` (see module docstring).

    Raises:
      FileExistsError: `path` exists and is not empty.
    """
    # Host arrays: no device sharding is recorded (portable checkpoints).
    arrays = {n: np.asarray(a) for n, a in self.arrays().items()}
    path = checkpoints.save_arrays(path, arrays)
    info = {
      'num_heads': self.num_heads,
      'depth': self.depth,
      'emb_dim': self.emb_dim,
      'vocab_size': self.vocab_size,
      'share_projection': self.share_projection,
    }
    with open(os.path.join(path, INFO_FILE), 'w') as f:
      json.dump(info, f, indent=2, sort_keys=True)
    if self.vocabulary is not None:
      checkpoints.write_vocabulary(path, self.vocabulary)

  @classmethod
  def load(cls, path: str) -> 'Heads':
    """Reads heads written by `save`."""
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    path = os.path.abspath(os.fspath(path))
    info_file = os.path.join(path, INFO_FILE)
    if not os.path.isfile(info_file):
      raise FileNotFoundError(f'{path}: no {INFO_FILE}; not a Heads directory')
    with open(info_file) as f:
      info = json.load(f)
    k, r, d, v = (
      int(info[n]) for n in ('num_heads', 'depth', 'emb_dim', 'vocab_size')
    )
    p = 1 if info['share_projection'] else k
    abstract = {
      'weights': jax.ShapeDtypeStruct((k, r, d, d), jnp.float32),
      'biases': jax.ShapeDtypeStruct((k, r, d), jnp.float32),
      'projection': jax.ShapeDtypeStruct((p, d, v), jnp.float32),
    }
    arrays = ocp.StandardCheckpointer().restore(
      os.path.join(path, checkpoints.PARAMS_DIR), abstract
    )
    vocabulary = checkpoints.read_vocabulary(path)
    arrays = {n: jnp.asarray(a) for n, a in arrays.items()}
    return cls(vocabulary=vocabulary, **arrays)

  def arrays(self) -> dict[str, jax.Array]:
    """The trainable arrays: `weights`, `biases`, `projection`."""
    return {
      'weights': self.weights,
      'biases': self.biases,
      'projection': self.projection,
    }

  def with_arrays(self, arrays: dict[str, jax.Array]) -> 'Heads':
    """These heads with new `weights`, `biases` and `projection`."""
    return self.replace(**arrays)


def target_projection(target: Any) -> jax.Array:
  """The target's output projection `[D, V]` float32 (features -> logits).

  `decoder/logits_dense/kernel`, or for tied models the shared embedding
  transposed and scaled by 1/sqrt(D) as the network scales its logits.
  """
  params = target.params
  if target.config.logits_via_embedding:
    emb = jnp.asarray(params['token_embedder']['embedding'], jnp.float32)
    return emb.T / jnp.sqrt(jnp.float32(emb.shape[1]))
  return jnp.asarray(params['decoder']['logits_dense']['kernel'], jnp.float32)

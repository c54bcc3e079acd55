"""Where each output token came from: the paper's Figure 1, per row.

A speculative decode records, per output token, a small code (`codes
[B, M] int8`): a draft token the target accepted, the target's token after
it rejected a draft token (the rejected draft token is kept in `rejected
[B, M] int32`, -1 elsewhere), the target's bonus token after every draft
token was accepted, or a plain target step (gamma 0). The flag `START`
marks the first token of each iteration (one target call), so the
iterations of a row can be read back. In the loops the two arrays share the
decoder-input buffer's layout (`core.loop_state`: index k is output token k,
1-based) and are written with the tokens, block by block; tokens dropped
after an EOS or past M leave no record.

A token tree (`tree=`) records its accepted path the same way (`ACCEPTED`
along the path, then `REPLACED` or `BONUS`), with the rank of each accepted
node among its siblings in `rank` (0 is the draft's first choice) and, at a
`REPLACED` token, the draft's first-choice child that the target rejected.

On the host, `Provenance.iterations(r)` splits row r into its iterations.
"""

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# What a token is (the low bits of a code).
NONE, ACCEPTED, REPLACED, BONUS, TARGET = 0, 1, 2, 3, 4
KIND_MASK = 7
# Flag: the first token of an iteration.
START = 8
KIND_NAMES = {
  ACCEPTED: 'accepted',
  REPLACED: 'replaced',
  BONUS: 'bonus',
  TARGET: 'target',
}


@flax.struct.dataclass(kw_only=True)
class Record:
  """The loop's provenance buffers, laid out as the decoder inputs.

  Attributes:
    codes: `[B, L] int8` kind | START per output position (0: none yet).
    rejected: `[B, L] int32` the rejected draft token at a REPLACED
      position, -1 elsewhere.
    rank: `[B, L] int8` a tree's sibling rank of each accepted node (0 for
      chains).
  """

  codes: jax.Array
  rejected: jax.Array
  rank: jax.Array

  @classmethod
  def zeros(cls, batch: int, length: int) -> 'Record':
    return cls(
      codes=jnp.zeros((batch, length), jnp.int8),
      rejected=jnp.full((batch, length), -1, jnp.int32),
      rank=jnp.zeros((batch, length), jnp.int8),
    )

  def write(
    self,
    length: jax.Array,
    kept: jax.Array,
    codes: jax.Array,
    rejected: jax.Array | None = None,
    rank: jax.Array | None = None,
  ) -> 'Record':
    """The first `kept [B]` entries of `codes [B, W]` (and `rejected`,
    `rank`) written at output positions `length + 1 ...` of each row, as
    `core.loop_state.commit_block` writes the tokens."""
    new = {'codes': codes.astype(jnp.int8)}
    if rejected is not None:
      new['rejected'] = rejected.astype(jnp.int32)
    if rank is not None:
      new['rank'] = rank.astype(jnp.int8)
    width = codes.shape[1]
    keep = jnp.arange(width)[None, :] < kept[:, None]
    start = length + 1

    def put(buf, blk):
      old = jax.vmap(lambda b, s: lax.dynamic_slice_in_dim(b, s, width))(
        buf, start
      )
      blk = jnp.where(keep, blk, old)
      return jax.vmap(
        lambda b, x, s: lax.dynamic_update_slice_in_dim(b, x, s, axis=0)
      )(buf, blk, start)

    return self.replace(
      **{name: put(getattr(self, name), blk) for name, blk in new.items()}
    )


def chain_block(
  accepted: jax.Array,
  num_proposed: jax.Array,
  draft_tokens: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """Codes and rejected tokens `[B, g + 1]` of one verified chain block.

  Args:
    accepted: `[B]` draft tokens accepted, a.
    num_proposed: `[B]` draft tokens proposed (g unless fewer).
    draft_tokens: `[B, g]` the proposal.

  Returns:
    codes: ACCEPTED at offsets < a, then REPLACED (a < proposed) or BONUS;
      START on offset 0. rejected: the draft token at offset a where it
      was rejected, else -1.
  """
  g = draft_tokens.shape[1]
  offsets = jnp.arange(g + 1)[None, :]
  a = accepted[:, None]
  last = jnp.where(a < num_proposed[:, None], REPLACED, BONUS)
  codes = jnp.where(offsets < a, ACCEPTED, last)
  codes = codes + jnp.where(offsets == 0, START, 0)
  padded = jnp.pad(draft_tokens, ((0, 0), (0, 1)), constant_values=-1)
  rejected = jnp.where((offsets == a) & (last == REPLACED), padded, -1)
  return codes.astype(jnp.int8), rejected.astype(jnp.int32)


def tree_block(
  accepted: jax.Array,
  path: jax.Array,
  tried: jax.Array,
  tokens: jax.Array,
  children: jax.Array,
  ranks: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Codes, rejected tokens and ranks `[B, D + 1]` of one verified tree.

  Args:
    accepted: `[B]` nodes accepted along the path, a.
    path: `[B, D + 1]` the nodes from the root (0) to the last accepted
      one, then that node repeated.
    tried: `[B, N]` node i + 1 was tested.
    tokens: `[B, N]` the proposed token of node i + 1.
    children: `[B, N + 1, W]` node u's rank-r child, or -1.
    ranks: `[B, N + 1]` each node's rank among its siblings.

  Returns:
    codes: ACCEPTED along the path, then REPLACED where a child of the last
      accepted node was tested (and so rejected), else BONUS; START on
      offset 0. rejected: at offset a, the lowest-ranked tested child's
      token where there is one, else -1. rank: each accepted node's rank.
  """
  d = path.shape[1] - 1
  offsets = jnp.arange(d + 1)[None, :]
  a = accepted[:, None]
  node = jnp.take_along_axis(path, a, axis=1)[:, 0]
  rows = jnp.arange(node.shape[0])
  kids = children[rows, node]  # [B, W]
  kid_tried = (kids > 0) & jnp.take_along_axis(
    tried, jnp.maximum(kids - 1, 0), axis=1
  )
  replaced = jnp.any(kid_tried, axis=1)[:, None]
  first = jnp.take_along_axis(
    kids, jnp.argmax(kid_tried, axis=1)[:, None], axis=1
  )
  first_token = jnp.take_along_axis(tokens, jnp.maximum(first - 1, 0), axis=1)
  last = jnp.where(replaced, REPLACED, BONUS)
  codes = jnp.where(offsets < a, ACCEPTED, last)
  codes = codes + jnp.where(offsets == 0, START, 0)
  rejected = jnp.where((offsets == a) & replaced, first_token, -1)
  path_ranks = jnp.pad(
    jnp.take_along_axis(ranks, path[:, 1:], axis=1), ((0, 0), (0, 1))
  )
  rank = jnp.where(offsets < a, path_ranks, 0)
  return codes.astype(jnp.int8), rejected.astype(jnp.int32), rank


def target_block(batch: int) -> jax.Array:
  """Codes `[B, 1]` of a plain target step (an iteration of one token)."""
  return jnp.full((batch, 1), TARGET | START, jnp.int8)


@dataclasses.dataclass(frozen=True)
class Provenance:
  """Per-token provenance of a decode's output (numpy, on the host).

  Attributes:
    codes: `[B, M] int8` kind | START of each output token (0 after the
      row's last token).
    rejected: `[B, M] int32` the draft token the target rejected where it
      placed a REPLACED token, else -1.
    rank: `[B, M] int8` a tree's sibling rank of each accepted node.
  """

  codes: np.ndarray
  rejected: np.ndarray
  rank: np.ndarray

  @classmethod
  def of(cls, record: Record, max_decode_len: int) -> 'Provenance':
    """The output positions 1..M of a loop's `Record` (host arrays)."""
    cut = slice(1, max_decode_len + 1)
    return cls(
      codes=np.asarray(record.codes)[:, cut],
      rejected=np.asarray(record.rejected)[:, cut],
      rank=np.asarray(record.rank)[:, cut],
    )

  @classmethod
  def plain(cls, lengths: np.ndarray, max_decode_len: int) -> 'Provenance':
    """Every token a plain target step (an iteration each)."""
    lengths = np.asarray(lengths)
    live = np.arange(max_decode_len)[None, :] < lengths[:, None]
    return cls(
      codes=np.where(live, TARGET | START, NONE).astype(np.int8),
      rejected=np.full(live.shape, -1, np.int32),
      rank=np.zeros(live.shape, np.int8),
    )

  def rows(self, rows) -> 'Provenance':
    """The provenance of `rows` (an index or slice of the batch)."""
    return Provenance(self.codes[rows], self.rejected[rows], self.rank[rows])

  def kinds(self, r: int) -> list[int]:
    """Row r's token kinds (ACCEPTED, ...), up to its last token."""
    codes = self.codes[r]
    n = int(np.count_nonzero(codes))
    return [int(c) & KIND_MASK for c in codes[:n]]

  def iterations(self, r: int) -> list[list[tuple[int, int, int]]]:
    """Row r's iterations, each a list of `(position, kind, rejected)` over
    the output positions (0-based) the iteration emitted."""
    out = []
    for k, code in enumerate(self.codes[r]):
      code = int(code)
      if code == NONE:
        break
      if code & START or not out:
        out.append([])
      out[-1].append((k, code & KIND_MASK, int(self.rejected[r, k])))
    return out

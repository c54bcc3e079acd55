"""What a speculative decode counts, in the loop and on the host.

`SpecCounters` is the loop's carry (per row, on the device; the chain loops
and the tree loop fill it alike through `SpecCounters.counted`, a tree's
depth d playing a chain's position d, and the tree loop adds its per-node
counts); `SpecStats` is what `generate` returns, the counters summed on the host
into the paper's quantities (alpha, tokens per call, per-position acceptance).

Convention: a draft token counts as accepted only where the row output it. A
row that ends inside an iteration's accepted block (the verifier accepted a
draft EOS and more after it, or the row reached max_decode_len) outputs
`kept` tokens of that block; the draft tokens accepted beyond them are never
output, so neither the histogram nor the per-position counts (alpha) count
them, and `core.provenance` has no entry for them: the per-row ACCEPTED
codes equal `row_accepted_histogram @ arange(G + 1)`.
"""

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


def output_accepted(accepted: jax.Array, kept: jax.Array) -> jax.Array:
  """Draft tokens an iteration accepted and the row output, `[B]`.

  Args:
    accepted: `[B]` draft tokens the verifier accepted, a.
    kept: `[B]` tokens of the block the row kept
      (`core.loop_state.commit_block`: at most a + 1, fewer after an EOS or
      at max_decode_len; 0 for a row already done).

  Returns:
    min(a, kept): where the row ended inside the accepted block (kept <= a)
    it output `kept` accepted tokens and no target token; the rest of the
    block was accepted but never output, and counts nowhere.
  """
  return jnp.minimum(accepted, kept)


@flax.struct.dataclass(kw_only=True)
class SpecCounters:
  """Per-row statistics of a speculative decode (all `[B, ...]`).

  Attributes:
    iterations: `[B]` iterations (= target calls) while the row was active.
    accepted_histogram: `[B, G + 1]` iterations that output 0..G accepted
      draft tokens (`output_accepted`: none accepted beyond the row's end).
    position_tries: `[B, G]` iterations whose draft token i was tested (its
      prefix accepted) inside what the row output.
    position_accepts: `[B, G]` iterations whose draft token i was accepted
      and output.
    beta_sum: `[B]` sum of beta over tested positions.
    proposed: `[B]` draft tokens proposed while the row was active (G per
      iteration unless the drafter proposes fewer).
    gamma_histogram: `[B, G + 1]` iterations run at each gamma while the row
      was active (gamma='auto'; None with a fixed gamma).
    node_tries: `[B, N]` iterations that tested node i + 1 of a tree of N
      nodes inside what the row output (the tree loop; None for chains).
    node_accepts: `[B, N]` iterations that accepted node i + 1 and output
      it (the tree loop; None for chains).

  G is the decode's width (`DecodeSettings.width`: the fixed gamma, the
  largest under gamma='auto'); a tree decode's is its depth D: position d
  is depth d + 1, tested when any node there was tested.
  """

  iterations: jax.Array
  accepted_histogram: jax.Array
  position_tries: jax.Array
  position_accepts: jax.Array
  beta_sum: jax.Array
  proposed: jax.Array
  gamma_histogram: jax.Array | None = None
  node_tries: jax.Array | None = None
  node_accepts: jax.Array | None = None

  @classmethod
  def zeros(
    cls,
    batch: int,
    width: int,
    with_gammas: bool = False,
    num_nodes: int = 0,
    xp=jnp,
  ) -> 'SpecCounters':
    """Zero counters `width` positions wide (the decode's
    `DecodeSettings.width`: its gamma histogram has gammas 0..width); with
    the gamma histogram (`with_gammas`) and the per-node counts of a tree
    (`num_nodes` > 0); `xp=np` for host counters (no device dispatch)."""
    z = lambda *s: xp.zeros((batch,) + s, xp.int32)
    return cls(
      iterations=z(),
      accepted_histogram=z(width + 1),
      position_tries=z(width),
      position_accepts=z(width),
      beta_sum=xp.zeros((batch,), xp.float32),
      proposed=z(),
      gamma_histogram=z(width + 1) if with_gammas else None,
      node_tries=z(num_nodes) if num_nodes else None,
      node_accepts=z(num_nodes) if num_nodes else None,
    )

  def counted(
    self,
    active: jax.Array,
    accepted: jax.Array,
    kept: jax.Array,
    tested: jax.Array,
    beta: jax.Array,
    proposed: jax.Array,
  ) -> 'SpecCounters':
    """The counters after one speculative iteration (chain or tree).

    Args:
      active: `[B] bool` rows not done before the iteration.
      accepted: `[B]` draft tokens the verifier accepted, a.
      kept: `[B]` tokens of the block the row kept (`output_accepted`).
      tested: `[B, W] bool` position i (a tree's depth i + 1) was tested:
        proposed, its prefix accepted; W <= G (a narrower iteration under
        gamma='auto' counts in the first W positions).
      beta: `[B, W]` the verifier's beta per position.
      proposed: `[B]` draft tokens (tree nodes) proposed.
    """
    width = self.position_tries.shape[1]
    # Position i counts only inside what the row kept (module docstring).
    offsets = jnp.arange(tested.shape[1])[None]
    tested = tested & (offsets < kept[:, None]) & active[:, None]
    accepts = tested & (offsets < accepted[:, None])
    act = active.astype(jnp.int32)

    def pad(x):  # [B, W] -> [B, G]
      return jnp.pad(x, ((0, 0), (0, width - x.shape[1])))

    return self.replace(
      iterations=self.iterations + act,
      accepted_histogram=self.accepted_histogram
      + jax.nn.one_hot(
        output_accepted(accepted, kept), width + 1, dtype=jnp.int32
      )
      * act[:, None],
      position_tries=self.position_tries + pad(tested),
      position_accepts=self.position_accepts + pad(accepts),
      beta_sum=self.beta_sum + jnp.sum(jnp.where(tested, beta, 0.0), axis=1),
      proposed=self.proposed + proposed * act,
    )


@dataclasses.dataclass(frozen=True)
class SpecStats:
  """Statistics of a speculative decode (numpy, on the host).

  Aggregated over rows:
    target_calls: target calls (loop iterations of the batch).
    draft_calls: draft forward calls (gamma per iteration; with fewer
      proposals in some iterations, the most any row proposed).
    accepted_histogram: `[G + 1]` iterations (summed over rows) that
      output 0..G accepted draft tokens (tokens accepted after a row's EOS
      or past max_decode_len are not output and not counted: module
      docstring).
    per_position_acceptance: `[G]` P(draft token i accepted | tokens before
      it accepted), over iterations where it was tested inside the output.
    alpha: mean beta = sum_x min(p, q) over drafted positions whose prefix
      was accepted and that lie inside the row's output (the paper's alpha
      estimate, section 3.1).
    tokens_per_call: output tokens per target call, pooled over rows (all
      rows' tokens over all rows' iterations).
    mean_proposed: draft tokens proposed per iteration, mean over rows and
      iterations (gamma unless the drafter proposes fewer).
  Per row (`[B, ...]`): `row_iterations`, `row_accepted_histogram`,
  `row_alpha`, `row_tokens_per_call`, and the raw counts behind them,
  `row_position_tries [B, G]`, `row_position_accepts [B, G]` (per position:
  iterations that tested / accepted it), `row_beta_sum [B]` and
  `row_proposed [B]`; with gamma='auto', `row_gamma_histogram [B, G + 1]`
  (iterations run at each gamma while the row was active; G is then the
  largest gamma, and `accepted_histogram` counts drafting iterations only).
  """

  target_calls: int
  draft_calls: int
  accepted_histogram: np.ndarray
  per_position_acceptance: np.ndarray
  alpha: float
  tokens_per_call: float
  row_iterations: np.ndarray
  row_accepted_histogram: np.ndarray
  row_alpha: np.ndarray
  row_tokens_per_call: np.ndarray
  row_position_tries: np.ndarray
  row_position_accepts: np.ndarray
  row_beta_sum: np.ndarray
  mean_proposed: float = 0.0
  row_proposed: np.ndarray | None = None
  row_gamma_histogram: np.ndarray | None = None

  @property
  def gamma(self) -> int:
    return len(self.per_position_acceptance)

  @classmethod
  def from_counters(
    cls, counters: SpecCounters, lengths: np.ndarray
  ) -> 'SpecStats':
    c = jax.tree.map(np.asarray, counters)
    gamma = c.position_tries.shape[1]
    tries = c.position_tries.sum(0)
    tested = c.position_tries.sum(1)
    iters = c.iterations
    return cls(
      target_calls=int(iters.max(initial=0)),
      draft_calls=int(
        min(iters.max(initial=0) * gamma, c.proposed.max(initial=0))
      ),
      accepted_histogram=c.accepted_histogram.sum(0),
      per_position_acceptance=c.position_accepts.sum(0) / np.maximum(tries, 1),
      alpha=float(c.beta_sum.sum() / max(tested.sum(), 1)),
      tokens_per_call=float(lengths.sum() / max(iters.sum(), 1)),
      row_iterations=iters,
      row_accepted_histogram=c.accepted_histogram,
      row_alpha=c.beta_sum / np.maximum(tested, 1),
      row_tokens_per_call=lengths / np.maximum(iters, 1),
      row_position_tries=c.position_tries,
      row_position_accepts=c.position_accepts,
      row_beta_sum=c.beta_sum,
      mean_proposed=float(c.proposed.sum() / max(iters.sum(), 1)),
      row_proposed=c.proposed,
      row_gamma_histogram=c.gamma_histogram,
    )

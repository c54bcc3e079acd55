"""The drafts benches' shared parts, on the suite's tiny models (their
command lines need the demo pair and the Debian data)."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.bench.drafts import hierarchical
from spec_decode.bench.drafts import interleaved
from spec_decode.bench.drafts import trees as trees_bench
from spec_decode.core import tree_shape


def test_fastest_runs_returns_every_configs_outputs(target, near_draft):
  enc = encoder_batch(3, 7, 16, seed=0)
  configs = [dict(max_decode_len=8), dict(max_decode_len=8, draft=near_draft)]
  outs, seconds = interleaved.fastest_runs(target, enc, configs, repeats=2)
  assert seconds.shape == (2,) and (seconds > 0).all()
  for i in range(3):  # Speculative greedy is plain greedy, row by row.
    plain = sd.generate(target, enc[i : i + 1], max_decode_len=8)
    np.testing.assert_array_equal(outs[0][i].tokens, plain.tokens)
    np.testing.assert_array_equal(outs[1][i].tokens, plain.tokens)


def test_draft_cost_of_a_model_draft(target, near_draft):
  """c on real contexts (a broken context build once made this raise)."""
  enc = encoder_batch(2, 7, 16, seed=1)
  plain = np.random.default_rng(0).integers(2, 16, (2, 40)).astype(np.int32)
  c = hierarchical._draft_cost(  # pylint: disable=protected-access
    target, near_draft, enc, plain, np.array([30, 30]), gamma=2, repeats=1
  )
  assert np.isfinite(c) and c > 0


def _controlled_tree(target, near_draft, tree, alpha):
  """Greedy output and tokens per call under `ControlledTreeDraft`."""
  enc = encoder_batch(2, 7, 16, seed=3)  # Both rows run to 24 tokens.
  reference = sd.generate(target, enc, max_decode_len=24).tokens
  tdraft = trees_bench.ControlledTreeDraft(
    inner=near_draft,
    reference=jnp.asarray(reference),
    alpha=jnp.float32(alpha),
    key=jax.random.key(1),
  )
  out = sd.generate(target, enc, draft=tdraft, tree=tree, max_decode_len=12)
  np.testing.assert_array_equal(out.tokens, reference[:, :12])
  return out.stats.tokens_per_call


def test_controlled_tree_draft_takes_dynamic_trees(target, near_draft):
  """The accelerator bench's dynamic-tree row: ranks per row from the
  parents the inner draft chose; the coins decide as for a static tree."""
  chain_like = tree_shape.DynamicTree((1, 1, 1))
  # Every coin right: the one node per depth is each depth's rank 0, so a
  # call commits the whole depth (and the bonus token) until the end.
  assert _controlled_tree(target, near_draft, chain_like, 1.0) > 3.0
  # No coin right: the target's token only, every call.
  assert _controlled_tree(target, near_draft, chain_like, 0.0) == 1.0
  wide = tree_shape.DynamicTree.like(tree_shape.from_branching((2, 2, 1)))
  assert 1.0 <= _controlled_tree(target, near_draft, wide, 0.7) <= 4.0

"""Whole-sequence distribution test: dynamic trees sample the target.

Method, sample size (N = 24,000 sequences of at most M = 4 tokens, all 781
possible outputs enumerated) and false-alarm rate (1e-3 per test):
`_distribution_util`, at temperature 1. The tree: 2 nodes at depth 1 and 3
at depth 2, at most 3 children per node, so a row's depth-2 nodes go 3-0,
2-1, 1-2 or 0-3 to its depth-1 nodes by the draft's confidence, and
siblings of rank 1 and 2 are tested.

Negative control: the same draft, but every sibling group of depth 2 (the
leaves) reordered by the drawn tokens' draft probabilities, the likeliest
first, with each q recomputed as draws without replacement in the new
order: EAGLE-2's rerank by the nodes' own probabilities, which reads each
node's own draw. The same test at the same N must reject it.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distribution_util import BATCH
from _distribution_util import ENC
from _distribution_util import FALSE_ALARM
from _distribution_util import M
from _distribution_util import V
from _distribution_util import WrappedDrafter
from _distribution_util import exact_probs
from _distribution_util import g_test
from _distribution_util import sample_sequences
from _distribution_util import target_model
from conftest import tiny_config

import spec_decode as sd
from spec_decode.core import model_drafter
from spec_decode.core import tree_shape as tree_lib

TREE = tree_lib.DynamicTree((2, 3), width=3)


@flax.struct.dataclass(kw_only=True)
class LeavesRerankedByOwnProbability(WrappedDrafter):
  """Negative control (module docstring)."""

  def propose_tree(self, state, context, settings, shape):
    prop, state = self.inner.propose_tree(state, context, settings, shape)
    leaves = shape.level_ids(shape.depth) - 1  # Node i + 1 at column i.
    tok, q, par = prop.tokens[:, leaves], prop.q[:, leaves], prop.parents
    par = par[:, leaves]
    same = par[:, :, None] == par[:, None, :]  # [B, L, L]
    order = jnp.arange(len(leaves))
    elder = same & (order[None, None] < order[None, :, None])
    # The parent's own q: that of the group's rank-0 node.
    first = jnp.argmax(same, axis=2)
    q0 = jnp.take_along_axis(q, first[..., None], axis=1)
    p_own = jnp.take_along_axis(q0, tok[..., None], axis=2)[..., 0]
    # Groups are contiguous (by parent): sort by parent, then -p_own.
    new = jnp.argsort(par * 2.0 - p_own, axis=1, stable=True)
    tok = jnp.take_along_axis(tok, new, axis=1)
    removed = jnp.einsum(
      'bjk,bkv->bjv', elder.astype(jnp.float32), jax.nn.one_hot(tok, V)
    )
    q_new = q0 * (removed == 0)
    q_new = q_new / jnp.sum(q_new, axis=-1, keepdims=True)
    return prop.replace(
      tokens=prop.tokens.at[:, leaves].set(tok),
      q=prop.q.at[:, leaves].set(q_new),
    ), state


@pytest.fixture(scope='module')
def models():
  target = target_model()
  draft = sd.Model.init(tiny_config(vocab_size=V, num_decoder_layers=1), seed=4)
  return target, draft


def test_dynamic_tree_samples_the_target_distribution(models):
  target, draft = models
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  samples, run_stats = sample_sequences(
    target, draft, ENC, tree=TREE, temperature=1.0
  )
  hist = run_stats[0].row_accepted_histogram
  assert len({tuple(h) for h in hist}) > 5  # Ragged acceptance.
  assert g_test(samples, seqs, p) > FALSE_ALARM


def test_negative_control_rerank_by_own_probability_is_detected(models):
  target, draft = models
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  wrong = LeavesRerankedByOwnProbability(
    inner=model_drafter.ModelDrafter(model=draft)
  )
  samples, _ = sample_sequences(target, wrong, ENC, tree=TREE, temperature=1.0)
  assert g_test(samples, seqs, p) < FALSE_ALARM


def test_the_allotment_varies_and_higher_ranks_are_accepted(models):
  """What makes the tests above about dynamic trees (same compiled
  program): rows give their depth-2 nodes to different parents, and
  siblings of rank 1 and 2 are accepted."""
  target, draft = models
  out = sd.generate(
    target,
    np.repeat(ENC, BATCH, 0),
    draft=draft,
    tree=TREE,
    temperature=1.0,
    max_decode_len=M,
    seed=np.arange(BATCH),
  )
  ranks = out.provenance.rank
  assert np.any(ranks == 1) and np.any(ranks == 2)
  # Depth 2 tested and accepted (the leaves the allotment chose).
  assert out.tree['depth_acceptance'][1] > 0

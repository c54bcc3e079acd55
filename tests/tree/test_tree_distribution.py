"""Whole-sequence distribution tests: tree speculation samples the target.

Method, sample size (N = 24,000 sequences of at most M = 4 tokens, all 781
possible outputs enumerated) and false-alarm rate (1e-3 per test):
`_distribution_util`. The tree is (2, 2): width 2 at both depths, so rank-1
siblings are accepted at depth 1 and at depth 2, and the next token after a
rejection is drawn from the residual left by two siblings.

Negative control, per sampler: the same draft, but each rank-1 child
reports its parent's q instead of q with its elder sibling removed (the
children are drawn without replacement; treating them as independent draws
is a plausible bug). The same test at the same N must reject it.
"""

import flax.struct
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

TREE = (2, 2)
SETTINGS = {
  'temperature_1': dict(temperature=1.0),
  'temperature_0.8_top_k_3': dict(temperature=0.8, top_k=3),
  'top_p_0.8': dict(temperature=1.0, top_p=0.8),
}


@flax.struct.dataclass(kw_only=True)
class SiblingQWithoutRemoval(WrappedDrafter):
  """Negative control: rank-r children report the rank-0 child's q."""

  def propose_tree(self, state, context, settings, shape):
    proposal, state = self.inner.propose_tree(state, context, settings, shape)
    eldest = np.asarray(
      [shape.children[shape.parents[u], 0] for u in range(1, shape.depths.size)]
    )
    return proposal.replace(q=proposal.q[:, eldest - 1]), state


@pytest.fixture(scope='module')
def models():
  target = target_model()
  draft = sd.Model.init(tiny_config(vocab_size=V, num_decoder_layers=1), seed=4)
  return target, draft


# Each sampler compiles its own loops (the sampler is static): temperature 1
# runs in `make test`, the top-k and top-p variants in `make test-slow`.
SAMPLERS = [
  pytest.param(n, marks=() if n == 'temperature_1' else pytest.mark.slow)
  for n in sorted(SETTINGS)
]


@pytest.mark.parametrize('name', SAMPLERS)
def test_tree_samples_the_target_distribution(models, name):
  target, draft = models
  kw = SETTINGS[name]
  seqs, p = exact_probs(target, ENC, sd.Sampler(**kw))
  samples, run_stats = sample_sequences(target, draft, ENC, tree=TREE, **kw)
  tree = run_stats[0].row_accepted_histogram
  assert len({tuple(h) for h in tree}) > 5  # Ragged acceptance.
  assert g_test(samples, seqs, p) > FALSE_ALARM


@pytest.mark.parametrize('name', SAMPLERS)
def test_negative_control_sibling_q_without_removal_is_detected(models, name):
  target, draft = models
  kw = SETTINGS[name]
  seqs, p = exact_probs(target, ENC, sd.Sampler(**kw))
  wrong = SiblingQWithoutRemoval(inner=model_drafter.ModelDrafter(model=draft))
  samples, _ = sample_sequences(target, wrong, ENC, tree=TREE, **kw)
  assert g_test(samples, seqs, p) < FALSE_ALARM


def test_rank_one_siblings_are_accepted_at_both_depths(models):
  """What makes the tests above about trees (same compiled program)."""
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
  shape = tree_lib.parse(TREE)
  accepts = out.tree['node_accepts']
  rank1 = shape.ranks[1:] == 1
  for depth in (1, 2):
    assert accepts[rank1 & (shape.depths[1:] == depth)].sum() > 0

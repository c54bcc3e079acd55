"""Sampled trees of every drafter sample the target (whole sequences).

Method, sample size (N = 24,000 sequences of at most M = 4 tokens, all 781
possible outputs enumerated, seeds 0..23,999 fixed before looking) and
false-alarm rate (1e-3 per test): `_distribution_util`. The tree is
(2, 2), at temperature 1, for the NGram (a bigram fitted to the target's
own samples), Copy and Heads (random Medusa heads) drafters; the model
drafter's trees are `test_tree_distribution.py`'s.

Negative control, per drafter: the same drafter, but every node reports a
uniform q instead of the distribution its token was drawn from (a drafter
whose q is lost on the way to the verifier). The same test at the same N
must reject it.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distribution_util import ENC
from _distribution_util import FALSE_ALARM
from _distribution_util import V
from _distribution_util import WrappedDrafter
from _distribution_util import exact_probs
from _distribution_util import g_test
from _distribution_util import sample_sequences
from _distribution_util import target_model
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.drafters import Copy
from spec_decode.drafters import Heads
from spec_decode.drafters import NGram

TREE = (2, 2)
NAMES = ['ngram', 'copy', 'heads']


@flax.struct.dataclass(kw_only=True)
class UniformQ(WrappedDrafter):
  """Negative control: every node reports a uniform q."""

  def propose_tree(self, state, context, settings, shape):
    proposal, state = self.inner.propose_tree(state, context, settings, shape)
    batch, nodes = proposal.tokens.shape
    uniform = jnp.full((batch, nodes, self.vocab_size), 1.0 / self.vocab_size)
    return proposal.replace(q=uniform), state


@pytest.fixture(scope='module')
def target():
  return target_model()


def _drafter(name, target):
  if name == 'ngram':
    corpus = sd.generate(
      target,
      encoder_batch(64, 5, V, seed=1),
      temperature=1.0,
      max_decode_len=8,
      seed=np.arange(64) + 10**6,
    ).tokens
    return NGram.fit(corpus, n=2, vocab_size=V)
  if name == 'copy':
    return Copy(vocab_size=V, max_ngram=2)
  heads = Heads.init(target, num_heads=2, init_scale=1.0, seed=1)
  noise = jax.random.normal(jax.random.key(2), heads.biases.shape)
  return heads.replace(biases=noise)


def _p_value(target, draft):
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0))
  samples, run_stats = sample_sequences(
    target, draft, ENC, tree=TREE, temperature=1.0
  )
  return g_test(samples, seqs, p), run_stats[0]


@pytest.mark.parametrize('name', NAMES)
def test_drafter_tree_samples_the_target_distribution(target, name):
  p_value, stats = _p_value(target, _drafter(name, target))
  assert len({tuple(h) for h in stats.row_accepted_histogram}) > 2
  assert p_value > FALSE_ALARM


@pytest.mark.parametrize('name', NAMES)
def test_negative_control_uniform_q_is_detected(target, name):
  draft = _drafter(name, target)
  wrong = UniformQ(
    inner=draft,
    uses_target_features=bool(getattr(draft, 'uses_target_features', False)),
  )
  p_value, _ = _p_value(target, wrong)
  assert p_value < FALSE_ALARM

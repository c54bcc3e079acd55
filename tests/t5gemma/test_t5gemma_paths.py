"""Every decode path on a T5Gemma target: `gamma='auto'`, `tree='auto'`,
the early-exit self-draft, the feature draft, `sd.verify` and
`spec-decode verify`, with a smaller same-vocabulary T5Gemma draft (both
saved by transformers, `_t5gemma_util.py`).

Greedy speculative output equals plain greedy (exact); the pair check's
verdict is a pass on the correct pair and a fail on a draft that lies
about its q (a negative control).
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distribution_util import WrappedDrafter
from _t5gemma_util import ENCODER
from _t5gemma_util import hf_model
from _t5gemma_util import save

import spec_decode as sd
from spec_decode.core import model_drafter
from spec_decode.drafters.early_exit_t5gemma import T5GemmaEarlyExit
from spec_decode.drafters.early_exit_t5gemma import truncated
from spec_decode.drafters.feature_t5gemma import T5GemmaFeatureDraft
from spec_decode.eval import verify_cli
from spec_decode.tree import auto as tree_auto

pytest.importorskip('transformers')

LENGTH = 20
# One sampler, few samples: the check's own statistics are tested in
# tests/check; here the T5Gemma pair goes through every check once. At
# 2000 samples the lying draft's control was not rejected (p = 0.002
# against a Bonferroni share of 5e-4 on T5Gemma 2's flat tiny model).
FAST = dict(
  num_samples=4000, batch_size=2000, gammas=(3,), num_inputs=4,
  max_decode_len=8,
)  # fmt: skip
CLI_FAST = [
  '--num_samples=4000',
  '--batch_size=2000',
  '--gammas=3',
  '--num_inputs=4',
  '--max_decode_len=8',
  '--temperature=1',
]


def _load(path):
  """The default ring margin (96) holds tree='auto''s calibration tree, the
  draft's scratch nodes included."""
  return sd.Model.load(path)


@pytest.fixture(scope='module', params=[1, 2], ids=['t5gemma', 't5gemma2'])
def saved(request, tmp_path_factory):
  """Paths of a saved (target, draft) pair of one version."""
  v = request.param
  target = save(hf_model(v), tmp_path_factory.mktemp(f't{v}'))
  draft = save(
    hf_model(v, encoder_layers=1, decoder_layers=1, seed=1),
    tmp_path_factory.mktemp(f'd{v}'),
  )
  return target, draft


@pytest.fixture(scope='module')
def models(saved):
  target, draft = _load(saved[0]), _load(saved[1])
  plain = sd.generate(target, ENCODER, max_decode_len=LENGTH)
  return target, draft, np.asarray(plain.tokens)


def test_auto_gamma_equals_plain(models):
  target, draft, plain = models
  out = sd.generate(
    target,
    ENCODER,
    draft=draft,
    gamma='auto',
    max_auto_gamma=3,
    max_decode_len=LENGTH,
  )
  np.testing.assert_array_equal(out.tokens, plain)


def test_auto_tree_equals_plain(models, monkeypatch):
  """The calibration tree (76 nodes and its root in one call: the ring's
  widest) and the chosen tree. The cost fit gets fixed seconds instead of
  timing seven tree shapes (a compile each, most of this test's time
  otherwise): exactness does not depend on which tree is chosen."""
  target, draft, plain = models

  def fixed_seconds(model, draft, enc, settings, shapes=tree_auto.TIMED):
    del model, draft, enc, settings
    return {b: 1e-3 * (1 + sum(np.cumprod(b))) for b in shapes}

  monkeypatch.setattr(tree_auto, 'iteration_seconds', fixed_seconds)
  out = sd.generate(
    target, ENCODER, draft=draft, tree='auto', max_decode_len=LENGTH
  )
  np.testing.assert_array_equal(out.tokens, plain)


def test_verify_passes_the_pair(models):
  target, draft, _ = models
  report = sd.verify(target, draft, samplers=(sd.Sampler(1.0),), **FAST)
  assert report.passed, report.table()


@flax.struct.dataclass(kw_only=True)
class SharpenedQ(WrappedDrafter):
  """Broken on purpose: draws from the draft's q, reports norm(q^2)."""

  def propose(self, state, context, settings):
    proposal, state = self.inner.propose(state, context, settings)
    if proposal.q is None:  # Greedy: no q to lie about.
      return proposal, state
    q2 = proposal.q**2
    return proposal.replace(q=q2 / q2.sum(-1, keepdims=True)), state


def test_verify_fails_a_draft_that_lies_about_q(models):
  """Negative control: the same check at the same size fails the pair
  when the draft reports a q other than the one it sampled from."""
  target, draft, _ = models
  lying = SharpenedQ(inner=model_drafter.as_drafter(draft))
  report = sd.verify(target, lying, samplers=(sd.Sampler(1.0),), **FAST)
  assert not report.passed, report.table()


def test_cli_verify_passes_the_pair(saved, capsys):
  target, draft = saved
  code = verify_cli.main(['--target', target, '--draft', draft, *CLI_FAST])
  printed = capsys.readouterr().out
  assert code == 0, printed
  assert 'PASS: all' in printed


@pytest.mark.parametrize('tree', [None, (2, 2, 1)], ids=['chain', 'tree'])
def test_early_exit_self_draft_equals_plain(models, tree):
  """The target's first decoder layer drafts for it (reading the target's
  ring cache and encoder keys): greedy output is plain greedy's."""
  target, _, plain = models
  draft = sd.drafters.EarlyExit.of(target, 1)
  assert isinstance(draft, T5GemmaEarlyExit)
  kwargs = dict(gamma=3) if tree is None else dict(tree=tree)
  out = sd.generate(
    target, ENCODER, draft=draft, max_decode_len=LENGTH, **kwargs
  )
  np.testing.assert_array_equal(out.tokens, plain)
  with pytest.raises(ValueError, match='num_layers must be in'):
    sd.drafters.EarlyExit.of(target, 4)


def test_early_exit_draft_is_the_truncated_model(models):
  """What the draft shares with the target equals what the cut model
  computes itself: its first-token logits from the target's cache are the
  cut model's teacher-forced logits."""
  target, _, _ = models
  cut = truncated(target, 1)
  assert cut.config.decoder.num_layers == 1
  rng = np.random.default_rng(0)
  dec = rng.integers(3, 128, (3, 9)).astype(np.int32)
  dec[:, 0] = 0
  expect = np.asarray(cut.logits(ENCODER, dec))
  state = target.init_state(jnp.asarray(ENCODER), 16)
  _, state = target.score(state, jnp.asarray(dec[:, :8]))
  draft = T5GemmaEarlyExit.of(target, 1)
  context = sd.drafters.DraftContext(
    inputs=jnp.asarray(np.pad(dec, ((0, 0), (0, 7)))),
    length=jnp.full((3,), 8, jnp.int32),
    encoder_tokens=jnp.asarray(ENCODER),
    keys=None,
    target_state=state,
  )
  synced = draft.synced(draft.init_draft(ENCODER, 16), context, 1)
  logits, _ = draft._root(cut, synced, context)  # pylint: disable=protected-access
  np.testing.assert_allclose(logits, expect[:, 8], atol=2e-4)
  assert not np.allclose(expect, np.asarray(target.logits(ENCODER, dec)))


@pytest.mark.parametrize('tree', [None, (2, 2, 1)], ids=['chain', 'tree'])
def test_feature_draft_equals_plain(models, tree):
  """An untrained EAGLE-style draft (T5Gemma layers over the target's
  features and encoder keys) proposes; greedy output is plain greedy's."""
  target, _, plain = models
  draft = sd.drafters.FeatureDraft.init(target, num_layers=1)
  assert isinstance(draft, T5GemmaFeatureDraft)
  kwargs = dict(gamma=3) if tree is None else dict(tree=tree)
  out = sd.generate(
    target, ENCODER, draft=draft, max_decode_len=LENGTH, **kwargs
  )
  np.testing.assert_array_equal(out.tokens, plain)


def test_feature_draft_proposes_its_teacher_forced_tokens(models):
  """The draft's first proposal after a prefix is the argmax of its
  teacher-forced prediction at that input: its catch-up (here over the
  whole prefix, `max_accepted` = 5, from an empty cache) with the target's
  features from the cache reproduces teacher forcing."""
  target, _, _ = models
  draft = T5GemmaFeatureDraft.init(target, num_layers=1)
  rng = np.random.default_rng(1)
  dec = rng.integers(3, 128, (3, 6)).astype(np.int32)
  dec[:, 0] = 0
  feats = target.features(ENCODER, dec)
  predicted = draft.teacher_forced(ENCODER, jnp.asarray(dec), feats)
  expect = np.asarray(draft.logits(predicted[:, -1])).argmax(-1)
  state = target.init_state(jnp.asarray(ENCODER), 16)
  _, tfeats, state = target.score_with_features(state, jnp.asarray(dec[:, :5]))
  window = jnp.concatenate([jnp.zeros_like(tfeats[:, :1]), tfeats], 1)
  context = sd.drafters.DraftContext(
    inputs=jnp.asarray(np.pad(dec, ((0, 0), (0, 10)))),
    length=jnp.full((3,), 5, jnp.int32),
    encoder_tokens=jnp.asarray(ENCODER),
    keys=jax.random.split(jax.random.key(0), 3)[:, None],
    target_features=tfeats[:, -1],
    recent_features=window,
    target_state=state,
    max_accepted=5,
  )
  settings = sd.DecodeSettings(gamma=1, max_decode_len=8)
  proposal, _ = draft.propose(
    draft.init_draft(jnp.asarray(ENCODER), 16), context, settings
  )
  np.testing.assert_array_equal(proposal.tokens[:, 0], expect)

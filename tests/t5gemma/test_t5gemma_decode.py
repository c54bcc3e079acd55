"""Decoding T5Gemma targets: speculative greedy equals plain greedy with a
smaller same-vocabulary T5Gemma draft (chains, trees, beams), the sliding
layers' ring buffer (memory flat in the output length, exact after it
wraps), padding that never gives NaN, image inputs refused.

Target: 3 + 3 layers; draft: 1 + 1 layers of another seed; both saved by
transformers (`_t5gemma_util.py`) and loaded with `sd.Model.load`. The
target's sliding layers keep `window + margin - 1 = 15` entries, so 40
output tokens wrap the ring twice.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _t5gemma_util import ENCODER
from _t5gemma_util import WINDOW
from _t5gemma_util import V
from _t5gemma_util import hf_model
from _t5gemma_util import save

import spec_decode as sd
from spec_decode.t5gemma.config import GLOBAL
from spec_decode.t5gemma.config import SLIDING

pytest.importorskip('transformers')

MARGIN = 12  # Room for a (2, 2, 1) tree's 10 nodes plus its root.
LENGTH = 40


def _load(version, tmp, margin=MARGIN, **kwargs):
  model = sd.Model.load(save(hf_model(version, **kwargs), tmp))
  return sd.T5GemmaModel(
    model.config.replace(ring_margin=margin), model.params, model.vocabulary
  )


@pytest.fixture(scope='module', params=[1, 2], ids=['t5gemma', 't5gemma2'])
def models(request, tmp_path_factory):
  """(target, draft, plain greedy tokens of the target)."""
  v = request.param
  target = _load(v, tmp_path_factory.mktemp(f't{v}'))
  draft = _load(
    v,
    tmp_path_factory.mktemp(f'd{v}'),
    encoder_layers=1,
    decoder_layers=1,
    seed=1,
  )
  plain = sd.generate(target, ENCODER, max_decode_len=LENGTH)
  return target, draft, plain.tokens


@pytest.mark.parametrize('draft_kind', ['small', 'self'])
def test_speculative_chain_equals_plain(models, draft_kind):
  """A different small draft (low acceptance) and the target drafting for
  itself (every token accepted: gamma + 1 per call, the ring's widest)."""
  target, draft, plain = models
  draft = target if draft_kind == 'self' else draft
  out = sd.generate(
    target, ENCODER, draft=draft, gamma=3, max_decode_len=LENGTH
  )
  np.testing.assert_array_equal(out.tokens, plain)
  if draft_kind == 'self':
    assert out.stats.target_calls < LENGTH / 2


def test_self_draft_sampling_reproduces_plain_sampling(models):
  """At temperature 1 a draft equal to the target accepts every token and
  the keys depend on row and position only, so the samples are plain
  sampling's token for token (not the whole-sequence distribution test)."""
  target, _, _ = models
  kwargs = dict(temperature=1.0, seed=3, max_decode_len=24)
  plain = sd.generate(target, ENCODER, **kwargs)
  spec = sd.generate(target, ENCODER, draft=target, gamma=3, **kwargs)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_speculative_tree_equals_plain(models):
  target, draft, plain = models
  for tree in ((2, 2, 1), [[0], [1], [0, 0]]):
    out = sd.generate(
      target, ENCODER, draft=draft, tree=tree, max_decode_len=LENGTH
    )
    np.testing.assert_array_equal(out.tokens, plain, err_msg=str(tree))


def test_beam_search_speculative_equals_plain(models):
  target, draft, _ = models
  plain = sd.beam_search(target, ENCODER, num_beams=2, max_decode_len=12)
  spec = sd.beam_search(
    target, ENCODER, num_beams=2, max_decode_len=12, draft=draft, gamma=2
  )
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_allclose(spec.scores, plain.scores, rtol=1e-5, atol=1e-5)


def test_ring_memory_is_flat_in_the_output_length(models):
  target, _, _ = models
  enc = jnp.asarray(ENCODER)
  for length in (64, 512):
    cache = target.init_state(enc, length).cache
    for layer_type, keys in zip(
      target.config.decoder.layer_types, cache.keys, strict=True
    ):
      expect = WINDOW + MARGIN - 1 if layer_type == SLIDING else length
      assert keys.shape[1] == expect
    assert set(cache.slots) == {GLOBAL, SLIDING}


def test_wrapped_ring_with_rollbacks_equals_teacher_forcing(models):
  """Calls of 1-4 tokens plus one rejected token each (rolled back), 40
  inputs through a 15-entry ring: the logits are teacher forcing's, to
  float32 rounding (these weights are large: transformers' own float32 run
  is 5e-5 from float64; a key lost from the window moves logits by 1e-2 or
  more)."""
  target, _, _ = models
  rng = np.random.default_rng(0)
  dec = rng.integers(3, V, (3, 40)).astype(np.int32)
  dec[:, 0] = 0  # The loops' start id; read as BOS at position 0.
  expect = np.asarray(target.logits(ENCODER, dec))
  score = jax.jit(type(target).score)
  state = target.init_state(jnp.asarray(ENCODER), 64)
  got, t = [], 0
  while t < dec.shape[1]:
    n = min(1 + t % 4, dec.shape[1] - t)
    junk = rng.integers(3, V, (3, 1)).astype(np.int32)
    feed = np.concatenate([dec[:, t : t + n], junk], 1)
    logits, state = score(target, state, jnp.asarray(feed))
    state = target.rollback(state, state.cache.index - 1)
    got.append(np.asarray(logits[:, :n]))
    t += n
  assert int(state.cache.index[0]) > 2 * (WINDOW + MARGIN - 1)
  np.testing.assert_allclose(np.concatenate(got, 1), expect, atol=2e-4)


def test_long_padding_stays_finite(models):
  """Rows padded far past the window (encoder queries with every key
  masked): every logit is finite, and a row's logits do not depend on its
  padding."""
  target, _, _ = models
  enc = np.zeros((2, 40), np.int32)
  enc[0, :3] = [30, 31, 32]
  enc[1, :3] = [30, 31, 32]
  dec = np.array([[0, 5, 6, 7], [0, 5, 6, 7]], np.int32)
  logits = np.asarray(target.logits(enc, dec))
  assert np.isfinite(logits).all()
  short = np.asarray(target.logits(enc[:1, :3], dec[:1]))
  np.testing.assert_allclose(logits[0], short[0], atol=1e-4)
  out = sd.generate(target, enc, max_decode_len=8)
  assert (out.tokens[0] == out.tokens[1]).all()


def test_image_inputs_are_refused(models):
  target, _, _ = models
  if target.config.version != 2:
    pytest.skip('T5Gemma has no image inputs')
  with_image = sd.T5GemmaModel(
    target.config.replace(image_token_index=100), target.params
  )
  enc = ENCODER.copy()
  enc[0, 2] = 100
  with pytest.raises(ValueError, match='image'):
    sd.generate(with_image, enc, max_decode_len=4)
  with pytest.raises(ValueError, match='image'):
    with_image.log_probs(enc, np.ones((3, 2), np.int32))

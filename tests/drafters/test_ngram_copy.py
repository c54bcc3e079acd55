"""The n-gram and Copy (prompt lookup) drafters.

Exactness: greedy speculative decoding with either drafter gives plain
greedy tokens (gamma 1, 3, 5; ragged inputs, rows ending at different
lengths), and speculative sampling with either drafter samples the target's
whole-sequence distribution (the G-test of `_distribution_util`: N = 24,000
sequences, false-alarm rate 1e-3). Negative control: a Copy drafter that
proposes deterministically but reports q uniform must fail the same test.

Usefulness: on a task whose targets follow a bigram structure (a `TableLM`
target), a bigram fit on its outputs has a much higher alpha than a unigram
fit; the Copy drafter is accepted almost always by a target that copies its
input.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distribution_util import ENC
from _distribution_util import FALSE_ALARM
from _distribution_util import V as DIST_V
from _distribution_util import WrappedDrafter
from _distribution_util import exact_probs
from _distribution_util import g_test
from _distribution_util import sample_sequences
from _distribution_util import target_model
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.core import drafter
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.drafters import Copy
from spec_decode.drafters import NGram
from spec_decode.drafters.copy import lookup

MAX_LEN = 24


# -- Copy: the lookup on hand-made cases ---------------------------------------


def _lookup(outputs, enc, gamma=4, max_ngram=3, min_ngram=1, junk=0):
  """Runs `lookup` (jitted) on rows of output tokens and encoder tokens."""
  width = max(len(o) for o in outputs) + gamma + 2
  inputs = np.full((len(outputs), width), junk, np.int32)
  inputs[:, 0] = 0
  for b, o in enumerate(outputs):
    inputs[b, 1 : len(o) + 1] = o
  s = max(len(e) for e in enc)
  enc_arr = np.zeros((len(enc), s), np.int32)
  for b, e in enumerate(enc):
    enc_arr[b, : len(e)] = e
  fn = jax.jit(lookup, static_argnums=(3, 4, 5))
  tokens, num = fn(
    inputs,
    jnp.asarray([len(o) for o in outputs], jnp.int32),
    enc_arr,
    gamma,
    max_ngram,
    min_ngram,
  )
  tokens, num = np.asarray(tokens), np.asarray(num)
  return [list(t[:k]) for t, k in zip(tokens, num, strict=True)], num, tokens


def test_lookup_longest_match_wins_and_stops_at_the_input_end():
  # "6 7" occurs twice in the input, but "5 6 7" only once: its continuation
  # is proposed, EOS included, up to the input's end (not into padding).
  props, num, tokens = _lookup([[5, 6, 7]], [[6, 7, 9, 4, 5, 6, 7, 8, 1, 0]])
  assert props == [[8, 1]]
  np.testing.assert_array_equal(tokens[0, 2:], 0)


def test_lookup_most_recent_of_equal_length_wins():
  # "3 4" at input positions 0 and 3: the later one wins.
  props, _, _ = _lookup([[3, 4]], [[3, 4, 9, 3, 4, 10, 1]])
  assert props == [[10, 1]]
  # The output is more recent than the input: "4 5" in the output wins over
  # "4 5" in the input. The continuation stops at the newest token.
  props, _, _ = _lookup([[4, 5, 6, 4, 5]], [[4, 5, 8, 1]])
  assert props == [[6, 4, 5]]


def test_lookup_match_in_output_and_gamma_limit():
  props, num, _ = _lookup([[4, 5, 6, 7, 8, 9, 4, 5]], [[11, 12, 1]])
  assert props == [[6, 7, 8, 9]] and num[0] == 4
  props, _, _ = _lookup([[4, 5, 6, 7, 8, 9, 4, 5]], [[11, 12, 1]], gamma=2)
  assert props == [[6, 7]]


def test_lookup_no_match_proposes_nothing():
  props, num, tokens = _lookup(
    [[7], [], [9, 9 + 1]], [[2, 3, 1], [2, 3, 1], [2, 3, 4, 1]]
  )
  assert props == [[], [], []]
  np.testing.assert_array_equal(num, 0)
  np.testing.assert_array_equal(tokens, 0)


def test_lookup_ignores_padding_and_stale_inputs():
  # The only match is followed by padding: nothing to propose.
  _, num, _ = _lookup([[7]], [[3, 7, 0, 0]])
  assert num[0] == 0
  # Stale buffer entries past the output length (here all 7s) are neither
  # matched nor copied.
  _, num, _ = _lookup([[7]], [[3, 1]], junk=7)
  assert num[0] == 0
  props, _, _ = _lookup([[5, 7]], [[5, 7, 8, 1]], junk=7)
  assert props == [[8, 1]]


def test_lookup_min_ngram_and_batch_rows_independent():
  outputs = [[9, 4], [9, 4], [3, 4]]
  enc = [[4, 6, 1], [9, 4, 6, 1], [3, 4, 5, 1]]
  props, _, _ = _lookup(outputs, enc, min_ngram=2)
  assert props == [[], [6, 1], [5, 1]]
  props, _, _ = _lookup(outputs, enc, min_ngram=1)
  assert props == [[6, 1], [6, 1], [5, 1]]


def test_copy_rejects_bad_settings():
  with pytest.raises(ValueError, match='min_ngram'):
    Copy(vocab_size=16, max_ngram=2, min_ngram=3)


# -- NGram: estimation ---------------------------------------------------------

CORPUS = [[2, 3, 1], [2, 4, 1], [2, 3, 1], [3, 3, 3, 1, 0, 0]]


def _unigram(w):
  # Counts 1: 4, 2: 3, 3: 5, 4: 1 (13 tokens), add-k 0.1 over V = 6.
  return ({1: 4, 2: 3, 3: 5, 4: 1}.get(w, 0) + 0.1) / (13 + 0.6)


def _q(model, context):
  return np.asarray(model.probs_after(jnp.asarray([context], jnp.int32)))[0]


def test_ngram_fit_gives_the_known_probabilities():
  uni = NGram.fit(CORPUS, n=1, vocab_size=6, add_k=0.1)
  np.testing.assert_allclose(
    np.asarray(uni.unigram), [_unigram(w) for w in range(6)], rtol=1e-6
  )
  bi = NGram.fit(CORPUS, n=2, vocab_size=6, discount=0.5, add_k=0.1)
  # After the start id: 2 three times, 3 once; backoff 1 - 2.5/4 - 0.5/4.
  q = _q(bi, [0])
  np.testing.assert_allclose(q[2], 2.5 / 4 + 0.25 * _unigram(2), rtol=1e-6)
  np.testing.assert_allclose(q[5], 0.25 * _unigram(5), rtol=1e-6)
  # After 3: 1 three times, 3 twice (padding after EOS is not counted).
  q = _q(bi, [3])
  np.testing.assert_allclose(q[1], 2.5 / 5 + 0.2 * _unigram(1), rtol=1e-6)
  np.testing.assert_allclose(q[3], 1.5 / 5 + 0.2 * _unigram(3), rtol=1e-6)
  # An unseen context backs off to the unigram.
  np.testing.assert_allclose(
    _q(bi, [5]), [_unigram(w) for w in range(6)], rtol=1e-6
  )
  tri = NGram.fit(CORPUS, n=3, vocab_size=6, discount=0.5, add_k=0.1)
  q2 = 2.5 / 4 + 0.25 * _unigram(2)
  np.testing.assert_allclose(_q(tri, [0, 0])[2], 2.5 / 4 + 0.25 * q2, 1e-6)
  # (3, 3) -> 3 once, 1 once: discounted 0.25 each, backoff 0.5 to q(. | 3).
  np.testing.assert_allclose(
    _q(tri, [3, 3])[1], 0.25 + 0.5 * (2.5 / 5 + 0.2 * _unigram(1)), 1e-6
  )
  # Top-k truncation folds the dropped entries' mass into the backoff.
  top1 = NGram.fit(CORPUS, n=2, vocab_size=6, discount=0.5, top_k=1)
  q = _q(top1, [0])
  np.testing.assert_allclose(q[3], 0.375 * _unigram(3), rtol=1e-6)
  np.testing.assert_allclose(q.sum(), 1.0, rtol=1e-6)


def test_ngram_smoothing_gives_every_token_positive_probability():
  rng = np.random.default_rng(0)
  corpus = [
    list(rng.integers(2, 12, rng.integers(1, 9))) + [1] for _ in range(50)
  ]
  for n in (1, 2, 3):
    model = NGram.fit(corpus, n=n, vocab_size=16)
    contexts = rng.integers(0, 16, (64, max(n - 1, 0))).astype(np.int32)
    contexts[:8] = np.asarray(corpus[0][: n - 1] + [0] * n)[: n - 1]
    q = np.asarray(model.probs_after(jnp.asarray(contexts)))
    assert q.min() > 0.0
    np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-5)


def test_ngram_hash_table_scales_to_t5_vocabularies_and_collisions_back_off():
  v = 32128
  rng = np.random.default_rng(1)
  # Zipf-like ids over the whole vocabulary.
  corpus = [
    list(np.minimum(rng.zipf(1.3, rng.integers(3, 30)), v - 2) + 1) + [1]
    for _ in range(3000)
  ]
  full = NGram.fit(corpus, n=3, vocab_size=v, load=0.25, probes=8)
  num_tokens = sum(len(s) for s in corpus)
  for keys in full.keys:
    # A power of two sized by the data (at most 2 x tokens / load), not by
    # V^(n - 1).
    h = keys.shape[0]
    assert h & (h - 1) == 0 and h <= 2 * num_tokens / 0.25
  ctx = np.asarray([[0, 0], [0, 2], [2, 3], [7, 7]], np.int32)
  q = np.asarray(full.probs_after(jnp.asarray(ctx)))
  assert q.shape == (4, v) and q.min() > 0
  np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-4)
  # A crowded table (one probe, load 1): some bigram contexts find no
  # bucket and back off to the unigram; the others are unchanged.
  crowded = NGram.fit(corpus, n=2, vocab_size=v, load=1.0, probes=1)
  full2 = NGram.fit(corpus, n=2, vocab_size=v, load=0.25, probes=8)
  seen = np.unique([c for s in corpus for c in [0] + s[:-1]])[:, None]
  qc = np.asarray(crowded.probs_after(jnp.asarray(seen, jnp.int32)))
  qf = np.asarray(full2.probs_after(jnp.asarray(seen, jnp.int32)))
  same = np.all(np.isclose(qc, qf, rtol=1e-5, atol=1e-9), axis=1)
  backed_off = np.all(
    np.isclose(qc, np.asarray(crowded.unigram)[None], rtol=1e-5), axis=1
  )
  assert np.all(same | backed_off)
  assert 0 < backed_off.sum() < 0.5 * len(seen)
  np.testing.assert_allclose(qc.sum(-1), 1.0, rtol=1e-4)


def test_ngram_save_load_round_trip(tmp_path):
  model = NGram.fit(CORPUS, n=3, vocab_size=6)
  model.save(tmp_path / 'tri.npz')
  again = NGram.load(tmp_path / 'tri.npz')
  assert again.order == 3 and again.vocab_size == 6
  ctx = jnp.asarray([[0, 0], [3, 3], [4, 5]], jnp.int32)
  np.testing.assert_allclose(again.probs_after(ctx), model.probs_after(ctx))


def test_ngram_propose_samples_from_the_reported_q():
  """Each proposed token is drawn from its own q given the earlier ones."""
  model = NGram.fit(CORPUS, n=2, vocab_size=6)
  settings = DecodeSettings(
    max_decode_len=8, sampler=sd.Sampler(temperature=1.0), gamma=3
  )
  batch = 20_000
  inputs = jnp.zeros((batch, 12), jnp.int32).at[:, 1].set(2)
  keys = jax.random.split(jax.random.key(0), batch * 3).reshape(batch, 3)
  context = drafter.DraftContext(
    inputs=inputs,
    length=jnp.ones((batch,), jnp.int32),
    encoder_tokens=jnp.ones((batch, 3), jnp.int32),
    keys=keys,
  )
  proposal, _ = jax.jit(model.propose, static_argnums=2)(
    None, context, settings
  )
  tokens, q = np.asarray(proposal.tokens), np.asarray(proposal.q)
  np.testing.assert_allclose(q[:, 0], np.tile(_q(model, [2]), (batch, 1)), 1e-5)
  for i in (1, 2):
    np.testing.assert_allclose(
      q[:, i],
      np.asarray(model.probs_after(jnp.asarray(tokens[:, i - 1 : i]))),
      rtol=1e-5,
    )
  # First token frequencies match q(. | 2) (4 sigma per token).
  freq = np.bincount(tokens[:, 0], minlength=6) / batch
  expect = _q(model, [2])
  assert np.all(np.abs(freq - expect) < 4 * np.sqrt(expect / batch) + 1e-3)


# -- Exactness: greedy identity ------------------------------------------------


@pytest.fixture(scope='module')
def inputs():
  return encoder_batch(8, 7, 16, seed=0)


@pytest.fixture(scope='module')
def plain_greedy(target, inputs):
  return sd.generate(target, inputs, max_decode_len=MAX_LEN)


@pytest.fixture(scope='module')
def target_outputs(target):
  """The target's greedy outputs on other inputs: a corpus to fit on."""
  return sd.generate(
    target, encoder_batch(64, 7, 16, seed=1), max_decode_len=MAX_LEN
  ).tokens


@pytest.mark.parametrize('gamma', [1, 3, 5])
def test_greedy_speculative_equals_greedy_plain(
  target, inputs, plain_greedy, target_outputs, gamma
):
  # Rows end at different lengths, some with EOS inside the horizon.
  assert (plain_greedy.lengths < MAX_LEN).sum() >= 2
  assert len(set(plain_greedy.lengths.tolist())) >= 3
  drafters = {
    'bigram': NGram.fit(target_outputs, n=2, vocab_size=16),
    'copy': Copy(vocab_size=16, max_ngram=3),
  }
  if gamma == 3:
    drafters['unigram'] = NGram.fit(target_outputs, n=1, vocab_size=16)
    drafters['trigram'] = NGram.fit(target_outputs, n=3, vocab_size=16)
  for name, draft in drafters.items():
    out = sd.generate(
      target, inputs, draft=draft, gamma=gamma, max_decode_len=MAX_LEN
    )
    np.testing.assert_array_equal(out.tokens, plain_greedy.tokens, name)
    np.testing.assert_array_equal(out.lengths, plain_greedy.lengths, name)
    if name == 'copy':
      # Some iterations had no match (nothing proposed), others did.
      assert 0 < out.stats.mean_proposed < gamma
    else:
      assert out.stats.mean_proposed == gamma


# -- Exactness: whole-sequence distribution at t = 1 ---------------------------


@flax.struct.dataclass(kw_only=True)
class LyingCopy(WrappedDrafter):
  """Negative control: proposes as Copy does, but reports q uniform."""

  def propose(self, state, context, settings):
    proposal, state = self.inner.propose(state, context, settings)
    uniform = jnp.full_like(proposal.q, 1.0 / self.vocab_size)
    return proposal.replace(q=uniform), state


@pytest.fixture(scope='module')
def dist_target():
  return target_model()


def _check_samples_target(target, draft, settings):
  seqs, p = exact_probs(target, ENC, sd.Sampler(**settings))
  samples, run_stats = sample_sequences(target, draft, ENC, gamma=3, **settings)
  # Rows accepted different numbers of tokens inside the same batches.
  per_row = run_stats[0].row_accepted_histogram
  assert len({tuple(h) for h in per_row}) > 5
  assert 0.05 < run_stats[0].alpha < 0.95
  return g_test(samples, seqs, p), run_stats


@pytest.mark.parametrize(
  'settings', [dict(temperature=1.0), dict(temperature=0.7, top_k=3)]
)
def test_ngram_draft_samples_the_target_distribution(dist_target, settings):
  corpus = sd.generate(
    dist_target,
    np.repeat(ENC, 2000, 0),
    temperature=1.0,
    max_decode_len=4,
    seed=np.arange(10**6, 10**6 + 2000),
  ).tokens
  draft = NGram.fit(corpus, n=2, vocab_size=DIST_V)
  p_value, _ = _check_samples_target(dist_target, draft, settings)
  assert p_value > FALSE_ALARM


def test_copy_draft_samples_the_target_distribution(dist_target):
  draft = Copy(vocab_size=DIST_V, max_ngram=2)
  p_value, run_stats = _check_samples_target(
    dist_target, draft, dict(temperature=1.0)
  )
  # Some rows had no match in some iterations: fewer than G proposed.
  assert run_stats[0].mean_proposed < 3
  assert p_value > FALSE_ALARM


def test_negative_control_copy_lying_about_q_is_detected(dist_target):
  draft = LyingCopy(inner=Copy(vocab_size=DIST_V, max_ngram=2))
  seqs, p = exact_probs(dist_target, ENC, sd.Sampler(temperature=1.0))
  samples, _ = sample_sequences(
    dist_target, draft, ENC, gamma=3, temperature=1.0
  )
  assert g_test(samples, seqs, p) < FALSE_ALARM


# -- Usefulness: acceptance on task fixtures -----------------------------------


def test_bigram_beats_unigram_on_a_bigram_task():
  """Targets follow a bigram structure; the drafts are fit on its outputs.

  The task: a `TableLM` whose next token mostly follows a fixed permutation
  of the ordinary ids (logit +4 over standard-normal noise), so the greedy
  output walks through many distinct ids and sampled outputs vary.
  """
  v = 32
  rng = np.random.default_rng(11)
  table = rng.normal(0.0, 1.0, (v, v))
  perm = rng.permutation(np.arange(2, v))
  table[np.arange(2, v), perm] += 4.0
  table[0, perm[0]] += 4.0
  task = sd.TableLM(table=jnp.asarray(table, jnp.float32))
  enc = np.full((2000, 3), 5, np.int32)
  train = sd.generate(
    task, enc, temperature=1.0, max_decode_len=MAX_LEN, seed=1
  ).tokens
  alphas = {}
  for n in (1, 2):
    draft = NGram.fit(train, n=n, vocab_size=v)
    for t in (0.0, 1.0):
      out = sd.generate(
        task,
        enc[:64],
        draft=draft,
        gamma=3,
        temperature=t,
        max_decode_len=MAX_LEN,
        seed=2,
      )
      alphas[n, t] = out.stats.alpha
  # Measured: unigram 0.0 / 0.36, bigram 1.0 / 0.94 (t = 0 / 1).
  for t in (0.0, 1.0):
    assert alphas[2, t] > 0.8, alphas
    assert alphas[2, t] > alphas[1, t] + 0.3, alphas


@flax.struct.dataclass(kw_only=True)
class CopyingState:
  """Attributes: `index [B] int32` inputs held; `source [B, S]` the input."""

  index: jax.Array
  source: jax.Array


@flax.struct.dataclass(kw_only=True)
class CopyingLM:
  """A target that copies its input: output token k is input token k."""

  vocab: int = flax.struct.field(pytree_node=False)
  vocabulary = None

  @property
  def vocab_size(self):
    return self.vocab

  def init_state(self, encoder_tokens, length):
    del length
    batch = encoder_tokens.shape[0]
    return CopyingState(
      index=jnp.zeros((batch,), jnp.int32), source=encoder_tokens
    )

  def score(self, state, tokens):
    t = tokens.shape[1]
    pos = state.index[:, None] + jnp.arange(t)[None]
    s = state.source.shape[1]
    nxt = jnp.take_along_axis(state.source, jnp.minimum(pos, s - 1), axis=1)
    nxt = jnp.where((pos < s) & (nxt != 0), nxt, sd.EOS_ID)
    logits = 12.0 * jax.nn.one_hot(nxt, self.vocab, dtype=jnp.float32)
    return logits, state.replace(index=state.index + t)

  def rollback(self, state, index):
    return state.replace(index=jnp.asarray(index, jnp.int32))


def test_copy_is_accepted_when_the_target_copies_its_input():
  v = 64
  enc = encoder_batch(16, 20, v, seed=3)
  lengths = (enc != 0).sum(1)
  enc[np.arange(16), lengths - 1] = sd.EOS_ID
  target = CopyingLM(vocab=v)
  plain = sd.generate(target, enc, max_decode_len=24)
  np.testing.assert_array_equal(plain.lengths, lengths)
  for t in (0.0, 1.0):
    out = sd.generate(
      target,
      enc,
      draft=Copy(vocab_size=v, max_ngram=3),
      gamma=4,
      temperature=t,
      max_decode_len=24,
    )
    if t == 0.0:
      np.testing.assert_array_equal(out.tokens, plain.tokens)
    assert out.stats.alpha > 0.9
    assert out.stats.tokens_per_call > 2.5

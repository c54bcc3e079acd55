"""The decoding loops: exactness of greedy decoding, batching, stats, errors."""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch
from conftest import tiny_config

import spec_decode as sd
from spec_decode.chain import loops

MAX_LEN = 24


@pytest.fixture(scope='module')
def inputs():
  return encoder_batch(8, 7, 16, seed=0)


@pytest.fixture(scope='module')
def plain_greedy(target, inputs):
  return sd.generate(target, inputs, max_decode_len=MAX_LEN)


def test_plain_greedy_matches_teacher_forced_argmax(
  target, inputs, plain_greedy
):
  tokens = plain_greedy.tokens
  logits = np.asarray(
    target.logits(
      inputs, np.concatenate([np.zeros((8, 1), np.int32), tokens[:, :-1]], 1)
    )
  )
  for b in range(8):
    n = plain_greedy.lengths[b]
    np.testing.assert_array_equal(tokens[b, :n], logits[b, :n].argmax(-1))
    assert (tokens[b, n:] == 0).all()
    if n < MAX_LEN:
      assert tokens[b, n - 1] == sd.EOS_ID


@pytest.mark.accel
@pytest.mark.parametrize('gamma', [1, 3, 7])
def test_greedy_speculative_equals_greedy_plain(
  target, near_draft, far_draft, inputs, plain_greedy, gamma
):
  # EOS inside the horizon for some rows, not all: rows stop at different
  # iterations.
  assert (plain_greedy.lengths < MAX_LEN).sum() >= 2
  assert (plain_greedy.lengths == MAX_LEN).sum() >= 2
  for draft in (near_draft, far_draft):
    out = sd.generate(
      target, inputs, draft=draft, gamma=gamma, max_decode_len=MAX_LEN
    )
    np.testing.assert_array_equal(out.tokens, plain_greedy.tokens)
    np.testing.assert_array_equal(out.lengths, plain_greedy.lengths)
  # The near draft gives mixed acceptance: rows accept different counts.
  out = sd.generate(
    target, inputs, draft=near_draft, gamma=gamma, max_decode_len=MAX_LEN
  )
  hist = out.stats.accepted_histogram
  assert hist[0] > 0 and hist[1:].sum() > 0
  assert 0.2 < out.stats.alpha < 0.95


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_draft_equal_to_target_accepts_everything(target, inputs, temperature):
  out = sd.generate(
    target,
    inputs,
    draft=target,
    gamma=3,
    temperature=temperature,
    max_decode_len=MAX_LEN,
    seed=11,
  )
  plain = sd.generate(
    target, inputs, temperature=temperature, max_decode_len=MAX_LEN, seed=11
  )
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_allclose(out.stats.alpha, 1.0, atol=1e-5)
  np.testing.assert_allclose(
    out.stats.per_position_acceptance[out.stats.per_position_acceptance > 0],
    1.0,
  )
  # Only the last iteration of a row may stop early (EOS or max length).
  assert out.stats.accepted_histogram[:3].sum() <= 8


def test_row_results_do_not_depend_on_batch(target, near_draft, inputs):
  seeds = np.arange(100, 108)
  batch = sd.generate(
    target,
    inputs,
    draft=near_draft,
    gamma=3,
    temperature=1.0,
    max_decode_len=MAX_LEN,
    seed=seeds,
  )
  for b in (0, 5):
    alone = sd.generate(
      target,
      inputs[b : b + 1],
      draft=near_draft,
      gamma=3,
      temperature=1.0,
      max_decode_len=MAX_LEN,
      seed=seeds[b : b + 1],
    )
    np.testing.assert_array_equal(alone.tokens[0], batch.tokens[b])
  # Reordering the batch reorders the results.
  perm = np.array([3, 1, 7, 0, 2, 6, 4, 5])
  shuffled = sd.generate(
    target,
    inputs[perm],
    draft=near_draft,
    gamma=3,
    temperature=1.0,
    max_decode_len=MAX_LEN,
    seed=seeds[perm],
  )
  np.testing.assert_array_equal(shuffled.tokens, batch.tokens[perm])


def test_int_seed_derives_per_row_seeds(target, inputs):
  a = sd.generate(target, inputs, temperature=1.0, max_decode_len=8, seed=3)
  b = sd.generate(target, inputs, temperature=1.0, max_decode_len=8, seed=3)
  c = sd.generate(target, inputs, temperature=1.0, max_decode_len=8, seed=4)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert (a.tokens != c.tokens).any()
  # Identical inputs in one batch still get different draws.
  same = np.repeat(inputs[:1], 8, axis=0)
  d = sd.generate(target, same, temperature=1.0, max_decode_len=8, seed=3)
  assert len({tuple(r) for r in d.tokens}) > 1


def test_stats_are_consistent(target, near_draft, inputs):
  out = sd.generate(
    target,
    inputs,
    draft=near_draft,
    gamma=4,
    temperature=1.0,
    max_decode_len=MAX_LEN,
    seed=5,
  )
  s = out.stats
  assert s.accepted_histogram.shape == (5,)
  assert s.per_position_acceptance.shape == (4,)
  assert s.row_accepted_histogram.shape == (8, 5)
  np.testing.assert_array_equal(
    s.row_accepted_histogram.sum(1), s.row_iterations
  )
  assert s.target_calls == s.row_iterations.max()
  assert s.draft_calls == 4 * s.target_calls
  # Every iteration emits between 1 and gamma + 1 tokens.
  assert (out.lengths >= s.row_iterations).all()
  assert (out.lengths <= 5 * s.row_iterations).all()
  assert 0.0 < s.alpha <= 1.0
  assert (
    (0 <= s.per_position_acceptance) & (s.per_position_acceptance <= 1)
  ).all()


def test_table_model_as_target_and_as_draft(target, inputs, plain_greedy):
  table = sd.TableLM.random(16, seed=2, scale=3.0)
  out = sd.generate(
    target, inputs, draft=table, gamma=3, max_decode_len=MAX_LEN
  )
  np.testing.assert_array_equal(out.tokens, plain_greedy.tokens)
  table_plain = sd.generate(table, inputs, max_decode_len=MAX_LEN)
  table_draft = sd.TableLM(
    table=table.table
    + 0.3
    * np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
  )
  spec = sd.generate(
    table, inputs, draft=table_draft, gamma=4, max_decode_len=MAX_LEN
  )
  np.testing.assert_array_equal(spec.tokens, table_plain.tokens)
  spec_t5 = sd.generate(
    table, inputs, draft=target, gamma=2, max_decode_len=MAX_LEN
  )
  np.testing.assert_array_equal(spec_t5.tokens, table_plain.tokens)


def test_no_recompilation_for_new_inputs(target, near_draft):
  kwargs = dict(draft=near_draft, gamma=2, max_decode_len=10, temperature=1.0)
  sd.generate(target, encoder_batch(4, 6, 16, seed=1), seed=1, **kwargs)
  before = loops.speculative_decode_jit._cache_size()
  for s in range(2, 5):
    sd.generate(target, encoder_batch(4, 6, 16, seed=s), seed=s, **kwargs)
  sd.generate(
    target, encoder_batch(4, 6, 16, seed=9), seed=np.arange(4), **kwargs
  )
  assert loops.speculative_decode_jit._cache_size() == before


def test_max_decode_len_one(target, near_draft, inputs):
  out = sd.generate(target, inputs, draft=near_draft, gamma=3, max_decode_len=1)
  plain = sd.generate(target, inputs, max_decode_len=1)
  assert out.tokens.shape == (8, 1)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.lengths, 1)


BAD = [
  (dict(gamma=0), 'gamma'),
  (dict(gamma=2.5), 'gamma'),
  (dict(temperature=-1.0), 'temperature'),
  (dict(top_k=-2), 'top_k'),
  (dict(top_p=0.0), 'top_p'),
  (dict(top_p=1.01), 'top_p'),
  (dict(max_decode_len=0), 'max_decode_len'),
  (dict(seed=np.arange(3)), 'seed'),
]


@pytest.mark.parametrize('kwargs,name', BAD)
def test_bad_arguments_name_themselves(
  target, near_draft, inputs, kwargs, name
):
  before = loops.speculative_decode_jit._cache_size()
  with pytest.raises(ValueError, match=name):
    sd.generate(target, inputs, draft=near_draft, **kwargs)
  assert loops.speculative_decode_jit._cache_size() == before


@pytest.mark.parametrize(
  'tokens,match',
  [
    (np.zeros((4,), np.int32), '2-D'),
    (np.zeros((2, 3, 4), np.int32), '2-D'),
    (np.zeros((2, 3), np.float32), 'integers'),
    (np.full((2, 3), 16, np.int32), r'\[0, 16\)'),
    (np.full((2, 3), -1, np.int32), r'\[0, 16\)'),
  ],
)
def test_bad_tokens(target, tokens, match):
  with pytest.raises(ValueError, match=match):
    sd.generate(target, tokens)


def test_vocabulary_mismatch_is_an_error(target):
  other = sd.Model.init(tiny_config(vocab_size=20), seed=0)
  with pytest.raises(ValueError, match='vocabularies differ'):
    sd.generate(target, jnp.ones((1, 3), jnp.int32), draft=other)
  with pytest.raises(ValueError, match='vocabularies differ'):
    sd.generate(target, np.ones((1, 3), np.int32), draft=sd.TableLM.random(17))


@pytest.mark.parametrize('gamma', [2, 'auto'])
def test_provenance_says_where_each_token_came_from(
  target, near_draft, inputs, gamma
):
  """Greedy: accepted tokens are the draft's argmax after the output so
  far, a replaced token is the target's and its rejected token the
  draft's; the iterations and accepted tokens match the counters."""
  from spec_decode.core import provenance as prov  # pylint: disable=g-import-not-at-top

  out = sd.generate(
    target, inputs, draft=near_draft, gamma=gamma, max_decode_len=MAX_LEN
  )
  p = out.provenance
  assert p.codes.shape == out.tokens.shape
  prev = np.concatenate([np.zeros((8, 1), np.int32), out.tokens[:, :-1]], 1)
  draft_argmax = np.asarray(near_draft.logits(inputs, prev)).argmax(-1)
  kinds_seen = set()
  for r in range(8):
    n = out.lengths[r]
    kinds = np.asarray(p.kinds(r))
    assert len(kinds) == n and (p.codes[r, n:] == 0).all()
    kinds_seen |= set(kinds.tolist())
    acc = kinds == prov.ACCEPTED
    np.testing.assert_array_equal(
      out.tokens[r, :n][acc], draft_argmax[r, :n][acc]
    )
    rep = kinds == prov.REPLACED
    np.testing.assert_array_equal(
      p.rejected[r, :n][rep], draft_argmax[r, :n][rep]
    )
    assert (p.rejected[r, :n][rep] != out.tokens[r, :n][rep]).all()
    assert (p.rejected[r, :n][~rep] == -1).all()
    assert len(p.iterations(r)) == out.stats.row_iterations[r]
    assert acc.sum() == out.stats.row_position_accepts[r].sum()
  if gamma == 'auto' and not out.stats.row_gamma_histogram[:, 1:].any():
    assert kinds_seen == {prov.TARGET}  # The policy ran gamma 0 only.
  else:
    assert {prov.ACCEPTED, prov.REPLACED, prov.BONUS} <= kinds_seen
  assert p.codes.dtype == np.int8


def test_provenance_off_changes_nothing_else(target, near_draft, inputs):
  import dataclasses  # pylint: disable=g-import-not-at-top

  from spec_decode.core import inputs as inputs_lib  # pylint: disable=g-import-not-at-top

  settings = sd.DecodeSettings(max_decode_len=MAX_LEN, gamma=3)
  keys = inputs_lib.row_keys(0, 8)
  on = loops.speculative_decode_jit(
    target, near_draft, jnp.asarray(inputs), keys, settings=settings
  )
  off = loops.speculative_decode_jit(
    target,
    near_draft,
    jnp.asarray(inputs),
    keys,
    settings=dataclasses.replace(settings, provenance=False),
  )
  assert off[3] is None and on[3] is not None
  np.testing.assert_array_equal(on[0], off[0])
  np.testing.assert_array_equal(on[2].iterations, off[2].iterations)

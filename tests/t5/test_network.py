"""The T5 network and its per-row cache against teacher forcing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch
from conftest import tiny_config

import spec_decode as sd
from spec_decode.t5 import network

CONFIGS = {
  'v1_1': tiny_config(vocab_size=24),
  'original': tiny_config(
    vocab_size=24, mlp_activations=('relu',), logits_via_embedding=True
  ),
}


def _decoder_inputs(batch, length, vocab, seed=3):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, vocab, (batch, length)).astype(np.int32)
  tokens[:, 0] = 0
  return tokens


@pytest.fixture(scope='module', params=sorted(CONFIGS))
def model(request):
  return sd.Model.init(CONFIGS[request.param], seed=0)


def _step_by_step(model, enc, dec, chunks):
  state = model.init_state(jnp.asarray(enc), dec.shape[1] + 3)
  out, t = [], 0
  for size in chunks:
    logits, state = model.score(state, jnp.asarray(dec[:, t : t + size]))
    out.append(logits)
    t += size
  np.testing.assert_array_equal(state.cache.index, t)
  return np.concatenate(out, axis=1)


def test_one_token_at_a_time_equals_teacher_forcing(model):
  enc = encoder_batch(3, 7, model.vocab_size)
  dec = _decoder_inputs(3, 9, model.vocab_size)
  full = np.asarray(model.logits(enc, dec))
  stepped = _step_by_step(model, enc, dec, [1] * 9)
  np.testing.assert_allclose(stepped, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('chunks', [(9,), (2, 3, 4), (4, 1, 4), (1, 8)])
def test_multi_token_calls_equal_teacher_forcing(model, chunks):
  enc = encoder_batch(3, 7, model.vocab_size)
  dec = _decoder_inputs(3, 9, model.vocab_size)
  full = np.asarray(model.logits(enc, dec))
  np.testing.assert_allclose(
    _step_by_step(model, enc, dec, chunks), full, rtol=1e-5, atol=1e-5
  )


def test_block_write_equals_single_writes(model):
  enc = jnp.asarray(encoder_batch(2, 5, model.vocab_size))
  dec = jnp.asarray(_decoder_inputs(2, 6, model.vocab_size))
  s1 = model.init_state(enc, 8)
  _, s1 = model.score(s1, dec)
  s2 = model.init_state(enc, 8)
  for t in range(6):
    _, s2 = model.score(s2, dec[:, t : t + 1])
  for a, b in zip(
    s1.cache.keys + s1.cache.values,
    s2.cache.keys + s2.cache.values,
    strict=True,
  ):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_rollback_then_rewrite_equals_never_written(model):
  enc = jnp.asarray(encoder_batch(2, 5, model.vocab_size))
  dec = jnp.asarray(_decoder_inputs(2, 8, model.vocab_size))
  junk = jnp.asarray(_decoder_inputs(2, 4, model.vocab_size, seed=9))
  clean = model.init_state(enc, 12)
  _, clean = model.score(clean, dec[:, :3])
  want, _ = model.score(clean, dec[:, 3:])

  dirty = model.init_state(enc, 12)
  _, dirty = model.score(dirty, dec[:, :3])
  _, dirty = model.score(dirty, junk)  # rejected tokens at 3..6
  dirty = model.rollback(dirty, jnp.array([3, 3]))
  got, dirty = model.score(dirty, dec[:, 3:])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(dirty.cache.index, [8, 8])


def test_rows_at_different_indices(model):
  """Each row writes at its own index and sees only its own valid slots."""
  enc = jnp.asarray(encoder_batch(2, 5, model.vocab_size))
  dec = jnp.asarray(_decoder_inputs(2, 8, model.vocab_size))
  full = np.asarray(model.logits(enc, dec))
  state = model.init_state(enc, 12)
  _, state = model.score(state, dec[:, :4])
  state = model.rollback(state, jnp.array([2, 4]))
  # Row 0 re-feeds inputs 2..4, row 1 feeds 4..6: both from their index.
  tokens = jnp.stack([dec[0, 2:5], dec[1, 4:7]])
  logits, state = model.score(state, tokens)
  np.testing.assert_allclose(logits[0], full[0, 2:5], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits[1], full[1, 4:7], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(state.cache.index, [5, 7])


def test_log_probs_match_logits(model):
  enc = encoder_batch(2, 5, model.vocab_size)
  targets = _decoder_inputs(2, 6, model.vocab_size)[:, 1:]
  lp = np.asarray(model.log_probs(enc, targets))
  inputs = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], 1)
  logits = np.asarray(model.logits(enc, inputs), np.float64)
  ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(
    lp, np.take_along_axis(ref, targets[..., None], -1)[..., 0], atol=1e-5
  )


def test_encoder_padding_is_invisible(model):
  enc = encoder_batch(1, 5, model.vocab_size)
  enc[0, 3:] = 0
  padded = np.concatenate([enc, np.zeros((1, 4), np.int32)], axis=1)
  dec = _decoder_inputs(1, 4, model.vocab_size)
  np.testing.assert_allclose(
    model.logits(enc, dec), model.logits(padded, dec), rtol=1e-5, atol=1e-5
  )


def test_t5x_parameter_names_and_axes():
  m = sd.Model.init(CONFIGS['v1_1'])
  p = m.params
  cfg = m.config
  inner = cfg.num_heads * cfg.head_dim
  assert p['token_embedder']['embedding'].shape == (cfg.vocab_size, cfg.emb_dim)
  assert p['encoder']['relpos_bias']['rel_embedding'].shape == (
    cfg.num_heads,
    cfg.relative_attention_num_buckets,
  )
  layer = p['decoder']['layers_0']
  assert set(layer) == {
    'pre_self_attention_layer_norm',
    'self_attention',
    'pre_cross_attention_layer_norm',
    'encoder_decoder_attention',
    'pre_mlp_layer_norm',
    'mlp',
  }
  assert layer['self_attention']['query']['kernel'].shape == (
    cfg.emb_dim,
    inner,
  )
  assert layer['self_attention']['out']['kernel'].shape == (inner, cfg.emb_dim)
  assert set(layer['mlp']) == {'wi_0', 'wi_1', 'wo'}
  assert p['decoder']['logits_dense']['kernel'].shape == (
    cfg.emb_dim,
    cfg.vocab_size,
  )
  axes = m.param_axes()
  assert tuple(axes['decoder']['layers_0']['mlp']['wo']['kernel']) == (
    'mlp',
    'embed',
  )
  assert tuple(axes['encoder']['layers_1']['attention']['query']['kernel']) == (
    'embed',
    'joined_kv',
  )
  orig = sd.Model.init(CONFIGS['original']).params
  assert 'logits_dense' not in orig['decoder']
  assert set(orig['encoder']['layers_0']['mlp']) == {'wi', 'wo'}


def test_relative_position_buckets_match_t5():
  # T5's bucketing (32 buckets, max distance 128), worked by hand: exact
  # buckets below max_exact (8 bidirectional, 16 causal), then
  # max_exact + floor(log(n / max_exact) / log(128 / max_exact) * rest).
  rel = jnp.array([-200, -64, -16, -8, -7, -1, 0, 1, 7, 8, 16, 64, 200])
  got = network.relative_position_bucket(rel, True, 32, 128)
  np.testing.assert_array_equal(
    got, [15, 14, 10, 8, 7, 1, 0, 17, 23, 24, 26, 30, 31]
  )
  got = network.relative_position_bucket(-rel, False, 32, 128)
  np.testing.assert_array_equal(got, [0, 0, 0, 0, 0, 0, 0, 1, 7, 8, 16, 26, 31])


def test_dropout_only_in_training():
  cfg = CONFIGS['v1_1'].replace(dropout_rate=0.5)
  m = sd.Model.init(cfg)
  enc = jnp.asarray(encoder_batch(2, 5, cfg.vocab_size))
  dec = jnp.asarray(_decoder_inputs(2, 4, cfg.vocab_size))
  mod = network.Transformer(cfg)
  a = mod.apply({'params': m.params}, enc, dec)
  b = mod.apply({'params': m.params}, enc, dec)
  np.testing.assert_array_equal(a, b)
  c = mod.apply(
    {'params': m.params},
    enc,
    dec,
    deterministic=False,
    rngs={'dropout': jax.random.key(0)},
  )
  assert np.abs(np.asarray(c) - np.asarray(a)).max() > 1e-3

"""The small-K CPU kernel inside the network and the decoding loops.

Kernel-on tests skip when the library is unavailable (no compiler, or
`SPEC_DECODE_KERNEL=0`); the kernel-off tests run either way. With the kernel
available, every `Model` the suite builds is packed, so the rest of the suite
(decoding, distribution tests) runs with the kernel on; run it with
`SPEC_DECODE_KERNEL=0` for the canonical path.
"""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch
from conftest import perturbed
from conftest import tiny_config

import spec_decode as sd
from spec_decode.kernels import ops
from spec_decode.models import packing
from spec_decode.models import t5_model
from spec_decode.t5 import network

needs_kernel = pytest.mark.skipif(
  not ops.available(), reason=f'kernel unavailable: {ops.info()}'
)

MAX_LEN = 24
_CALL = 'spec_decode_smallm'


@pytest.fixture(scope='module')
def inputs():
  return encoder_batch(8, 7, 16, seed=0)


@pytest.fixture(scope='module')
def canonical(target):
  return target.unpacked()


def _score_hlo(model: sd.Model, batch: int = 2, t: int = 3) -> str:
  enc = jnp.ones((batch, 5), jnp.int32)
  state = model.init_state(enc, 16)
  fn = jax.jit(lambda m, s, x: m.score(s, x)[0])
  return fn.lower(model, state, jnp.zeros((batch, t), jnp.int32)).as_text()


def _flat_keys(tree) -> set[str]:
  return {
    jax.tree_util.keystr(p)
    for p, _ in jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, ops.Packed)
    )[0]
  }


# ---------------------------------------------------------------------------
# Packing and the switch.


@needs_kernel
def test_suite_models_are_packed_by_default(target):
  """So tests/chain/test_loops.py and test_distribution.py run kernel-on."""
  assert target.packed is not None
  assert sd.Model.init(tiny_config(), seed=0).packed is not None


@needs_kernel
def test_packed_tree_holds_decode_weights_only(target):
  keys = _flat_keys(target.packed)
  layer = "['decoder']['layers_0']"
  for name in (
    "['self_attention']['query']",
    "['self_attention']['key']",
    "['self_attention']['value']",
    "['self_attention']['out']",
    "['encoder_decoder_attention']['query']",
    "['encoder_decoder_attention']['out']",
    "['mlp']['wi_0']",
    "['mlp']['wi_1']",
    "['mlp']['wo']",
  ):
    assert f"{layer}{name}['kernel']" in keys
  assert "['decoder']['logits_dense']['kernel']" in keys
  assert not any('encoder' in k.split("['decoder']")[0] for k in keys)
  assert not any(
    "['encoder_decoder_attention']['key']" in k
    or "['encoder_decoder_attention']['value']" in k
    for k in keys
  )
  # The packed weights are the parameters, and jit arguments (pytree leaves).
  np.testing.assert_array_equal(
    ops.unpack(target.packed['decoder']['logits_dense']['kernel']),
    target.params['decoder']['logits_dense']['kernel'],
  )
  assert len(jax.tree.leaves(target)) == (
    len(jax.tree.leaves(target.params)) + len(jax.tree.leaves(target.packed))
  )
  # The parameter tree is untouched.
  assert jax.tree.structure(target.params) == jax.tree.structure(
    sd.Model.init(tiny_config()).params
  )


@needs_kernel
def test_tied_logits_pack_the_transposed_embedding():
  m = sd.Model.init(
    tiny_config(logits_via_embedding=True, mlp_activations=('relu',)), seed=2
  )
  assert "['token_embedder']['attend']" in _flat_keys(m.packed)
  np.testing.assert_array_equal(
    ops.unpack(m.packed['token_embedder']['attend']),
    m.params['token_embedder']['embedding'].T,
  )
  enc = encoder_batch(4, 6, 16, seed=3)
  dec = np.zeros((4, 5), np.int32)
  np.testing.assert_allclose(
    _block_logits(m, enc, dec),
    _block_logits(m.unpacked(), enc, dec),
    rtol=1e-5,
    atol=1e-5,
  )


@needs_kernel
def test_kernel_on_calls_the_kernel_inside_jit(target):
  assert _CALL in _score_hlo(target)
  assert _CALL not in _score_hlo(target.unpacked())


def test_kernel_off_is_the_canonical_path(monkeypatch):
  cfg = tiny_config()
  off = sd.Model.init(cfg.replace(cpu_kernel=False), seed=0)
  assert off.packed is None
  assert _CALL not in _score_hlo(off)
  monkeypatch.setenv('SPEC_DECODE_KERNEL', '0')
  env_off = sd.Model.init(cfg, seed=0)
  assert env_off.packed is None
  assert not t5_model.cpu_kernel_enabled(cfg)
  jax.tree.map(np.testing.assert_array_equal, env_off.params, off.params)


def test_packed_weights_without_the_kernel_fall_back(monkeypatch, target):
  """`pack_for_cpu` with the library off: einsum on the packed layout."""
  monkeypatch.setenv('SPEC_DECODE_KERNEL', '0')
  packed = target.unpacked().pack_for_cpu()
  assert packed.packed is not None
  assert _CALL not in _score_hlo(packed)
  enc = encoder_batch(4, 7, 16, seed=1)
  dec = np.zeros((4, 4), np.int32)
  np.testing.assert_allclose(
    _block_logits(packed, enc, dec),
    _block_logits(target.unpacked(), enc, dec),
    rtol=1e-5,
    atol=1e-5,
  )


def test_config_field_round_trips():
  cfg = tiny_config(cpu_kernel=False)
  assert sd.T5Config.from_json(cfg.to_json()) == cfg
  old = cfg.to_dict()
  del old['cpu_kernel']  # configs written before the field existed
  assert sd.T5Config.from_dict(old).cpu_kernel


# ---------------------------------------------------------------------------
# Row independence.


def _block_logits(model, enc, dec, prefix: int = 0):
  """Logits of `dec [B, T]` scored in one call after `prefix` zeros."""
  enc = jnp.asarray(enc)
  state = model.init_state(enc, 32)
  if prefix:
    _, state = model.score(state, jnp.zeros((enc.shape[0], prefix), jnp.int32))
  return np.asarray(model.score(state, jnp.asarray(dec))[0])


@needs_kernel
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_dense_rows_are_bitwise_independent_of_k(dtype):
  """A Dense on the packed path: one token alone, or among gamma + 1 per
  row of a batch (K = 1 .. 64, past the kernel's own `MAX_K`)."""
  cfg = tiny_config()
  dense = network.Dense(cfg, 48, ('embed', 'mlp'))
  x = jax.random.normal(jax.random.key(0), (8, 8, cfg.emb_dim))
  # `Dense.init` is its initializer field; Module.init is the method.
  variables = nn.Module.init(dense, jax.random.key(1), x)
  params = nn.meta.unbox(variables['params'])
  packed = {'kernel': ops.pack(params['kernel'], dtype)}
  apply = jax.jit(lambda v, x: dense.apply(v, x))
  variables = {'params': params, network.PACKED: packed}
  full = np.asarray(apply(variables, x))  # K = 64
  for b, t in ((1, 1), (1, 2), (4, 1), (4, 4), (8, 2), (8, 4)):
    np.testing.assert_array_equal(apply(variables, x[:b, :t]), full[:b, :t])
  canonical = np.asarray(apply({'params': params}, x))
  np.testing.assert_allclose(
    full,
    canonical,
    rtol=1e-5 if dtype == jnp.float32 else 2e-2,
    atol=1e-5 if dtype == jnp.float32 else 2e-2,
  )


@needs_kernel
@pytest.mark.parametrize('gamma', [1, 3, 7])
def test_scoring_one_or_gamma_plus_one_tokens_agree(target, gamma):
  """Plain decoding scores T=1, verification T=gamma+1: same logits.

  The packed dense layers are bitwise row-independent (test above); XLA's
  norms and attention einsums are only equal to float32 rounding across
  shapes, hence the tolerance.
  """
  b, prefix = 4, 5
  enc = jnp.asarray(encoder_batch(b, 7, 16, seed=2))
  rng = np.random.default_rng(gamma)
  toks = jnp.asarray(rng.integers(2, 16, (b, gamma + 1)).astype(np.int32))
  score = jax.jit(lambda m, s, x: m.score(s, x))
  state = target.init_state(enc, 32)
  _, state = score(target, state, jnp.zeros((b, prefix), jnp.int32))
  block, _ = score(target, state, toks)
  singles, s1 = [], state
  for i in range(gamma + 1):
    lg, s1 = score(target, s1, toks[:, i : i + 1])
    singles.append(lg)
  np.testing.assert_allclose(
    block, jnp.concatenate(singles, 1), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_array_equal(
    np.argmax(block, -1), np.argmax(jnp.concatenate(singles, 1), -1)
  )


@needs_kernel
def test_kernel_logits_match_canonical(target, canonical, inputs):
  dec = np.random.default_rng(4).integers(2, 16, (8, 5)).astype(np.int32)
  np.testing.assert_allclose(
    _block_logits(target, inputs, dec, prefix=3),
    _block_logits(canonical, inputs, dec, prefix=3),
    rtol=1e-5,
    atol=1e-5,
  )


# ---------------------------------------------------------------------------
# Decoding with the kernel on.


@pytest.fixture(scope='module')
def plain_greedy(target, inputs):
  return sd.generate(target, inputs, max_decode_len=MAX_LEN)


@needs_kernel
@pytest.mark.parametrize('gamma', [1, 3, 7])
def test_greedy_identity_kernel_on(
  target, near_draft, far_draft, inputs, plain_greedy, gamma
):
  assert target.packed is not None and near_draft.packed is not None
  assert (plain_greedy.lengths < MAX_LEN).sum() >= 2
  for draft in (near_draft, far_draft):
    out = sd.generate(
      target, inputs, draft=draft, gamma=gamma, max_decode_len=MAX_LEN
    )
    np.testing.assert_array_equal(out.tokens, plain_greedy.tokens)
    np.testing.assert_array_equal(out.lengths, plain_greedy.lengths)


@needs_kernel
def test_greedy_kernel_on_equals_kernel_off(canonical, inputs, plain_greedy):
  off = sd.generate(canonical, inputs, max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(off.tokens, plain_greedy.tokens)


@needs_kernel
@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_draft_equal_to_target_kernel_on(target, inputs, temperature):
  spec = sd.generate(
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
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  assert spec.stats.alpha == pytest.approx(1.0)


@needs_kernel
def test_greedy_identity_bfloat16_packing(target, inputs):
  """bf16-packed weights: a different model, still one path for both."""
  t16 = target.pack_for_cpu(jnp.bfloat16)
  d16 = perturbed(target, 0.1, seed=1).pack_for_cpu(jnp.bfloat16)
  assert t16.packed['decoder']['logits_dense']['kernel'].dtype == jnp.bfloat16
  plain = sd.generate(t16, inputs, max_decode_len=MAX_LEN)
  for gamma in (1, 3):
    out = sd.generate(
      t16, inputs, draft=d16, gamma=gamma, max_decode_len=MAX_LEN
    )
    np.testing.assert_array_equal(out.tokens, plain.tokens)


def _packed_dtypes(model: sd.Model) -> set:
  return {x.dtype for x in jax.tree.leaves(model.packed)}


@needs_kernel
def test_a_draft_proposes_with_bfloat16_packed_weights(
  target, near_draft, inputs
):
  """Default fp32 packing: drafts repack in bf16 (half the bytes a step
  reads), once per model, same parameters; decoding is unchanged."""
  draft = sd.Model(near_draft.config, near_draft.params)
  assert _packed_dtypes(draft) == {jnp.dtype(jnp.float32)}
  copy = draft.for_drafting()
  assert _packed_dtypes(copy) == {jnp.dtype(jnp.bfloat16)}
  # Its parameters: the packed weights rounded as packed (what a sharded
  # copy multiplies by), the rest the draft's own arrays.
  rounded = packing.rounded_for_drafting(draft.config, draft.params)
  for a, b, c in zip(
    jax.tree.leaves(copy.params),
    jax.tree.leaves(rounded),
    jax.tree.leaves(draft.params),
    strict=True,
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert a is c or a.dtype == c.dtype and not np.array_equal(a, c)
  np.testing.assert_array_equal(
    np.asarray(copy.packed['decoder']['logits_dense']['kernel'].data),
    np.asarray(
      draft.pack_for_cpu(jnp.bfloat16)
      .packed['decoder']['logits_dense']['kernel']
      .data
    ),
  )
  assert draft.for_drafting() is copy
  plain = sd.generate(target, inputs, max_decode_len=MAX_LEN)
  out = sd.generate(
    target, inputs, draft=draft, gamma=3, max_decode_len=MAX_LEN
  )
  np.testing.assert_array_equal(out.tokens, plain.tokens)

  # `generate` proposed with the copy: sampled, alpha (the mean of
  # sum min(p, q)) sees q's rounding.
  def alpha(d):
    return sd.generate(
      target,
      inputs,
      draft=d,
      gamma=3,
      max_decode_len=MAX_LEN,
      temperature=1.0,
      seed=4,
    ).stats.alpha

  # Negative control: the fp32 draft's q differs.
  assert alpha(draft) == alpha(copy) != alpha(draft.pack_for_cpu(jnp.float32))


@needs_kernel
def test_drafting_copy_is_the_model_itself_unless_packed_fp32_by_default(
  target,
):
  explicit = target.pack_for_cpu(jnp.float32)
  assert explicit.for_drafting() is explicit
  assert target.unpacked().for_drafting().packed is None
  b16 = target.pack_for_cpu(jnp.bfloat16)
  assert b16.for_drafting() is b16
  # Through jit's flatten/unflatten the flag is not kept: no repacking of
  # traced weights.
  leaves, tree = jax.tree.flatten(target)
  rebuilt = jax.tree.unflatten(tree, leaves)
  assert rebuilt.for_drafting() is rebuilt


@needs_kernel
def test_greedy_identity_tied_embeddings():
  m = sd.Model.init(
    tiny_config(logits_via_embedding=True, mlp_activations=('relu',)), seed=5
  )
  draft = perturbed(m, 0.1, seed=6)
  enc = encoder_batch(4, 7, 16, seed=5)
  plain = sd.generate(m, enc, max_decode_len=16)
  for gamma in (1, 3):
    out = sd.generate(m, enc, draft=draft, gamma=gamma, max_decode_len=16)
    np.testing.assert_array_equal(out.tokens, plain.tokens)


# ---------------------------------------------------------------------------
# Checkpoints keep the canonical layout.


def test_save_load_round_trip(tmp_path, target, inputs):
  target.save(str(tmp_path / 'ckpt'))
  written = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
  assert not any('packed' in f for f in written)
  loaded = sd.Model.load(str(tmp_path / 'ckpt'))
  jax.tree.map(np.testing.assert_array_equal, loaded.params, target.params)
  assert (loaded.packed is None) == (target.packed is None)
  a = sd.generate(target, inputs, max_decode_len=MAX_LEN)
  b = sd.generate(loaded, inputs, max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(a.tokens, b.tokens)


def test_with_params_repacks(target):
  params = jax.tree.map(np.array, target.params)
  params['decoder']['logits_dense']['kernel'] *= 2.0
  m = target.with_params(params)
  if m.packed is not None:
    np.testing.assert_array_equal(
      ops.unpack(m.packed['decoder']['logits_dense']['kernel']),
      params['decoder']['logits_dense']['kernel'],
    )

"""Parity with transformers' PyTorch T5 for models loaded from HF directories.

Small random `T5ForConditionalGeneration` models (one T5 v1.1: gated-gelu,
untied head; one original T5: relu, tied and scaled head) are saved with
`save_pretrained` and loaded with `Model.load`. Teacher-forced log-probs must
agree within 1e-4 (fp32), greedy decoding must give transformers' `generate`
tokens, and speculative greedy decoding with a different HF-loaded draft must
give the same tokens again.
"""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

import _vocab_util  # noqa: E402  (tests/ helper)

VOCAB = 192  # 60 sentencepiece pieces + 100 extra ids, rounded up.
MAX_LEN = 12


def _hf_model(
  seed,
  feed_forward_proj,
  tied,
  d_model=32,
  layers=2,
  dec_layers=None,
  heads=4,
  d_kv=8,
  d_ff=48,
):
  torch.manual_seed(seed)
  cfg = transformers.T5Config(
    vocab_size=VOCAB,
    d_model=d_model,
    d_kv=d_kv,
    d_ff=d_ff,
    num_layers=layers,
    num_decoder_layers=dec_layers,
    num_heads=heads,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=20,
    feed_forward_proj=feed_forward_proj,
    tie_word_embeddings=tied,
    dropout_rate=0.0,
    decoder_start_token_id=0,
    pad_token_id=0,
    eos_token_id=1,
  )
  model = transformers.T5ForConditionalGeneration(cfg)
  if not tied:  # transformers 5 always ties; untie as a v1.1 checkpoint is.
    model.lm_head.weight = torch.nn.Parameter(
      torch.randn(VOCAB, d_model) * d_model**-0.5
    )
  with torch.no_grad():
    # Rescale HF's init so greedy outputs vary and some rows end with EOS:
    # equal-norm embedding rows (tied heads otherwise favour a few big
    # rows), stronger layers, a boosted EOS row, norms away from 1.
    if tied:
      w = model.shared.weight
      w.copy_(w / w.norm(dim=1, keepdim=True) * d_model**0.5)
    for name, p in model.named_parameters():
      if 'layer_norm' in name:
        p.mul_(1.0 + 0.2 * torch.randn_like(p))
      elif not any(k in name for k in ('shared', 'lm_head', 'relative')):
        p.mul_(6.0 if tied else 3.0)
    head = model.shared if tied else model.lm_head
    head.weight[sd.EOS_ID].mul_(1.2 if tied else 2.0)
  return model.eval()


def _save(model, directory, spiece_model=None):
  model.save_pretrained(directory)
  if spiece_model:
    shutil.copy(spiece_model, directory / 'spiece.model')
  return directory


@pytest.fixture(scope='module')
def spiece(tmp_path_factory):
  return _vocab_util.train(tmp_path_factory.mktemp('spm'))


@pytest.fixture(scope='module', params=['v1_1', 'original'])
def pair(request, tmp_path_factory, spiece):
  """(HF torch model, our Model loaded from its save_pretrained dir)."""
  if request.param == 'v1_1':
    hf = _hf_model(0, 'gated-gelu', tied=False, dec_layers=3)
  else:
    hf = _hf_model(1, 'relu', tied=True)
  d = _save(hf, tmp_path_factory.mktemp(request.param), spiece)
  return hf, sd.Model.load(str(d))


def _inputs(seed=0, batch=3, length=9):
  rng = np.random.default_rng(seed)
  enc = rng.integers(3, 60, (batch, length)).astype(np.int32)
  enc[1, 6:] = 0  # padding
  enc[2, 4:] = 0
  dec = rng.integers(3, VOCAB, (batch, 7)).astype(np.int32)
  return enc, dec


def _hf_log_probs(hf, enc, dec):
  with torch.no_grad():
    out = hf(
      input_ids=torch.from_numpy(enc).long(),
      attention_mask=torch.from_numpy(enc != 0).long(),
      labels=torch.from_numpy(dec).long(),
    )
    logp = torch.log_softmax(out.logits.float(), -1)
    return torch.gather(logp, -1, torch.from_numpy(dec).long()[..., None])[
      ..., 0
    ].numpy()


def _hf_greedy(hf, enc, max_len=MAX_LEN):
  with torch.no_grad():
    out = hf.generate(
      input_ids=torch.from_numpy(enc).long(),
      attention_mask=torch.from_numpy(enc != 0).long(),
      max_new_tokens=max_len,
      do_sample=False,
      num_beams=1,
      decoder_start_token_id=0,
      eos_token_id=1,
      pad_token_id=0,
      use_cache=False,
    ).numpy()  # HF caches break when decoder depth differs.
  tokens = np.zeros((enc.shape[0], max_len), np.int32)
  tokens[:, : out.shape[1] - 1] = out[:, 1:]
  return tokens


def _greedy_loop(model, enc, max_len=MAX_LEN):
  """Plain greedy decoding by re-scoring the whole prefix (reference).

  The decoder input keeps one shape (causal attention ignores the zeros
  after position t), so it compiles once.
  """
  dec = np.zeros((enc.shape[0], max_len + 1), np.int32)
  done = np.zeros(enc.shape[0], bool)
  for t in range(max_len):
    logits = np.asarray(model.logits(enc, dec[:, :-1]))
    nxt = np.where(done, 0, logits[:, t].argmax(-1))
    dec[:, t + 1] = nxt
    done |= nxt == sd.EOS_ID
  return dec[:, 1:]


def _generate(model, enc, draft=None, max_len=MAX_LEN):
  out = sd.generate(
    model,
    enc,
    draft=draft,
    gamma=3,
    temperature=0.0,
    max_decode_len=max_len,
    seed=0,
  )
  return np.asarray(out.tokens)


def test_config_and_vocabulary_mapped(pair):
  hf, model = pair
  c = model.config
  assert c.emb_dim == hf.config.d_model
  assert c.num_decoder_layers == hf.config.num_decoder_layers
  assert c.relative_attention_num_buckets == 8
  assert c.relative_attention_max_distance == 20
  if hf.config.feed_forward_proj == 'gated-gelu':
    assert c.mlp_activations == ('gelu', 'linear')
    assert not c.logits_via_embedding
  else:
    assert c.mlp_activations == ('relu',)
    assert c.logits_via_embedding
    assert 'logits_dense' not in model.params['decoder']
  assert model.vocabulary is not None
  assert model.vocabulary.vocab_size == 160


def test_teacher_forced_log_probs_match(pair):
  hf, model = pair
  enc, dec = _inputs()
  ours = np.asarray(model.log_probs(enc, dec))
  np.testing.assert_allclose(
    ours, _hf_log_probs(hf, enc, dec), atol=1e-4, rtol=0
  )


def test_greedy_matches_hf_generate(pair):
  hf, model = pair
  enc, _ = _inputs(seed=1)
  want = _hf_greedy(hf, enc)
  np.testing.assert_array_equal(_greedy_loop(model, enc), want)
  np.testing.assert_array_equal(_generate(model, enc), want)


def test_speculative_greedy_with_hf_draft_matches(pair, tmp_path, spiece):
  hf, model = pair
  draft_hf = _hf_model(
    7,
    hf.config.feed_forward_proj,
    tied=model.config.logits_via_embedding,
    d_model=16,
    layers=1,
    heads=2,
    d_ff=24,
  )
  draft = sd.Model.load(str(_save(draft_hf, tmp_path / 'draft', spiece)))
  assert draft.vocabulary == model.vocabulary
  enc, _ = _inputs(seed=2)
  want = _hf_greedy(hf, enc)
  np.testing.assert_array_equal(_generate(model, enc, draft=draft), want)


def test_bfloat16_load_is_the_rounded_fp32_load(pair, tmp_path):
  hf, model = pair
  d = _save(hf, tmp_path / 'm')
  model16 = sd.Model.load(str(d), dtype='bfloat16')
  assert model16.config.param_dtype == np.dtype(jnp.bfloat16)
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(
      np.asarray(a), np.asarray(b.astype(jnp.bfloat16))
    ),
    model16.params,
    model.params,
  )


def test_pytorch_model_bin_loads_the_same_weights(pair, tmp_path):
  """`pytorch_model.bin` (all of `state_dict`, tied copies included)."""
  hf, model = pair
  hf.config.save_pretrained(tmp_path)
  torch.save(hf.state_dict(), tmp_path / 'pytorch_model.bin')
  loaded = sd.Model.load(str(tmp_path))
  assert loaded.config == model.config
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
    loaded.params,
    model.params,
  )


def test_legacy_torch_bin_without_zipfile(pair, tmp_path):
  """Pre-1.6 torch files cannot be memory-mapped; they still load."""
  hf, model = pair
  hf.config.save_pretrained(tmp_path)
  torch.save(
    hf.state_dict(),
    tmp_path / 'pytorch_model.bin',
    _use_new_zipfile_serialization=False,
  )
  loaded = sd.Model.load(str(tmp_path))
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
    loaded.params,
    model.params,
  )

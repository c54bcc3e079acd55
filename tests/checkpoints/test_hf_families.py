"""Every HF T5 family against transformers' own classes (issue 29).

Tiny random models of each family are built with transformers' classes and
written with `save_pretrained`: mT5 as transformers 5 saves it (tied, no
`lm_head.weight`, no `scale_decoder_outputs`: transformers 5 never scales
mT5), mT5 with a hub-style config (`tie_word_embeddings: false`, its own
`lm_head.weight`), UMT5 (a relative position table per layer; scaled tied
head and hub-style untied head), ByT5-sized T5 (384 rows) and LongT5 with
local and transient-global encoder attention (inputs longer than several
local blocks and global blocks, with padding). `Model.load` must give
teacher-forced log-probs within 1e-4 of transformers' (float32), greedy
tokens equal to transformers' `generate`, and speculative greedy tokens
(a random draft) equal to them again.
"""

import json

import numpy as np
import pytest

import spec_decode as sd

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

MAX_LEN = 10
_COMMON = dict(
  d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2,
  num_heads=4, relative_attention_num_buckets=8,
  relative_attention_max_distance=20, dropout_rate=0.0,
  decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
)  # fmt: skip
_LONG = dict(local_radius=3, global_block_size=4)

# name: (config class, model class, config fields, untied head, hub config)
FAMILIES = {
  'mt5_transformers5': ('MT5Config', 'MT5ForConditionalGeneration',
                        dict(vocab_size=256), False, {}),
  'mt5_hub_config': ('MT5Config', 'MT5ForConditionalGeneration',
                     dict(vocab_size=256), True,
                     {'tie_word_embeddings': False}),
  'umt5_tied_scaled': ('UMT5Config', 'UMT5ForConditionalGeneration',
                       dict(vocab_size=256), False, {}),
  'umt5_hub_config': ('UMT5Config', 'UMT5ForConditionalGeneration',
                      dict(vocab_size=256, tie_word_embeddings=False), True,
                      {'tie_word_embeddings': False}),
  'byt5_sized': ('T5Config', 'T5ForConditionalGeneration',
                 dict(vocab_size=384, feed_forward_proj='gated-gelu',
                      tie_word_embeddings=False), True, {}),
  'longt5_local': ('LongT5Config', 'LongT5ForConditionalGeneration',
                   dict(vocab_size=256, encoder_attention_type='local',
                        **_LONG), False, {}),
  'longt5_tglobal': ('LongT5Config', 'LongT5ForConditionalGeneration',
                     dict(vocab_size=256,
                          encoder_attention_type='transient-global',
                          feed_forward_proj='gated-gelu', **_LONG),
                     False, {}),
}  # fmt: skip


def _build(name, seed=0):
  cfg_cls, model_cls, fields, untied, _ = FAMILIES[name]
  torch.manual_seed(seed)
  cfg = getattr(transformers, cfg_cls)(**_COMMON, **fields)
  model = getattr(transformers, model_cls)(cfg)
  d_model, vocab = cfg.d_model, cfg.vocab_size
  if untied:
    model.lm_head.weight = torch.nn.Parameter(
      torch.randn(vocab, d_model) * d_model**-0.5
    )
  with torch.no_grad():  # Varied greedy outputs, some rows ending in EOS.
    w = model.shared.weight
    w.copy_(w / w.norm(dim=1, keepdim=True) * d_model**0.5)
    for n, p in model.named_parameters():
      if 'layer_norm' in n:
        p.mul_(1.0 + 0.2 * torch.randn_like(p))
      elif not any(k in n for k in ('shared', 'lm_head', 'relative')):
        p.mul_(4.0)
      elif 'relative' in n:
        p.mul_(8.0)
    (model.lm_head if untied else model.shared).weight[sd.EOS_ID].mul_(1.3)
  return model.eval()


@pytest.fixture(scope='module', params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
  name = request.param
  hf = _build(name)
  d = tmp_path_factory.mktemp(name)
  hf.save_pretrained(d)
  hub = FAMILIES[name][4]
  if hub:  # Rewrite config.json as the hub's files have it.
    cfg = json.loads((d / 'config.json').read_text())
    cfg.pop('scale_decoder_outputs', None)
    cfg.update(hub)
    (d / 'config.json').write_text(json.dumps(cfg))
  return name, hf, sd.Model.load(str(d))


def _inputs(vocab, seed=0, batch=3, length=19):
  rng = np.random.default_rng(seed)
  enc = rng.integers(3, vocab, (batch, length)).astype(np.int32)
  enc[:, -1] = 1
  enc[1, 13:] = 0  # padding (a partial global block)
  enc[2, 3:] = 0  # shorter than one global block
  enc[2, 2] = 1
  dec = rng.integers(3, vocab, (batch, 7)).astype(np.int32)
  dec[:, 0] = 0
  return enc, dec


def _hf_log_probs(hf, enc, dec):
  with torch.no_grad():
    logits = hf(
      input_ids=torch.from_numpy(enc).long(),
      attention_mask=torch.from_numpy(enc != 0).long(),
      decoder_input_ids=torch.from_numpy(dec).long(),
    ).logits.float()
  logp = torch.log_softmax(logits, -1)[:, :-1]
  target = torch.from_numpy(dec[:, 1:]).long()[..., None]
  return torch.gather(logp, -1, target)[..., 0].numpy()


def _hf_greedy(hf, enc):
  with torch.no_grad():
    out = hf.generate(
      input_ids=torch.from_numpy(enc).long(),
      attention_mask=torch.from_numpy(enc != 0).long(),
      max_new_tokens=MAX_LEN,
      do_sample=False,
      num_beams=1,
      decoder_start_token_id=0,
      eos_token_id=1,
      pad_token_id=0,
    ).numpy()
  tokens = np.zeros((enc.shape[0], MAX_LEN), np.int32)
  tokens[:, : out.shape[1] - 1] = out[:, 1:]
  return tokens


def test_config_mapped(pair):
  name, hf, model = pair
  c = model.config
  assert c.per_layer_relpos_bias == name.startswith('umt5')
  attention = {'longt5_local': 'local', 'longt5_tglobal': 'transient-global'}
  assert c.encoder_attention == attention.get(name, 'full')
  scaled = name in ('umt5_tied_scaled', 'longt5_local', 'longt5_tglobal')
  assert c.logits_via_embedding == scaled
  assert c.vocab_size == hf.config.vocab_size


def test_teacher_forced_log_probs_match(pair):
  _, hf, model = pair
  enc, dec = _inputs(model.config.vocab_size)
  # Our log_probs(enc, dec) scores dec[:, t] given dec[:, :t] after BOS.
  ours = np.asarray(model.log_probs(enc, dec[:, 1:]))
  want = _hf_log_probs(hf, enc, dec)
  np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)


def test_greedy_and_speculative_greedy_match_generate(pair):
  _, hf, model = pair
  enc, _ = _inputs(model.config.vocab_size, seed=1)
  want = _hf_greedy(hf, enc)
  plain = sd.generate(model, enc, temperature=0.0, max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(np.asarray(plain.tokens), want)
  draft = sd.Model.init(
    sd.T5Config(
      vocab_size=model.config.vocab_size,
      emb_dim=16,
      num_heads=2,
      head_dim=8,
      mlp_dim=16,
      num_encoder_layers=1,
      num_decoder_layers=1,
      dropout_rate=0.0,
    ),  # fmt: skip
    seed=5,
  )
  spec = sd.generate(
    model, enc, draft=draft, gamma=3, temperature=0.0, max_decode_len=MAX_LEN
  )
  np.testing.assert_array_equal(np.asarray(spec.tokens), want)

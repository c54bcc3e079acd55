"""Tiny random T5Gemma and T5Gemma 2 models saved by transformers' own
classes, for tests that compare against transformers.

The configs are small but keep what differs from T5 biting: a sliding
window (4) shorter than the inputs, grouped-query attention (4 query heads
on 2 key/value heads), attention and final soft-caps small enough that
tanh bends the scores (2.0 and 1.0), untrained (non-zero) RMSNorm scales,
and T5Gemma 2's separate local and global RoPE bases.
"""

import os

import numpy as np

V = 128
WINDOW = 4
# Large kernels against small embeddings: with the embedding dominating the
# residual stream a random model copies its input token (tied head), and
# greedy outputs repeat one token; at these scales they vary.
KERNEL_STD = 1.0
EMBED_STD = 0.06
FINAL_SOFTCAP = 1.0  # The logits reach about 1.2 uncapped.
# Ragged encoder rows: 12 tokens, 7 tokens then padding, 3 then padding.
ENCODER = np.array(
  [
    [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
    [20, 21, 22, 23, 24, 25, 26, 0, 0, 0, 0, 0],
    [30, 31, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0],
  ],
  np.int32,
)


def _stack(layers: int, hidden: int = 32, vocab_size: int = V):
  types = ['sliding_attention', 'full_attention'] * layers
  return dict(
    vocab_size=vocab_size,
    hidden_size=hidden,
    intermediate_size=48,
    num_hidden_layers=layers,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    sliding_window=WINDOW,
    query_pre_attn_scalar=8,
    final_logit_softcapping=FINAL_SOFTCAP,
    layer_types=types[:layers],
  )


def tiny_config(version: int, layers: int, vocab_size: int = V,
                window: int = WINDOW, ring_margin: int = 4):  # fmt: skip
  """A `T5GemmaConfig` built directly (no transformers): `layers` encoder
  and decoder layers alternating sliding and global, GQA (4 on 2), both
  soft-caps (version 1; version 2 has no attention-logit cap) and separate
  local and global RoPE bases."""
  from spec_decode.t5gemma import config as config_lib  # pylint: disable=g-import-not-at-top

  types = (config_lib.SLIDING, config_lib.GLOBAL) * layers
  stack = config_lib.StackConfig(
    num_layers=layers,
    emb_dim=16,
    mlp_dim=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    layer_types=types[:layers],
    sliding_window=window,
    rope_local=config_lib.Rope(10.0),
    rope_global=config_lib.Rope(1000.0),
    query_pre_attn_scalar=8,
    attn_logit_softcap=2.0 if version == 1 else None,
  )
  return config_lib.T5GemmaConfig(
    version=version,
    vocab_size=vocab_size,
    encoder=stack,
    decoder=stack,
    final_logit_softcap=3.0,
    ring_margin=ring_margin,
  )


def hf_model(version: int, encoder_layers: int = 3, decoder_layers: int = 3,
             seed: int = 0, hidden: int = 32, vocab_size: int = V):  # fmt: skip
  """A transformers model with every weight drawn at random (eager
  attention: the path that has soft-capping)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(seed)
  enc = _stack(encoder_layers, hidden, vocab_size)
  dec = _stack(decoder_layers, hidden, vocab_size)
  if version == 1:
    enc['attn_logit_softcapping'] = dec['attn_logit_softcapping'] = 2.0
    config = transformers.T5GemmaConfig(
      encoder=enc, decoder=dec, vocab_size=vocab_size
    )
    cls = transformers.T5GemmaForConditionalGeneration
  else:
    rope = {
      'full_attention': {'rope_type': 'default', 'rope_theta': 1000.0},
      'sliding_attention': {'rope_type': 'default', 'rope_theta': 10.0},
    }
    enc['rope_parameters'] = dec['rope_parameters'] = rope
    vision = dict(
      hidden_size=16,
      intermediate_size=16,
      num_hidden_layers=1,
      num_attention_heads=2,
      image_size=28,
      patch_size=14,
    )
    config = transformers.T5Gemma2Config(
      encoder=dict(
        text_config=enc, vision_config=vision, mm_tokens_per_image=4
      ),
      decoder=dec,
    )
    cls = transformers.T5Gemma2ForConditionalGeneration
  config._attn_implementation = 'eager'  # pylint: disable=protected-access
  model = cls(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      scale = KERNEL_STD
      if 'norm' in name or 'eoi' in name:
        scale = 0.3
      elif 'embed' in name:
        scale = EMBED_STD
      p.copy_(torch.randn_like(p) * scale)
  return model


def gemma_tokenizer(path, tmp_path, lines: int, vocab_size: int,
                    texts=None) -> None:  # fmt: skip
  """Writes `path`/tokenizer.model: a sentencepiece model with Gemma's
  special ids (pad 0, eos 1, bos 2, unk 3), trained on `texts` (default:
  `lines` made-up lines) under `tmp_path`."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  if texts is None:
    texts = [f'w{i} x{i * 7} y{i * 13}' for i in range(lines)]
  text = tmp_path / 'corpus.txt'
  text.write_text('\n'.join(texts))
  spm.SentencePieceTrainer.train(
    input=str(text),
    model_prefix=str(tmp_path / 'gemma'),
    vocab_size=vocab_size,
    pad_id=0,
    eos_id=1,
    bos_id=2,
    unk_id=3,
    minloglevel=2,
    hard_vocab_limit=False,
  )
  os.replace(tmp_path / 'gemma.model', os.path.join(path, 'tokenizer.model'))


def save(model, directory, **kwargs) -> str:
  """`save_pretrained` into `directory`; returns it."""
  directory = os.fspath(directory)
  model.save_pretrained(directory, **kwargs)
  return directory


def hf_logits(model, encoder, decoder_inputs, dtype=None) -> np.ndarray:
  """transformers' teacher-forced logits, in `dtype` (default: float32)."""
  import copy  # pylint: disable=g-import-not-at-top

  import torch  # pylint: disable=g-import-not-at-top

  if dtype is not None:
    model = copy.deepcopy(model).to(dtype)
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(encoder, dtype=torch.long),
      attention_mask=torch.tensor(encoder != 0, dtype=torch.long),
      decoder_input_ids=torch.tensor(decoder_inputs, dtype=torch.long),
    )
  return out.logits.double().numpy()


def hf_greedy(model, encoder, max_new_tokens: int) -> np.ndarray:
  """transformers' greedy `generate`, `[B, max_new_tokens]` without the
  start token (pad 0 after EOS, as ours)."""
  import torch  # pylint: disable=g-import-not-at-top

  with torch.no_grad():
    out = model.generate(
      input_ids=torch.tensor(encoder, dtype=torch.long),
      attention_mask=torch.tensor(encoder != 0, dtype=torch.long),
      max_new_tokens=max_new_tokens,
      min_new_tokens=0,
      do_sample=False,
      num_beams=1,
    ).numpy()
  assert (out[:, 0] == 2).all(), out[:, 0]  # BOS starts the decoder.
  out = out[:, 1:]
  full = np.zeros((out.shape[0], max_new_tokens), np.int32)
  full[:, : out.shape[1]] = out
  return full


def hf_reference64(model, encoder, decoder_inputs) -> np.ndarray:
  """transformers' float64 logits, one row at a time without its padding.

  A padded row whose padding runs past the window leaves encoder queries
  with every key masked, which transformers' float64 run turns into NaN
  (and spreads through cross-attention); without padding the row is the
  same function of its tokens, computed in float64 (RoPE angles are float32
  in transformers whatever the dtype, as in both float32 runs).
  """
  import torch  # pylint: disable=g-import-not-at-top

  rows = []
  for enc, dec in zip(encoder, decoder_inputs, strict=True):
    enc = enc[enc != 0][None]
    rows.append(hf_logits(model, enc, dec[None], torch.float64)[0])
  return np.stack(rows)

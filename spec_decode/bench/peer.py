"""Peer benchmark: our decoding against Hugging Face transformers (PyTorch).

Same weights and inputs on both sides: our target and draft are exported as
Hugging Face T5 directories and loaded with `T5ForConditionalGeneration`.
Random weights make a random draft useless, so the pair is built to agree:
the target's decoder layers write small residuals (their output kernels are
scaled down) and the draft is the target's encoder, embeddings, final norm,
logits and first decoder layers. Both implementations then see the same
acceptance rate; each speedup is over that implementation's own greedy
decoding. Transformers' assisted generation is batch 1 only.
"""

import inspect
import tempfile
from typing import Any

import jax
import numpy as np

import spec_decode as sd
from spec_decode.checkpoints import huggingface
from spec_decode.policy import timing

_RESIDUAL_SCALE = 0.1
_LOGIT_SCALE = 3.0


def suppress_eos(model: sd.Model) -> sd.Model:
  """Makes EOS never the argmax, so greedy decodes run to full length.

  T5 has no logit bias; an EOS column equal to half of another token's
  column gives an EOS logit of half that token's, below the maximum logit
  whenever the maximum is positive (always, over tens of thousands of random
  logits). Both frameworks then decode the same full-length sequences.
  """
  params = jax.tree.map(np.array, model.params)
  kernel = params['decoder']['logits_dense']['kernel']
  kernel[:, sd.EOS_ID] = 0.5 * kernel[:, sd.UNK_ID]
  return model.with_params(params)


def agreeable_pair(
  cfg: sd.T5Config,
  draft_layers: int,
  residual_scale: float = _RESIDUAL_SCALE,
  seed: int = 0,
) -> tuple[sd.Model, sd.Model]:
  """A random target and a truncated copy of it that agrees often.

  The more decoder layers the target has beyond the draft's, the smaller
  `residual_scale` must be for the same acceptance rate.
  """
  target = sd.Model.init(cfg, seed=seed)
  params = jax.tree.map(np.array, target.params)
  dec = params['decoder']
  for i in range(cfg.num_decoder_layers):
    layer = dec[f'layers_{i}']
    for attn in ('self_attention', 'encoder_decoder_attention'):
      layer[attn]['out']['kernel'] *= residual_scale
    layer['mlp']['wo']['kernel'] *= residual_scale
  dec['logits_dense']['kernel'] *= _LOGIT_SCALE
  target = suppress_eos(target.with_params(params))
  params = target.params
  draft_params = {
    'token_embedder': params['token_embedder'],
    'encoder': params['encoder'],
    'decoder': {
      k: v
      for k, v in dec.items()
      if not k.startswith('layers_') or int(k.split('_')[1]) < draft_layers
    },
  }
  draft = sd.Model(
    cfg.replace(num_decoder_layers=draft_layers), None
  ).with_params(draft_params)
  return target, draft


def run(
  cfg: sd.T5Config,
  draft_layers: int,
  gamma: int,
  max_len: int,
  repeats: int,
  residual_scale: float = _RESIDUAL_SCALE,
) -> dict[str, Any]:
  """Tokens/s of greedy and speculative decoding, ours and transformers'."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    return {'skipped': f'transformers/torch not installed ({e})'}
  target, draft = agreeable_pair(cfg, draft_layers, residual_scale)
  draft = draft.for_drafting()  # what `generate` proposes with
  steps = [timing.step_times(m, [1], repeats)[1] for m in (target, draft)]
  rng = np.random.default_rng(0)
  inputs = rng.integers(3, 1000, (1, 24)).astype(np.int32)

  ours_plain = sd.generate(target, inputs, max_decode_len=max_len)
  ours_spec = sd.generate(
    target, inputs, draft=draft, gamma=gamma, max_decode_len=max_len
  )
  t_plain = timing.median_time(
    lambda: sd.generate(target, inputs, max_decode_len=max_len), repeats
  )
  t_spec = timing.median_time(
    lambda: sd.generate(
      target, inputs, draft=draft, gamma=gamma, max_decode_len=max_len
    ),
    repeats,
  )

  torch.set_num_threads(max(1, torch.get_num_threads()))
  with tempfile.TemporaryDirectory() as tmp:
    huggingface.save_safetensors(target, f'{tmp}/target')
    huggingface.save_safetensors(draft, f'{tmp}/draft')
    hf_target = transformers.T5ForConditionalGeneration.from_pretrained(
      f'{tmp}/target'
    ).eval()
    hf_draft = transformers.T5ForConditionalGeneration.from_pretrained(
      f'{tmp}/draft'
    ).eval()
  ids = torch.tensor(inputs, dtype=torch.long)
  mask = torch.ones_like(ids)
  # Resuming an encoder-decoder from its cache needs the decoder inputs and
  # their mask passed explicitly, or the assistant's guesses are discarded.
  common = dict(
    input_ids=ids,
    attention_mask=mask,
    decoder_input_ids=torch.zeros((1, 1), dtype=torch.long),
    decoder_attention_mask=torch.ones((1, 1), dtype=torch.long),
    max_new_tokens=max_len,
    min_new_tokens=max_len,
    do_sample=False,
    num_beams=1,
  )

  def fresh_cache():
    # transformers sizes a cache built from a T5 config by its encoder depth
    # (`num_hidden_layers` maps to `num_layers`), which breaks a decoder
    # deeper than the encoder; lazily grown caches have no such limit.
    return transformers.EncoderDecoderCache(
      transformers.DynamicCache(), transformers.DynamicCache()
    )

  # transformers 5.24 renamed generate's `past_key_values` to `cache` (the
  # old name still works, with a deprecation warning): pass the name this
  # version's generation code takes.
  takes_cache = (
    'cache'
    in inspect.signature(hf_target.prepare_inputs_for_generation).parameters
  )
  cache_arg = 'cache' if takes_cache else 'past_key_values'

  def hf_plain():
    with torch.no_grad():
      return hf_target.generate(**common, **{cache_arg: fresh_cache()})

  def hf_assisted():
    with torch.no_grad():
      return hf_target.generate(
        **common,
        **{cache_arg: fresh_cache()},
        assistant_model=hf_draft,
        num_assistant_tokens=gamma,
        num_assistant_tokens_schedule='constant',
      )

  hf_greedy = hf_plain().numpy()[0, 1:]
  hf_assist = hf_assisted().numpy()[0, 1:]
  th_plain = timing.median_time(hf_plain, repeats)
  th_assist = timing.median_time(hf_assisted, repeats)
  ours_tps = max_len / t_spec
  hf_tps = max_len / th_assist
  return dict(
    gamma=gamma,
    max_decode_len=max_len,
    draft_layers=draft_layers,
    target_decoder_layers=cfg.num_decoder_layers,
    residual_scale=residual_scale,
    c=steps[1] / steps[0],
    alpha=ours_spec.stats.alpha,
    same_tokens_as_hf=bool((ours_plain.tokens[0] == hf_greedy).all()),
    hf_assisted_equals_hf_greedy=bool((hf_assist == hf_greedy).all()),
    ours_plain_tokens_per_s=max_len / t_plain,
    ours_tokens_per_s=ours_tps,
    hf_plain_tokens_per_s=max_len / th_plain,
    hf_tokens_per_s=hf_tps,
    ratio=ours_tps / hf_tps,
    ours_speedup=t_plain / t_spec,
    hf_speedup=th_plain / th_assist,
    torch_threads=torch.get_num_threads(),
    transformers=transformers.__version__,
  )

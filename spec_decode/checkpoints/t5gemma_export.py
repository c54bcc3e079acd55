"""A T5Gemma or T5Gemma 2 checkpoint -> a Hugging Face directory.

`spec-decode convert --to_format huggingface` writes what transformers'
`T5GemmaForConditionalGeneration` / `T5Gemma2ForConditionalGeneration
.from_pretrained` read: `config.json`, the weights as safetensors (one
file, or shards of at most `max_shard_bytes` with
`model.safetensors.index.json`) under the names transformers saves
(`t5gemma_hf.name_map`, kernels transposed back to `[out, in]`), and the
Gemma vocabulary as `tokenizer.model`.

`config.json` is the source's own when the checkpoint came from a Hugging
Face directory (`spec-decode convert` keeps it beside our files as
`hf_config.json`), with every field spec_decode models rewritten from the
`T5GemmaConfig`: so fields it does not model (T5Gemma 2's `vision_config`,
`max_position_embeddings`, an instruction-tuned model's second EOS id)
survive the round trip. Without it, transformers' defaults fill them.

T5Gemma 2's vision tower is not carried (text only): transformers
initializes it at random on load (its warning names those weights); text
inputs do not touch it.
"""

import copy
import json
import os
import re
from typing import Any

import flax.traverse_util
import numpy as np

from spec_decode.checkpoints import huggingface
from spec_decode.checkpoints import t5gemma_hf
from spec_decode.t5gemma.config import SLIDING
from spec_decode.t5gemma.config import Rope
from spec_decode.t5gemma.config import StackConfig
from spec_decode.t5gemma.config import T5GemmaConfig

HF_CONFIG_FILE = 'hf_config.json'
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' default "5GB".
_ARCHITECTURES = {
  1: 'T5GemmaForConditionalGeneration',
  2: 'T5Gemma2ForConditionalGeneration',
}
_MODEL_TYPE = {v: k for k, v in t5gemma_hf.MODEL_TYPES.items()}
# transformers' T5Gemma2Config defaults of the token indices.
_IMAGE_TOKEN_INDEX = 256_001
_EOI_TOKEN_INDEX = 256_000
_SIZE = re.compile(r'\s*(\d+(?:\.\d+)?)\s*([KMG]?B)?\s*\Z', re.IGNORECASE)
_UNITS = {None: 1, 'B': 1, 'KB': 10**3, 'MB': 10**6, 'GB': 10**9}


def parse_size(text: str) -> int:
  """`'5GB'`, `'100MB'`, `'4096'` -> bytes (transformers' decimal units)."""
  m = _SIZE.match(str(text))
  if not m:
    raise ValueError(f'not a size: {text!r} (e.g. 5GB, 200MB)')
  unit = m.group(2).upper() if m.group(2) else None
  size = int(float(m.group(1)) * _UNITS[unit])
  if size < 1:
    raise ValueError(f'a shard size must be >= 1 byte, got {text!r}')
  return size


def _rope(rope: Rope) -> dict[str, Any]:
  if rope.factor == 1.0:
    return {'rope_type': 'default', 'rope_theta': rope.theta}
  return {
    'rope_type': 'linear',
    'rope_theta': rope.theta,
    'factor': rope.factor,
  }


def _int_if_whole(x: float) -> int | float:
  return int(x) if float(x).is_integer() else x


def _stack(config: T5GemmaConfig, stack: StackConfig) -> dict[str, Any]:
  """The fields of one transformers stack config that spec_decode models."""
  if config.version == 1:
    if stack.rope_local != stack.rope_global:
      raise ValueError(
        'T5Gemma (version 1) has one RoPE for both layer types; this config '
        f'has {stack.rope_local} (sliding) and {stack.rope_global} (global)'
      )
    rope = _rope(stack.rope_global)
  else:
    rope = {
      'full_attention': _rope(stack.rope_global),
      'sliding_attention': _rope(stack.rope_local),
    }
  return {
    'vocab_size': config.vocab_size,
    'hidden_size': stack.emb_dim,
    'intermediate_size': stack.mlp_dim,
    'num_hidden_layers': stack.num_layers,
    'num_attention_heads': stack.num_heads,
    'num_key_value_heads': stack.num_kv_heads,
    'head_dim': stack.head_dim,
    'hidden_activation': 'gelu_pytorch_tanh',
    'rms_norm_eps': stack.rms_eps,
    # An int in transformers' (strictly typed) config when it is one.
    'query_pre_attn_scalar': _int_if_whole(stack.query_pre_attn_scalar),
    'sliding_window': stack.sliding_window,
    'layer_types': [
      'sliding_attention' if t == SLIDING else 'full_attention'
      for t in stack.layer_types
    ],
    'attn_logit_softcapping': stack.attn_logit_softcap,
    'final_logit_softcapping': config.final_logit_softcap,
    'rope_parameters': rope,
    'attention_bias': False,
    'pad_token_id': 0,
    'bos_token_id': 2,
    'tie_word_embeddings': config.tie_head,
  }


def config_to_hf(
  config: T5GemmaConfig, base: dict[str, Any] | None = None
) -> dict[str, Any]:
  """The `config.json` of `config`: `base` (a source's config.json) with the
  fields spec_decode models rewritten, or transformers' defaults for the
  others when `base` is None.

  Raises:
    ValueError: `base` is another model type, or `config` has what the
      transformers class cannot express (two RoPEs in version 1).
  """
  model_type = _MODEL_TYPE[config.version]
  out = copy.deepcopy(base) if base else {}
  if out.get('model_type', model_type) != model_type:
    raise ValueError(
      f'the kept {HF_CONFIG_FILE} is model_type {out["model_type"]!r}, the '
      f'checkpoint {model_type!r}'
    )
  out.update(
    model_type=model_type,
    architectures=[_ARCHITECTURES[config.version]],
    is_encoder_decoder=True,
    tie_word_embeddings=config.tie_head,
    vocab_size=config.vocab_size,
    pad_token_id=0,
    bos_token_id=2,
  )
  out.setdefault('eos_token_id', 1)
  encoder, decoder = (
    out.setdefault('encoder', {}),
    out.setdefault('decoder', {}),
  )
  if config.version == 2:
    encoder = encoder.setdefault('text_config', {})
    image = config.image_token_index
    eoi = config.eoi_token_index
    image = _IMAGE_TOKEN_INDEX if image is None else image
    eoi = _EOI_TOKEN_INDEX if eoi is None else eoi
    out.update(image_token_index=image, eoi_token_index=eoi)
    out['encoder'].update(image_token_index=image, eoi_token_index=eoi)
  encoder.update(_stack(config, config.encoder))
  decoder.update(_stack(config, config.decoder))
  for side in (encoder, decoder):
    side.setdefault('eos_token_id', out['eos_token_id'])
  return out


def tensors(config: T5GemmaConfig, params: Any) -> dict[str, np.ndarray]:
  """transformers' tensor name -> array (`[out, in]` kernels)."""
  names = t5gemma_hf.name_map(config, 'model.encoder')
  flat = flax.traverse_util.flatten_dict(params, sep='/')
  want = t5gemma_hf.expected_shapes(config)
  if set(flat) != set(want):
    missing, extra = (
      sorted(set(want) - set(flat)),
      sorted(set(flat) - set(want)),
    )
    raise ValueError(
      f'parameters disagree with the config: missing {missing[:5]}, '
      f'extra {extra[:5]}'
    )
  out = {}
  for ours, arr in flat.items():
    hf, transpose = names[ours]
    arr = np.asarray(arr)
    out[hf] = np.ascontiguousarray(arr.T if transpose else arr)
  return out


def write(
  path: str,
  config: T5GemmaConfig,
  params: Any,
  vocabulary: Any = None,
  base_config: dict[str, Any] | None = None,
  max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[str]:
  """Writes a new Hugging Face directory `path`; returns its files.

  Raises:
    FileExistsError: `path` exists and is not empty.
    ValueError: see `config_to_hf` and `tensors`.
  """
  path = os.path.abspath(os.fspath(path))
  if os.path.isdir(path) and os.listdir(path):
    raise FileExistsError(f'{path} exists and is not empty')
  hf_config = config_to_hf(config, base_config)
  hf_config['dtype'] = str(np.dtype(config.param_dtype))
  arrays = tensors(config, params)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
  files = ['config.json']
  files += huggingface.write_safetensors(path, arrays, max_shard_bytes)
  if isinstance(vocabulary, t5gemma_hf.GemmaVocabulary):
    with open(os.path.join(path, t5gemma_hf.TOKENIZER_FILE), 'wb') as f:
      f.write(vocabulary.serialized)
    files.append(t5gemma_hf.TOKENIZER_FILE)
  return files


def read_base_config(directory: str) -> dict[str, Any] | None:
  """The source's config.json kept beside our files, or None."""
  file = os.path.join(directory, HF_CONFIG_FILE)
  if not os.path.isfile(file):
    return None
  with open(file) as f:
    return json.load(f)

"""Hugging Face `config.json` <-> `T5Config`, and HF tensor names <-> ours.

Model types: `t5` (T5 1.0, 1.1, Flan-T5, ByT5), `mt5`, `umt5` (one relative
position table per layer: `per_layer_relpos_bias`) and `longt5` (local or
transient-global encoder attention: `encoder_attention`).

Name mapping (HF -> ours). HF `Linear` weights are `[out, in]`, so they are
transposed to our `[in, out]` kernels; HF keeps a relative position table
`[buckets, H]` in block 0's attention only (UMT5: in every block); ours is
`relpos_bias/rel_embedding [H, buckets]`:

  shared.weight                                -> token_embedder/embedding
  lm_head.weight (untied)                      -> decoder/logits_dense/kernel
  encoder.block.i.layer.0.SelfAttention.{q,k,v,o}
                                  -> encoder/layers_i/attention/{query,...}
        (LongT5: LocalSelfAttention or TransientGlobalSelfAttention, whose
        global_input_layer_norm -> encoder/layers_i/global_input_layer_norm
        and block 0's global_relative_attention_bias ->
        encoder/global_relpos_bias)
  encoder.block.i.layer.0.layer_norm           -> pre_attention_layer_norm
  encoder.block.i.layer.1.DenseReluDense.*     -> mlp/*
  decoder.block.i.layer.{0,1,2}  -> self_attention, encoder_decoder_attention,
                                    mlp (with their layer norms)
  {encoder,decoder}.final_layer_norm -> encoder_norm, decoder_norm

Output scaling (the decoder output times `d_model ** -0.5` before the head),
decided per model type, never by one flag's default:
  * `mt5`: never (mT5 is T5 1.1; transformers 5's MT5 writes
    `tie_word_embeddings: true` and no `scale_decoder_outputs`, and never
    scales);
  * `t5`, `umt5`, `longt5`: `scale_decoder_outputs` where the file has it
    (transformers 5 writes it), else `tie_word_embeddings` (default true), as
    the config classes derive it.
Whether the head is the shared embedding is decided by the stored weights
(`huggingface.load_hf_config`): an `lm_head.weight` that differs from
`shared.weight` is an untied head, whatever the config says.
"""

import json
import os
from typing import Any

from spec_decode.checkpoints.assemble import CheckpointError
from spec_decode.t5.config import T5Config

CONFIG_FILE = 'config.json'
MODEL_TYPES = ('t5', 'mt5', 'umt5', 'longt5')

_ACTIVATIONS = {
  'relu': ('relu',),
  'gelu': ('gelu_exact',),  # HF's non-gated 'gelu' is the exact gelu.
  'gelu_new': ('gelu',),
  'silu': ('silu',),
  'gated-relu': ('relu', 'linear'),
  'gated-gelu': ('gelu', 'linear'),  # HF maps it to gelu_new (tanh).
  'gated-gelu_new': ('gelu', 'linear'),
  'gated-silu': ('silu', 'linear'),
}
_FEED_FORWARD_PROJ = {
  ('relu',): 'relu',
  ('gelu_exact',): 'gelu',
  ('gelu',): 'gelu_new',
  ('silu',): 'silu',
  ('relu', 'linear'): 'gated-relu',
  ('gelu', 'linear'): 'gated-gelu',
  ('silu', 'linear'): 'gated-silu',
}
_LONG_ATTENTION = {'local': 'local', 'transient-global': 'transient-global'}
_LONG_MODULE = {
  'local': 'LocalSelfAttention',
  'transient-global': 'TransientGlobalSelfAttention',
}
# Copies HF keeps of tied or unused tensors.
IGNORED = frozenset(
  {
    'encoder.embed_tokens.weight',
    'decoder.embed_tokens.weight',
    'decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight',
  }
)


def read_hf_config(path: str) -> dict[str, Any]:
  file = os.path.join(path, CONFIG_FILE)
  try:
    with open(file) as f:
      return json.load(f)
  except FileNotFoundError:
    raise FileNotFoundError(f'Hugging Face config not found: {file}') from None
  except json.JSONDecodeError as e:
    raise CheckpointError(f'{file}: not valid JSON ({e})') from e


def scales_decoder_output(hf: dict[str, Any]) -> bool:
  """Whether transformers scales this model type's decoder output."""
  if hf.get('model_type', 't5') == 'mt5':
    return False
  if 'scale_decoder_outputs' in hf:
    return bool(hf['scale_decoder_outputs'])
  return bool(hf.get('tie_word_embeddings', True))


def config_from_hf(
  hf: dict[str, Any], description: str = CONFIG_FILE, tied: bool | None = None
) -> T5Config:
  """Maps a Hugging Face T5-family `config.json` dict onto `T5Config`.

  Args:
    hf: the parsed `config.json`.
    description: the file, for error messages.
    tied: whether the head is the scaled shared embedding; default
      `scales_decoder_output(hf)`.

  Returns:
    The config, with float32 parameters and activations.
  """
  model_type = hf.get('model_type', 't5')
  if model_type not in MODEL_TYPES:
    raise CheckpointError(
      f'{description}: model_type {model_type!r} is not a T5 encoder-decoder '
      f'spec_decode reads (supported: {", ".join(MODEL_TYPES)})'
    )
  proj = hf.get('feed_forward_proj', 'relu')
  if proj not in _ACTIVATIONS:
    raise CheckpointError(
      f'{description}: unsupported feed_forward_proj '
      f'{proj!r}; known: {sorted(_ACTIVATIONS)}'
    )
  long = {}
  if model_type == 'longt5':
    kind = hf.get('encoder_attention_type', 'local')
    if kind not in _LONG_ATTENTION:
      raise CheckpointError(
        f'{description}: LongT5 encoder_attention_type {kind!r} is not '
        f'supported (known: {", ".join(_LONG_ATTENTION)})'
      )
    long = dict(
      encoder_attention=_LONG_ATTENTION[kind],
      local_radius=int(hf.get('local_radius', 127)),
      global_block_size=int(hf.get('global_block_size', 16)),
    )
  try:
    num_layers = int(hf['num_layers'])
    dec_layers = hf.get('num_decoder_layers')
    return T5Config(
      vocab_size=int(hf['vocab_size']),
      emb_dim=int(hf['d_model']),
      num_heads=int(hf['num_heads']),
      head_dim=int(hf['d_kv']),
      mlp_dim=int(hf['d_ff']),
      num_encoder_layers=num_layers,
      num_decoder_layers=num_layers if dec_layers is None else int(dec_layers),
      mlp_activations=_ACTIVATIONS[proj],
      dropout_rate=float(hf.get('dropout_rate', 0.1)),
      logits_via_embedding=(
        scales_decoder_output(hf) if tied is None else tied
      ),
      relative_attention_num_buckets=int(
        hf.get('relative_attention_num_buckets', 32)
      ),
      relative_attention_max_distance=int(
        hf.get('relative_attention_max_distance', 128)
      ),
      layer_norm_epsilon=float(hf.get('layer_norm_epsilon', 1e-6)),
      per_layer_relpos_bias=model_type == 'umt5',
      **long,
    )
  except KeyError as e:
    raise CheckpointError(f'{description}: missing field {e}') from None
  except (TypeError, ValueError) as e:
    raise CheckpointError(f'{description}: {e}') from e


def hf_config_dict(config: T5Config) -> dict[str, Any]:
  """The Hugging Face `config.json` fields describing `config`."""
  acts = tuple(config.mlp_activations)
  if acts not in _FEED_FORWARD_PROJ:
    raise ValueError(f'mlp_activations {acts} have no Hugging Face name')
  model_type, arch = 't5', 'T5ForConditionalGeneration'
  extra = {}
  if config.per_layer_relpos_bias:
    model_type, arch = 'umt5', 'UMT5ForConditionalGeneration'
  elif config.encoder_attention != 'full':
    model_type, arch = 'longt5', 'LongT5ForConditionalGeneration'
    extra = {
      'encoder_attention_type': config.encoder_attention,
      'local_radius': config.local_radius,
      'global_block_size': config.global_block_size,
    }
  return {
    'architectures': [arch],
    'model_type': model_type,
    'vocab_size': config.vocab_size,
    'd_model': config.emb_dim,
    'd_kv': config.head_dim,
    'd_ff': config.mlp_dim,
    'num_layers': config.num_encoder_layers,
    'num_decoder_layers': config.num_decoder_layers,
    'num_heads': config.num_heads,
    'relative_attention_num_buckets': config.relative_attention_num_buckets,
    'relative_attention_max_distance': config.relative_attention_max_distance,
    'dropout_rate': config.dropout_rate,
    'layer_norm_epsilon': config.layer_norm_epsilon,
    'feed_forward_proj': _FEED_FORWARD_PROJ[acts],
    'tie_word_embeddings': config.logits_via_embedding,
    'scale_decoder_outputs': config.logits_via_embedding,
    'is_encoder_decoder': True,
    'pad_token_id': 0,
    'eos_token_id': 1,
    'decoder_start_token_id': 0,
    **extra,
  }


def name_map(config: T5Config) -> dict[str, tuple[str, bool]]:
  """Our name -> (HF name, transpose), except the untied logits kernel."""
  m = {'token_embedder/embedding': ('shared.weight', False)}
  proj = {'query': 'q', 'key': 'k', 'value': 'v', 'out': 'o'}
  acts = config.mlp_activations
  mlp = ['wi'] if len(acts) == 1 else [f'wi_{i}' for i in range(len(acts))]
  mlp.append('wo')
  enc_attn = _LONG_MODULE.get(config.encoder_attention, 'SelfAttention')
  table = 'relative_attention_bias.weight'

  def attention(ours, hf):
    for a, b in proj.items():
      m[f'{ours}/{a}/kernel'] = (f'{hf}.{b}.weight', True)

  def block(ours, hf, norm):
    m[f'{ours}/{norm}/scale'] = (f'{hf}.layer_norm.weight', False)

  for side, n in (
    ('encoder', config.num_encoder_layers),
    ('decoder', config.num_decoder_layers),
  ):
    attn = enc_attn if side == 'encoder' else 'SelfAttention'
    if not config.per_layer_relpos_bias:
      m[f'{side}/relpos_bias/rel_embedding'] = (
        f'{side}.block.0.layer.0.{attn}.{table}',
        True,
      )
    m[f'{side}/{side}_norm/scale'] = (f'{side}.final_layer_norm.weight', False)
    for i in range(n):
      ours, hf = f'{side}/layers_{i}', f'{side}.block.{i}.layer'
      if config.per_layer_relpos_bias:
        m[f'{ours}/relpos_bias/rel_embedding'] = (
          f'{hf}.0.{attn}.{table}',
          True,
        )
      if side == 'encoder':
        attention(f'{ours}/attention', f'{hf}.0.{attn}')
        block(ours, f'{hf}.0', 'pre_attention_layer_norm')
        if config.encoder_attention == 'transient-global':
          m[f'{ours}/global_input_layer_norm/scale'] = (
            f'{hf}.0.{attn}.global_input_layer_norm.weight',
            False,
          )
        mlp_layer = 1
      else:
        attention(f'{ours}/self_attention', f'{hf}.0.SelfAttention')
        block(ours, f'{hf}.0', 'pre_self_attention_layer_norm')
        attention(
          f'{ours}/encoder_decoder_attention', f'{hf}.1.EncDecAttention'
        )
        block(ours, f'{hf}.1', 'pre_cross_attention_layer_norm')
        mlp_layer = 2
      block(ours, f'{hf}.{mlp_layer}', 'pre_mlp_layer_norm')
      for w in mlp:
        m[f'{ours}/mlp/{w}/kernel'] = (
          f'{hf}.{mlp_layer}.DenseReluDense.{w}.weight',
          True,
        )
  if config.encoder_attention == 'transient-global':
    m['encoder/global_relpos_bias/rel_embedding'] = (
      f'encoder.block.0.layer.0.{enc_attn}.global_{table}',
      True,
    )
  return m

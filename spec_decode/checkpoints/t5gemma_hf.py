"""Hugging Face T5Gemma and T5Gemma 2 directories -> `T5GemmaConfig` and our
parameter tree.

Reads what `T5GemmaForConditionalGeneration` / `T5Gemma2ForConditionalGen
eration.save_pretrained` write (`config.json`, safetensors single or
sharded, or torch files: `huggingface.weight_files`). The vocabulary
(`tokenizer.model`, Gemma's sentencepiece model: pad 0, eos 1, bos 2, unk
3) is read and checked against the embedding rows before any weight is.
T5Gemma 2's vision tower and projector are skipped (text only), as are the
tied copies transformers may store (the decoder's embedding in version 2,
the head when tied).

Names (transformers -> ours; `Linear` weights transposed to `[in, out]`):

  {enc}.embed_tokens.weight       -> encoder/embedder/embedding (v1),
                                     embedder/embedding (v2)
  {enc}.embed_tokens.eoi_embedding -> embedder/eoi_embedding (v2)
  model.decoder.embed_tokens.weight -> decoder/embedder/embedding (v1)
  lm_head.out_proj.weight (untied) -> decoder/head/kernel
  {stack}.layers.i.self_attn.{q,k,v,o}_proj -> layers_i/attention/{query,..}
  {stack}.layers.i.self_attn.{q,k}_norm     -> attention/{query,key}_norm (v2)
  model.decoder.layers.i.cross_attn.*       -> layers_i/cross_attention (v1)
  {pre,post}_self_attn_layernorm  -> {pre,post}_attention_norm
  {pre,post}_cross_attn_layernorm -> {pre,post}_cross_norm
  {pre,post}_feedforward_layernorm -> {pre,post}_mlp_norm
  mlp.{gate,up,down}_proj         -> mlp/{gate,up,down}
  {stack}.norm.weight             -> {stack}/norm/scale

`{enc}` is `model.encoder` (transformers 5 saves version 2's text encoder
there) or `model.encoder.text_model`.
"""

import os
from typing import Any

import flax.linen as nn
import flax.traverse_util
import jax
import numpy as np

from spec_decode.checkpoints import huggingface
from spec_decode.checkpoints.assemble import CheckpointError
from spec_decode.checkpoints.assemble import to_dtype
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5gemma import network
from spec_decode.t5gemma.config import GLOBAL
from spec_decode.t5gemma.config import SLIDING
from spec_decode.t5gemma.config import Rope
from spec_decode.t5gemma.config import StackConfig
from spec_decode.t5gemma.config import T5GemmaConfig
from spec_decode.t5gemma.config import layer_pattern

MODEL_TYPES = {'t5gemma': 1, 't5gemma2': 2}
TOKENIZER_FILE = 'tokenizer.model'
_LAYER_TYPES = {'sliding_attention': SLIDING, 'full_attention': GLOBAL}
# transformers' default layer patterns: every other layer slides (v1), five
# of every six (v2, Gemma 3's `sliding_window_pattern`).
_PATTERN = {1: 2, 2: 6}
_SKIPPED_PREFIXES = (
  'model.encoder.vision_tower.',
  'model.encoder.multi_modal_projector.',
  'model.vision_tower.',
  'model.multi_modal_projector.',
)
_NORMS = {
  'pre_attention_norm': 'pre_self_attn_layernorm',
  'post_attention_norm': 'post_self_attn_layernorm',
  'pre_mlp_norm': 'pre_feedforward_layernorm',
  'post_mlp_norm': 'post_feedforward_layernorm',
  'pre_cross_norm': 'pre_cross_attn_layernorm',
  'post_cross_norm': 'post_cross_attn_layernorm',
}


class GemmaVocabulary(vocab_lib.Vocabulary):
  """Gemma's sentencepiece model (pad 0, eos 1, unk 3; BOS is 2)."""

  SPECIAL_IDS = (0, 1, 3)
  FAMILY = 'Gemma'


def is_t5gemma(path: str) -> bool:
  """Whether `path` is a Hugging Face directory of a T5Gemma model type."""
  if not huggingface.is_hf_dir(path):
    return False
  try:
    hf = huggingface.read_hf_config(path)
  except (CheckpointError, FileNotFoundError):
    return False
  return hf.get('model_type') in MODEL_TYPES


def _rope(params: dict, what: str) -> Rope:
  kind = params.get('rope_type', 'default')
  if kind not in ('default', 'linear'):
    raise CheckpointError(
      f'{what}: rope_type {kind!r} is not supported (default, linear)'
    )
  factor = float(params.get('factor', 1.0)) if kind == 'linear' else 1.0
  return Rope(theta=float(params.get('rope_theta', 10_000.0)), factor=factor)


def _stack(d: dict, version: int, what: str) -> StackConfig:
  act = d.get('hidden_activation', 'gelu_pytorch_tanh')
  if act not in ('gelu_pytorch_tanh', 'gelu_python_tanh'):
    raise CheckpointError(f'{what}: hidden_activation {act!r} unsupported')
  if d.get('attention_bias'):
    raise CheckpointError(f'{what}: attention_bias is not supported')
  n = int(d['num_hidden_layers'])
  types = d.get('layer_types')
  if types is None:
    layer_types = layer_pattern(n, _PATTERN[version])
  else:
    try:
      layer_types = tuple(_LAYER_TYPES[t] for t in types)
    except KeyError as e:
      raise CheckpointError(f'{what}: unknown layer type {e}') from None
  rope = d.get('rope_parameters') or {}
  if version == 1:
    glob = loc = _rope(
      rope or {'rope_theta': d.get('rope_theta', 10_000.0)}, what
    )
  else:
    glob = _rope(rope.get('full_attention') or {'rope_theta': 1e6}, what)
    loc = _rope(rope.get('sliding_attention') or {'rope_theta': 1e4}, what)
  softcap = d.get('attn_logit_softcapping')
  return StackConfig(
    num_layers=n,
    emb_dim=int(d['hidden_size']),
    mlp_dim=int(d['intermediate_size']),
    num_heads=int(d['num_attention_heads']),
    num_kv_heads=int(d['num_key_value_heads']),
    head_dim=int(d['head_dim']),
    layer_types=layer_types,
    sliding_window=d.get('sliding_window'),
    rope_global=glob,
    rope_local=loc,
    query_pre_attn_scalar=float(d.get('query_pre_attn_scalar', 256)),
    attn_logit_softcap=None if softcap is None else float(softcap),
    rms_eps=float(d.get('rms_norm_eps', 1e-6)),
  )


def config_from_hf(hf: dict[str, Any], what: str) -> T5GemmaConfig:
  """Maps a T5Gemma / T5Gemma 2 `config.json` dict onto `T5GemmaConfig`
  (the head tied as the file says; `read` unties it when the stored head
  differs from the embedding)."""
  version = MODEL_TYPES[hf['model_type']]
  try:
    enc, dec = hf['encoder'], hf['decoder']
    if version == 2:
      enc = enc['text_config']
    for side in (enc, dec):
      if side.get('eos_token_id', 1) not in (1, [1], None) and not (
        isinstance(side.get('eos_token_id'), list) and 1 in side['eos_token_id']
      ):
        raise CheckpointError(f'{what}: eos_token_id is not 1')
      if side.get('bos_token_id', 2) != 2 or side.get('pad_token_id', 0):
        raise CheckpointError(f'{what}: bos/pad ids are not Gemma 2/0')
    final = dec.get('final_logit_softcapping')
    return T5GemmaConfig(
      version=version,
      vocab_size=int(dec['vocab_size']),
      encoder=_stack(enc, version, f'{what} (encoder)'),
      decoder=_stack(dec, version, f'{what} (decoder)'),
      final_logit_softcap=None if final is None else float(final),
      tie_head=bool(hf.get('tie_word_embeddings', True)) or version == 2,
      eoi_token_index=hf.get('eoi_token_index') if version == 2 else None,
      image_token_index=hf.get('image_token_index') if version == 2 else None,
    )
  except KeyError as e:
    raise CheckpointError(f'{what}: missing field {e}') from None
  except (TypeError, ValueError) as e:
    raise CheckpointError(f'{what}: {e}') from e


def name_map(config: T5GemmaConfig, enc: str) -> dict[str, tuple[str, bool]]:
  """Our name -> (transformers name, transpose)."""
  m = {}
  proj = {'query': 'q', 'key': 'k', 'value': 'v', 'out': 'o'}
  mlp = ('gate', 'up', 'down')
  if config.shared_embedding:
    m['embedder/embedding'] = (f'{enc}.embed_tokens.weight', False)
    m['embedder/eoi_embedding'] = (f'{enc}.embed_tokens.eoi_embedding', False)
  else:
    m['encoder/embedder/embedding'] = (f'{enc}.embed_tokens.weight', False)
    m['decoder/embedder/embedding'] = (
      'model.decoder.embed_tokens.weight',
      False,
    )
  if not config.tie_head:
    m['decoder/head/kernel'] = ('lm_head.out_proj.weight', True)
  for side, hf, stack in (
    ('encoder', enc, config.encoder),
    ('decoder', 'model.decoder', config.decoder),
  ):
    m[f'{side}/norm/scale'] = (f'{hf}.norm.weight', False)
    for i in range(stack.num_layers):
      ours, theirs = f'{side}/layers_{i}', f'{hf}.layers.{i}'
      blocks = [('attention', 'self_attn')]
      if side == 'decoder' and not config.merged_attention:
        blocks.append(('cross_attention', 'cross_attn'))
      for block, hf_block in blocks:
        for a, b in proj.items():
          m[f'{ours}/{block}/{a}/kernel'] = (
            f'{theirs}.{hf_block}.{b}_proj.weight',
            True,
          )
      if config.qk_norm:
        for a in ('query', 'key'):
          m[f'{ours}/attention/{a}_norm/scale'] = (
            f'{theirs}.self_attn.{a[0]}_norm.weight',
            False,
          )
      for w in mlp:
        m[f'{ours}/mlp/{w}/kernel'] = (f'{theirs}.mlp.{w}_proj.weight', True)
      norms = dict(_NORMS)
      if side == 'encoder' or config.merged_attention:
        norms.pop('pre_cross_norm')
        norms.pop('post_cross_norm')
      for a, b in norms.items():
        m[f'{ours}/{a}/scale'] = (f'{theirs}.{b}.weight', False)
  return m


def expected_shapes(config: T5GemmaConfig) -> dict[str, tuple[int, ...]]:
  """Our parameter name -> shape, from the network's own init."""
  boxed = jax.eval_shape(
    network.Transformer(config).init,
    jax.random.key(0),
    *network.dummy_inputs(),
  )
  flat = flax.traverse_util.flatten_dict(
    nn.meta.unbox(boxed['params']), sep='/'
  )
  return {k: tuple(v.shape) for k, v in flat.items()}


def load_vocabulary(path: str) -> GemmaVocabulary | None:
  """`tokenizer.model` as a `GemmaVocabulary`, or None when absent."""
  file = os.path.join(path, TOKENIZER_FILE)
  if not os.path.isfile(file):
    return None
  try:
    return GemmaVocabulary.from_file(file, extra_ids=0)
  except ValueError as e:
    raise CheckpointError(f'{file}: not a Gemma vocabulary ({e})') from e


def check_vocabulary(vocab, config: T5GemmaConfig, what: str) -> None:
  """Refuses a vocabulary that is not this embedding's: more ids than rows,
  or fewer by 128 or more (Gemma 3 pads 262144 pieces to 262208 rows)."""
  if vocab is None:
    return
  ids, rows = vocab.vocab_size, config.vocab_size
  if ids > rows or rows - ids >= 128:
    raise CheckpointError(
      f'{what}: the vocabulary {vocab!r} has {ids} ids but the model '
      f"{rows} embedding rows: not this model's vocabulary"
    )


def read(
  path: str,
  config: T5GemmaConfig | None = None,
  dtype: Any = None,
  vocabulary: Any = None,
  shardings: Any = None,
):
  """Config, parameter tree and vocabulary of a T5Gemma directory.

  `shardings` (config -> `{'a/b/kernel': Sharding}`, as `checkpoints.read`
  takes it): each tensor goes into its shards as it is read, so device
  memory never holds a whole copy (the host holds one tensor at a time).

  Returns:
    `(config, params, vocabulary)`.

  Raises:
    CheckpointError: unsupported config, a vocabulary that does not fit, or
      tensors missing, extra or of the wrong shape (all checked before the
      weights are read).
  """
  file = os.path.join(path, huggingface.CONFIG_FILE)
  hf = huggingface.read_hf_config(path)
  stored = config_from_hf(hf, file)
  config = config or stored
  if dtype is not None:
    config = config.replace(param_dtype=dtype)
  vocab = vocabulary if vocabulary is not None else load_vocabulary(path)
  check_vocabulary(vocab, config, path)
  files, main = huggingface.weight_files(path)
  keys = set(files.keys())
  enc = 'model.encoder'
  if config.version == 2 and f'{enc}.embed_tokens.weight' not in keys:
    enc = 'model.encoder.text_model'
  both = {'lm_head.out_proj.weight', 'model.decoder.embed_tokens.weight'}
  if config.version == 1 and config.tie_head and both <= keys:
    # A stored head that differs from the embedding is untied, whatever
    # the config says.
    head = files.read('lm_head.out_proj.weight')
    embed = files.read('model.decoder.embed_tokens.weight')
    if not np.array_equal(head, embed):
      config = config.replace(tie_head=False)
  names = name_map(config, enc)
  if (
    'decoder/embedder/embedding' in names
    and 'model.decoder.embed_tokens.weight' not in keys
  ):
    names['decoder/embedder/embedding'] = ('lm_head.out_proj.weight', False)
  shapes = expected_shapes(config)
  problems = []
  for ours, shape in shapes.items():
    hf_name, transpose = names.get(ours, (None, False))
    if hf_name not in keys:
      problems.append(f'missing {hf_name or ours}')
      continue
    found = tuple(files.shape(hf_name))
    found = found[::-1] if transpose else found
    if found != shape:
      problems.append(f'{hf_name}: shape {found}, expected {shape}')
  used = {hf for hf, _ in names.values()}
  ignored = {'model.decoder.embed_tokens.weight', 'lm_head.out_proj.weight'}
  ignored.add('model.decoder.embed_tokens.eoi_embedding')
  extra = sorted(
    k for k in keys - used - ignored if not k.startswith(_SKIPPED_PREFIXES)
  )
  if extra:
    problems.append(f'unexpected tensors {extra[:5]}')
  if problems:
    raise CheckpointError(f'{main}: ' + '; '.join(problems[:8]))
  placed = shardings(config) if shardings is not None else {}
  flat = {}
  for ours in shapes:
    hf_name, transpose = names[ours]
    arr = files.read(hf_name)
    arr = arr.T if transpose else arr
    arr = np.ascontiguousarray(to_dtype(arr, config.param_dtype))
    flat[ours] = (
      jax.device_put(arr, placed[ours])
      if ours in placed
      else jax.numpy.asarray(arr)
    )
  return config, flax.traverse_util.unflatten_dict(flat, sep='/'), vocab

"""Hugging Face T5 directories: `config.json` plus safetensors or torch weights.

Reads what `transformers.T5ForConditionalGeneration.save_pretrained` writes:
`model.safetensors`, a sharded `model.safetensors.index.json`, or (when torch
is importable) `pytorch_model.bin` / its sharded index; `spiece.model` when
present becomes the vocabulary. Safetensors files are opened, validated and
listed with the `safetensors` package; each tensor is then read with one plain
file read at its header offsets (no memory map that would stay resident; and
bfloat16 / float8, which numpy cannot name, work too). Neither torch nor
TensorFlow is needed.

Config and names (T5, MT5, UMT5, LongT5; the output scaling per model type)
are `hf_config.py`'s. The head: an `lm_head.weight` that differs from
`shared.weight` is an untied head (scaled models get the scale folded into
the logits kernel); otherwise the head is `shared.weight`, scaled
(`logits_via_embedding=True`) or not.
"""

import json
import os
from typing import Any

import ml_dtypes
import numpy as np

from spec_decode.checkpoints.assemble import CheckpointError
from spec_decode.checkpoints.assemble import Shape
from spec_decode.checkpoints.assemble import to_dtype
from spec_decode.checkpoints.hf_config import CONFIG_FILE
from spec_decode.checkpoints.hf_config import IGNORED
from spec_decode.checkpoints.hf_config import config_from_hf
from spec_decode.checkpoints.hf_config import hf_config_dict
from spec_decode.checkpoints.hf_config import name_map
from spec_decode.checkpoints.hf_config import read_hf_config
from spec_decode.checkpoints.hf_config import scales_decoder_output
from spec_decode.t5 import byte_vocab
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.byte_vocab import ByteVocabulary
from spec_decode.t5.config import T5Config

SAFETENSORS_FILE = 'model.safetensors'
SAFETENSORS_INDEX = 'model.safetensors.index.json'
TORCH_FILE = 'pytorch_model.bin'
TORCH_INDEX = 'pytorch_model.bin.index.json'
SPIECE_FILE = 'spiece.model'
WEIGHT_FILES = (SAFETENSORS_FILE, SAFETENSORS_INDEX, TORCH_FILE, TORCH_INDEX)

_ST_DTYPES = {
  'F64': np.float64,
  'F32': np.float32,
  'F16': np.float16,
  'BF16': ml_dtypes.bfloat16,
  'F8_E4M3': ml_dtypes.float8_e4m3fn,
  'F8_E5M2': ml_dtypes.float8_e5m2,
  'I64': np.int64,
  'I32': np.int32,
  'I16': np.int16,
  'I8': np.int8,
  'U8': np.uint8,
  'BOOL': np.bool_,
}


def is_hf_dir(path: str) -> bool:
  if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
    return False
  return any(os.path.exists(os.path.join(path, f)) for f in WEIGHT_FILES)


# -- raw tensor files ---------------------------------------------------------
class _Safetensors:
  """Lazily opened safetensors files; one tensor read at a time."""

  def __init__(self, files: dict[str, str]):
    self._files = files  # HF name -> file path
    self._handles = {}
    self._headers = {}

  def _handle(self, file: str):
    if file not in self._handles:
      from safetensors import safe_open  # pylint: disable=g-import-not-at-top

      try:
        self._handles[file] = safe_open(file, framework='np')
      except FileNotFoundError:
        raise FileNotFoundError(f'weights file not found: {file}') from None
      except Exception as e:  # SafetensorError, OSError
        raise CheckpointError(
          f'{file}: unreadable safetensors file (truncated or corrupt?): {e}'
        ) from e
    return self._handles[file]

  def keys(self) -> list[str]:
    return list(self._files)

  def shape(self, name: str) -> Shape:
    return tuple(self._handle(self._files[name]).get_slice(name).get_shape())

  def read(self, name: str) -> np.ndarray:
    """Reads one tensor with plain file reads.

    `safe_open` validated the file and its header; the data is read with
    `np.fromfile` rather than through the package's memory map, whose pages
    would stay resident (and count as host memory) until the file closes.
    This also covers bfloat16 and float8, which numpy cannot name.
    """
    file = self._files[name]
    self._handle(file)  # Validates the file once.
    start, header = self._header(file)
    info = header[name]
    begin, end = info['data_offsets']
    dtype = _ST_DTYPES.get(info['dtype'])
    if dtype is None:
      raise CheckpointError(
        f'{file}: {name} has unsupported dtype {info["dtype"]}'
      )
    dtype = np.dtype(dtype).newbyteorder('<')
    shape = tuple(info['shape'])
    count = int(np.prod(shape))
    if end - begin != dtype.itemsize * count:
      raise CheckpointError(f'{file}: {name} has inconsistent offsets')
    arr = np.fromfile(file, dtype=dtype, count=count, offset=start + begin)
    if arr.size != count:
      raise CheckpointError(f'{file}: truncated inside {name}')
    return arr.reshape(shape)

  def _header(self, file: str) -> tuple[int, dict[str, Any]]:
    if file not in self._headers:
      with open(file, 'rb') as f:
        n = int.from_bytes(f.read(8), 'little')
        self._headers[file] = (8 + n, json.loads(f.read(n)))
    return self._headers[file]


class _TorchFiles:
  """`pytorch_model.bin` (or shards), memory-mapped by torch."""

  def __init__(self, files: dict[str, str]):
    self._files = files
    self._dicts = {}

  def _dict(self, file: str):
    if file not in self._dicts:
      try:
        import torch  # pylint: disable=g-import-not-at-top
      except ImportError:
        raise CheckpointError(
          f'{file}: reading pytorch_model.bin needs torch (the `hf` extra);'
          ' convert it to safetensors or install torch'
        ) from None
      try:
        try:
          self._dicts[file] = torch.load(
            file, map_location='cpu', mmap=True, weights_only=True
          )
        except RuntimeError as e:
          if 'mmap' not in str(e):
            raise
          # Pre-zipfile (torch < 1.6) files cannot be memory-mapped.
          self._dicts[file] = torch.load(
            file, map_location='cpu', weights_only=True
          )
      except FileNotFoundError:
        raise FileNotFoundError(f'weights file not found: {file}') from None
      except Exception as e:
        raise CheckpointError(
          f'{file}: unreadable torch checkpoint: {e}'
        ) from e
    return self._dicts[file]

  def keys(self) -> list[str]:
    return list(self._files)

  def shape(self, name: str) -> Shape:
    return tuple(self._dict(self._files[name])[name].shape)

  def read(self, name: str) -> np.ndarray:
    import torch  # pylint: disable=g-import-not-at-top

    t = self._dict(self._files[name])[name]
    if t.dtype == torch.bfloat16:
      return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def weight_files(path: str):
  """The directory's tensor files as a `_Safetensors` or `_TorchFiles`."""
  for index, kind in (
    (SAFETENSORS_INDEX, _Safetensors),
    (SAFETENSORS_FILE, _Safetensors),
    (TORCH_INDEX, _TorchFiles),
    (TORCH_FILE, _TorchFiles),
  ):
    file = os.path.join(path, index)
    if not os.path.exists(file):
      continue
    if not index.endswith('.index.json'):
      return kind({n: file for n in _single_file_keys(file, kind)}), file
    try:
      with open(file) as f:
        weight_map = json.load(f)['weight_map']
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise CheckpointError(f'{file}: not a weight index ({e!r})') from e
    files = {n: os.path.join(path, s) for n, s in weight_map.items()}
    for shard in sorted(set(files.values())):
      if not os.path.isfile(shard):
        raise FileNotFoundError(
          f'{file} names shard {shard}, which does not exist'
        )
    return kind(files), file
  raise FileNotFoundError(
    f'{path}: no Hugging Face weights (looked for {", ".join(WEIGHT_FILES)})'
  )


def _single_file_keys(file: str, kind) -> list[str]:
  reader = kind({})
  if kind is _Safetensors:
    return list(reader._handle(file).keys())  # pylint: disable=protected-access
  return list(reader._dict(file).keys())  # pylint: disable=protected-access


# -- the source ---------------------------------------------------------------
class HFSource:
  """A Hugging Face T5 directory as a `TensorSource` for a given config."""

  def __init__(self, path: str, config: T5Config, scaled_head: bool):
    self._files, self._main_file = weight_files(path)
    self.description = self._main_file
    self._map = name_map(config)
    keys = set(self._files.keys())
    self._head_scale = None
    if not config.logits_via_embedding:
      head = 'lm_head.weight' if 'lm_head.weight' in keys else 'shared.weight'
      self._map['decoder/logits_dense/kernel'] = (head, True)
      if scaled_head:
        self._head_scale = config.emb_dim**-0.5
    elif not scaled_head:
      raise CheckpointError(
        f'{self.description}: config.logits_via_embedding=True scales the '
        "logits, but the checkpoint's head is unscaled"
      )
    used = {hf for hf, _ in self._map.values()}
    self._extra = sorted(keys - used - IGNORED - {'lm_head.weight'})

  def shapes(self) -> dict[str, Shape]:
    keys = set(self._files.keys())
    out = {}
    for ours, (hf, transpose) in self._map.items():
      if hf in keys:
        shape = self._files.shape(hf)
        out[ours] = shape[::-1] if transpose else shape
    for hf in self._extra:
      out[f'(Hugging Face) {hf}'] = self._files.shape(hf)
    return out

  def read(self, name: str, dtype: np.dtype) -> np.ndarray:
    hf, transpose = self._map[name]
    arr = self._files.read(hf)
    if transpose:
      arr = arr.T
    if name == 'decoder/logits_dense/kernel' and self._head_scale is not None:
      arr = arr.astype(np.float32) * np.float32(self._head_scale)
    return np.ascontiguousarray(to_dtype(arr, dtype))

  def same_tensor(self, a: str, b: str) -> bool:
    """Whether HF tensors `a` and `b` hold the same values."""
    return np.array_equal(self._files.read(a), self._files.read(b))

  def has(self, hf_name: str) -> bool:
    return hf_name in set(self._files.keys())


def load_hf_config(path: str) -> tuple[T5Config, bool]:
  """The T5Config of an HF directory and whether its head is scaled.

  An untied, scaled head (an `lm_head.weight` that differs from `shared`
  while the config scales decoder outputs) becomes `logits_via_embedding=
  False` with the scale folded into the logits kernel.
  """
  hf = read_hf_config(path)
  file = os.path.join(path, CONFIG_FILE)
  scaled = scales_decoder_output(hf)
  config = config_from_hf(hf, file)
  if scaled:
    probe = HFSource(path, config.replace(logits_via_embedding=False), True)
    if probe.has('lm_head.weight') and not probe.same_tensor(
      'lm_head.weight', 'shared.weight'
    ):
      config = config.replace(logits_via_embedding=False)
  return config, scaled


def load_vocabulary(path: str) -> vocab_lib.Vocabulary | None:
  """`spiece.model` with the tokenizer config's `extra_ids` (default 100);
  a ByT5 tokenizer config without one: the byte vocabulary."""
  file = os.path.join(path, SPIECE_FILE)
  tok = {}
  tok_cfg = os.path.join(path, 'tokenizer_config.json')
  if os.path.isfile(tok_cfg):
    try:
      with open(tok_cfg) as f:
        tok = json.load(f)
    except (json.JSONDecodeError, TypeError, ValueError):
      pass
  if not os.path.isfile(file):
    if tok.get('tokenizer_class') == 'ByT5Tokenizer':
      # HF lists ByT5's 125 sentinels as added tokens (extra_ids 0),
      # `<extra_id_0>` = 259 counting up: its tokenizer's numbering.
      extra = len(tok.get('extra_special_tokens') or ()) or int(
        tok.get('extra_ids') or 125
      )
      return ByteVocabulary(extra_ids=extra, sentinels=byte_vocab.HF)
    return None
  extra = int(tok.get('extra_ids', vocab_lib.DEFAULT_EXTRA_IDS))
  return vocab_lib.Vocabulary.from_file(file, extra_ids=extra)


# -- writer -------------------------------------------------------------------
def save_safetensors(
  model, path: str, max_shard_bytes: int | None = None
) -> None:
  """Writes `model` as a Hugging Face T5 directory (float32 safetensors).

  Args:
    model: a `Model`.
    path: directory to create.
    max_shard_bytes: when set, splits the weights into shards of about this
      size plus a `model.safetensors.index.json`.
  """
  import flax.traverse_util  # pylint: disable=g-import-not-at-top

  config = model.config
  os.makedirs(path, exist_ok=True)
  flat = flax.traverse_util.flatten_dict(model.params, sep='/')
  tensors = {}
  for ours, (hf, transpose) in name_map(config).items():
    arr = np.asarray(flat[ours], np.float32)
    tensors[hf] = np.ascontiguousarray(arr.T if transpose else arr)
  if not config.logits_via_embedding:
    tensors['lm_head.weight'] = np.ascontiguousarray(
      np.asarray(flat['decoder/logits_dense/kernel'], np.float32).T
    )
  with open(os.path.join(path, CONFIG_FILE), 'w') as f:
    json.dump(hf_config_dict(config), f, indent=2)
  if isinstance(model.vocabulary, ByteVocabulary):
    with open(os.path.join(path, 'tokenizer_config.json'), 'w') as f:
      json.dump(
        {
          'tokenizer_class': 'ByT5Tokenizer',
          'extra_ids': model.vocabulary.extra_ids,
        },
        f,
      )
  elif model.vocabulary is not None:
    with open(os.path.join(path, SPIECE_FILE), 'wb') as f:
      f.write(model.vocabulary.serialized)
  write_safetensors(path, tensors, max_shard_bytes)


def write_safetensors(
  path: str, tensors: dict[str, np.ndarray], max_shard_bytes: int | None = None
) -> list[str]:
  """Writes `tensors` into the existing directory `path` as transformers
  saves them: one `model.safetensors`, or (`max_shard_bytes` set and
  exceeded) shards of about that size plus `model.safetensors.index.json`.

  Returns:
    The files written.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  shards, size = [{}], 0
  for name in sorted(tensors):
    arr = tensors[name]
    if max_shard_bytes and shards[-1] and size + arr.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = arr
    size += arr.nbytes
  meta = {'format': 'pt'}
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, SAFETENSORS_FILE), metadata=meta)
    return [SAFETENSORS_FILE]
  weight_map = {}
  for i, shard in enumerate(shards):
    file = f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors'
    save_file(shard, os.path.join(path, file), metadata=meta)
    weight_map.update({n: file for n in shard})
  total = sum(a.nbytes for a in tensors.values())
  with open(os.path.join(path, SAFETENSORS_INDEX), 'w') as f:
    json.dump(
      {'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=2
    )
  return [*sorted(set(weight_map.values())), SAFETENSORS_INDEX]

"""Reading and writing checkpoints: our orbax directories, Hugging Face, T5X.

`read` detects the format of a directory and returns config, parameters and
vocabulary (`Model.load` builds the model from them):
  * ours (written by `write`): `params/` (an orbax checkpoint of the parameter
    tree), `config.json` (`T5Config.to_json`, or `T5GemmaConfig.to_json`:
    `"family": "t5gemma"`) and, when the model has one, `spiece.model` plus
    `vocabulary.json` (`{"extra_ids": 100}`; Gemma's: `{"family": "gemma"}`);
  * a Hugging Face T5 directory (`config.json` + safetensors or torch
    weights; see `huggingface.py`), or a T5Gemma / T5Gemma 2 one
    (`t5gemma_hf.py`: a `T5GemmaConfig` and its parameter tree);
  * a T5X checkpoint directory (`checkpoint` msgpack + zarr arrays; see
    `t5x.py`), or a T5X model directory holding `checkpoint_<step>`
    subdirectories (the latest step is loaded); `scalable_t5`'s layout,
    scanned or not, is unstacked into ours (`t5x_layout.py`).

Every format is read one tensor at a time, cast straight to the requested
dtype, after the names and shapes were checked against the config.
"""

import dataclasses
import json
import os
from typing import Any
from typing import Callable

import flax.traverse_util
import jax
import numpy as np

from spec_decode.checkpoints import assemble
from spec_decode.checkpoints import huggingface
from spec_decode.checkpoints import t5gemma_hf
from spec_decode.checkpoints import t5x
from spec_decode.checkpoints import t5x_layout
from spec_decode.checkpoints.assemble import CheckpointError
from spec_decode.t5 import byte_vocab
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.byte_vocab import ByteVocabulary
from spec_decode.t5.config import T5Config
from spec_decode.t5gemma.config import T5GemmaConfig

PARAMS_DIR = 'params'
CONFIG_FILE = 'config.json'
VOCAB_FILE = 'spiece.model'
VOCAB_INFO_FILE = 'vocabulary.json'

ORBAX = 'orbax'
HUGGING_FACE = 'huggingface'
T5X = 't5x'
GEMMA = 'gemma'  # vocabulary.json's family of a Gemma vocabulary.


def detect_format(path: str) -> tuple[str, str]:
  """Returns `(format, directory)` for a checkpoint path.

  Raises:
    FileNotFoundError: `path` does not exist.
    CheckpointError: `path` is no checkpoint this module knows.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f'checkpoint not found: {path}')
  if os.path.isfile(path):
    if os.path.basename(path) == t5x.CHECKPOINT_FILE:
      return T5X, os.path.dirname(os.path.abspath(path))
    raise CheckpointError(
      f'{path} is a file; pass the checkpoint directory (ours, Hugging Face '
      'or T5X) instead'
    )
  if os.path.isdir(os.path.join(path, PARAMS_DIR)) and os.path.isfile(
    os.path.join(path, CONFIG_FILE)
  ):
    return ORBAX, path
  if huggingface.is_hf_dir(path):
    return HUGGING_FACE, path
  if t5x.is_t5x_dir(path):
    return T5X, path
  latest = t5x.latest_checkpoint_dir(path)
  if latest:
    return T5X, latest
  listing = sorted(os.listdir(path))[:10]
  raise CheckpointError(
    f'{path}: unknown checkpoint format (found {listing}); expected ours '
    f'({PARAMS_DIR}/ + {CONFIG_FILE}), Hugging Face ({CONFIG_FILE} + '
    f'{huggingface.SAFETENSORS_FILE} or an index) or T5X '
    f'({t5x.CHECKPOINT_FILE} msgpack + zarr arrays)'
  )


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """What a checkpoint directory holds, read into memory.

  Attributes:
    config: the hyperparameters (stored, or given to `read`): a `T5Config`,
      or a `T5GemmaConfig` for a T5Gemma checkpoint (Hugging Face or ours).
    params: the parameter tree (T5X names), in the storage dtype.
    vocabulary: the sentencepiece vocabulary, or None (T5X stores none).
    format: `ORBAX`, `HUGGING_FACE` or `T5X`.
  """

  config: T5Config
  params: Any
  vocabulary: vocab_lib.Vocabulary | None
  format: str


def read(
  path: str,
  config: T5Config | None = None,
  dtype: Any = None,
  vocabulary: vocab_lib.Vocabulary | None = None,
  progress: bool = False,
  shardings: Callable[[T5Config], dict[str, Any]] | None = None,
  fallback_vocabulary: vocab_lib.Vocabulary | None = None,
) -> Checkpoint:
  """Reads any supported checkpoint directory (`Model.load` wraps this).

  Args:
    path: our directory, a Hugging Face T5 directory, or a T5X checkpoint
      (or model) directory.
    config: hyperparameters; required for T5X. For our and Hugging Face
      directories it replaces the stored config (the shapes must agree).
    dtype: parameter storage dtype (e.g. `'bfloat16'`); default the config's
      `param_dtype` (float32).
    vocabulary: overrides (or supplies, for T5X) the vocabulary.
    progress: show a tqdm progress bar over tensors.
    shardings: config -> {'a/b/kernel': Sharding}; each tensor is read
      straight into its shards.
    fallback_vocabulary: the vocabulary when neither `vocabulary` nor the
      checkpoint gives one (a gin file's); size-checked like them, before
      any weight is read.

  Raises:
    FileNotFoundError: `path` or a file it needs does not exist.
    CheckpointError: unknown format, corrupt file, or weights disagreeing
      with the config.
  """
  fmt, directory = detect_format(path)
  if fmt == HUGGING_FACE and t5gemma_hf.is_t5gemma(directory):
    hf = huggingface.read_hf_config(directory)
    _check_family(config, 't5gemma', t5gemma_hf.MODEL_TYPES[hf['model_type']],
                  directory)  # fmt: skip
    config, params, vocab = t5gemma_hf.read(
      directory, config, dtype, vocabulary or fallback_vocabulary, shardings
    )
    return Checkpoint(config, params, vocab, fmt)
  wrap = _progress_bar(directory) if progress else None
  placed = lambda cfg: shardings(cfg) if shardings else None
  if fmt == ORBAX:
    stored, vocab = _read_ours(directory)
    if isinstance(stored, T5GemmaConfig):
      _check_family(config, 't5gemma', stored.version, directory)
    else:
      _check_family(config, 't5', None, directory)
    vocab = vocab if vocab is not None else fallback_vocabulary
    config = _with_dtype(config or stored, dtype)
    _check_vocab_fits(vocabulary or vocab, config, directory)
    params = _restore_orbax(directory, config, wrap, placed(config))
  elif fmt == HUGGING_FACE:
    _check_family(config, 't5', None, directory)
    stored, scaled = huggingface.load_hf_config(directory)
    config = _with_dtype(config or stored, dtype)
    vocab = huggingface.load_vocabulary(directory)
    vocab = vocab if vocab is not None else fallback_vocabulary
    _check_vocab_fits(vocabulary or vocab, config, directory)
    source = huggingface.HFSource(directory, config, scaled)
    params = assemble.assemble_params(config, source, wrap, placed(config))
  else:
    if config is None:
      raise ValueError(
        f'{directory}: a T5X checkpoint stores no hyperparameters; pass '
        'config=T5Config(...) or gin_file=... (e.g. models/t5_1_1/base.gin)'
      )
    _check_family(config, 't5', None, directory)
    config = _with_dtype(config, dtype)
    vocab = fallback_vocabulary
    _check_vocab_fits(vocabulary or vocab, config, directory)
    source = t5x_layout.T5XLayoutSource(t5x.T5XSource(directory), config)
    source.check(config)
    params = assemble.assemble_params(config, source, wrap, placed(config))
  vocab = vocabulary if vocabulary is not None else vocab
  _check_vocab_fits(vocab, config, directory)
  return Checkpoint(config, params, vocab, fmt)


def _check_family(
  config: Any, family: str, version: int | None, directory: str
) -> None:
  """Refuses, before any weight is read, a given config of another family
  (a T5 gin file for a T5Gemma checkpoint, ...) or T5Gemma version."""
  if config is None:
    return
  given = 't5gemma' if isinstance(config, T5GemmaConfig) else 't5'
  name = {'t5': 'T5', 't5gemma': 'T5Gemma'}
  stored = name[family] + (f' (version {version})' if version else '')
  if given != family:
    raise CheckpointError(
      f'{directory} holds a {stored} checkpoint, but the config given for '
      f'it is a {name[given]} one (a {name[given]} gin file or config)'
    )
  if version is not None and config.version != version:
    raise CheckpointError(
      f'{directory} holds a T5Gemma version {version} checkpoint, but the '
      f'config given for it is version {config.version} (T5Gemma '
      f'{"2 " if config.version == 2 else ""}gin files are '
      f'gin/models/t5gemma{"2" if config.version == 2 else ""}/)'
    )


def _with_dtype(config: T5Config, dtype: Any) -> T5Config:
  return config if dtype is None else config.replace(param_dtype=dtype)


# T5X pads embedding rows to a multiple of 128 (32100 ids -> 32128 rows).
_ROW_PADDING = 128


def _check_vocab_fits(vocab, config: T5Config, directory: str) -> None:
  """Refuses, before any weight is read, a vocabulary larger than the
  embedding, or smaller than it by more than T5X's padding (a 32k T5 file on
  mT5's 250k rows decodes to unknown pieces)."""
  if vocab is None:
    return
  if isinstance(config, T5GemmaConfig):
    t5gemma_hf.check_vocabulary(vocab, config, directory)
    return
  ids, rows = vocab.vocab_size, config.vocab_size
  what = f'the vocabulary {vocab!r}'
  if ids > rows:
    raise CheckpointError(
      f'{directory}: {what} has {ids} ids but the model only {rows} '
      'embedding rows'
    )
  if rows - ids >= _ROW_PADDING:
    raise CheckpointError(
      f'{directory}: {what} has {ids} ids but the model {rows} embedding '
      f"rows, more than T5X pads ({_ROW_PADDING}): not this model's "
      'vocabulary (pass the one it was trained with)'
    )


def _progress_bar(directory: str) -> Callable:
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

  return lambda it: tqdm.tqdm(it, desc=f'loading {directory}', unit='tensor')


def read_vocabulary(directory: str) -> vocab_lib.Vocabulary | None:
  """The vocabulary saved in one of our directories (or None).

  `spiece.model` plus `vocabulary.json` (extra ids), as `Model.save` and
  `drafters.Heads.save` write them.
  """
  vocab_file = os.path.join(directory, VOCAB_FILE)
  info_file = os.path.join(directory, VOCAB_INFO_FILE)
  info = {}
  if os.path.isfile(info_file):
    with open(info_file) as f:
      info = json.load(f)
  if info.get('type') == 'byte':
    return ByteVocabulary(
      extra_ids=int(info['extra_ids']),
      sentinels=info.get('sentinels', byte_vocab.SEQIO),
    )
  if not os.path.isfile(vocab_file):
    return None
  if info.get('family') == GEMMA:
    return t5gemma_hf.GemmaVocabulary.from_file(vocab_file, extra_ids=0)
  extra = int(info.get('extra_ids', vocab_lib.DEFAULT_EXTRA_IDS))
  return vocab_lib.Vocabulary.from_file(vocab_file, extra_ids=extra)


def write_vocabulary(directory: str, vocab: vocab_lib.Vocabulary) -> None:
  """Writes what `read_vocabulary` reads."""
  if isinstance(vocab, ByteVocabulary):
    with open(os.path.join(directory, VOCAB_INFO_FILE), 'w') as f:
      info = {'type': 'byte', 'extra_ids': vocab.extra_ids}
      if vocab.sentinels != byte_vocab.SEQIO:
        info['sentinels'] = vocab.sentinels
      json.dump(info, f)
    return
  with open(os.path.join(directory, VOCAB_FILE), 'wb') as f:
    f.write(vocab.serialized)
  info = {'extra_ids': vocab.extra_ids}
  if isinstance(vocab, t5gemma_hf.GemmaVocabulary):
    info = {'family': GEMMA}  # Gemma's special ids, no extra ids.
  with open(os.path.join(directory, VOCAB_INFO_FILE), 'w') as f:
    json.dump(info, f)


def save_arrays(path: str, tree: Any) -> str:
  """Creates the new directory `path` and writes `tree` to `path/params`.

  Returns:
    The absolute path.

  Raises:
    FileExistsError: `path` exists and is not empty.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = os.path.abspath(os.fspath(path))
  if os.path.isdir(path) and os.listdir(path):
    raise FileExistsError(f'{path} exists and is not empty')
  os.makedirs(path, exist_ok=True)
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(os.path.join(path, PARAMS_DIR), tree)
  ckptr.wait_until_finished()
  return path


# -- our format ---------------------------------------------------------------
def _read_ours(directory: str):
  file = os.path.join(directory, CONFIG_FILE)
  try:
    with open(file) as f:
      text = f.read()
    if json.loads(text).get('family') == 't5gemma':
      config = T5GemmaConfig.from_json(text)
    else:
      config = T5Config.from_json(text)
  except (ValueError, TypeError, KeyError, AttributeError) as e:
    raise CheckpointError(
      f'{file}: not a T5Config or T5GemmaConfig ({e})'
    ) from e
  return config, read_vocabulary(directory)


def stored_config(directory: str) -> Any:
  """The config of one of our directories (`T5Config` or `T5GemmaConfig`),
  without reading its weights."""
  return _read_ours(directory)[0]


def _expected_shapes(config) -> dict[str, tuple[int, ...]]:
  if isinstance(config, T5GemmaConfig):
    return t5gemma_hf.expected_shapes(config)
  return assemble.expected_shapes(config)


def _restore_orbax(
  directory: str,
  config: T5Config,
  progress: Callable | None = None,
  shardings: dict[str, Any] | None = None,
) -> Any:
  """Restores layer by layer: orbax would read every array at once.

  With `shardings` (name -> `Sharding`) each array is read into its shards.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  params_dir = os.path.abspath(os.path.join(directory, PARAMS_DIR))
  try:
    tree = ocp.StandardCheckpointer().metadata(params_dir).item_metadata.tree
  except Exception as e:
    raise CheckpointError(
      f'{params_dir}: unreadable orbax checkpoint ({e})'
    ) from e
  found = {
    '/'.join(str(getattr(k, 'key', k)) for k in path): tuple(leaf.shape)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }
  want = _expected_shapes(config)
  assemble.check_shapes(config, found, params_dir, want)
  dtype = np.dtype(config.param_dtype)
  single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  sharding_of = lambda name: shardings[name] if shardings else single
  groups = {}
  for name, shape in want.items():
    group = '/'.join(name.split('/')[:2])  # e.g. encoder/layers_3
    groups.setdefault(group, {})[name] = shape
  ckptr = ocp.PyTreeCheckpointer()
  flat = {}
  names = sorted(groups)
  for group in progress(names) if progress else names:
    item = _nest(
      {
        n: jax.ShapeDtypeStruct(s, dtype, sharding=sharding_of(n))
        for n, s in groups[group].items()
      }
    )
    restore_args = jax.tree.map(
      lambda x: ocp.ArrayRestoreArgs(
        dtype=dtype, sharding=x.sharding, global_shape=x.shape
      ),
      item,
    )
    args = ocp.args.PyTreeRestore(
      item=item, restore_args=restore_args, partial_restore=True
    )
    try:
      part = ckptr.restore(params_dir, args=args)
    except Exception as e:
      raise CheckpointError(
        f'{params_dir}: orbax restore of {group} failed ({e})'
      ) from e
    flat.update(flax.traverse_util.flatten_dict(part, sep='/'))
  return _nest(flat)


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
  return flax.traverse_util.unflatten_dict(flat, sep='/')


def write(
  path: str,
  config: T5Config,
  params: Any,
  vocabulary: vocab_lib.Vocabulary | None = None,
) -> None:
  """Writes a model to a new directory `path` in our format.

  Raises:
    FileExistsError: `path` exists and is not empty.
  """
  path = save_arrays(path, params)
  with open(os.path.join(path, CONFIG_FILE), 'w') as f:
    f.write(config.to_json())
  if vocabulary is not None:
    write_vocabulary(path, vocabulary)

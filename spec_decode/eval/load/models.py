"""Models, their mesh and vocabularies for eval runs, and how a run names them.

`partitioner` builds the run's device mesh from T5X's knobs
(`num_partitions`, `model_parallel_submesh`: the `model` axis; `data` takes
the remaining devices), or none for a single-device run; `load_model` reads
a checkpoint (ours, Hugging Face or T5X) or builds a randomly initialized
network from a gin model file; `task_vocabulary` trains a small
sentencepiece model on a task split (smoke runs). `describe` labels a model
in the report and `fingerprint` identifies it in run_state.json, so that a
rerun with another model is refused instead of resumed.
"""

import functools
import hashlib
import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

import spec_decode as sd
from spec_decode import paths
from spec_decode.checkpoints import gin_model
from spec_decode.data import tasks as tasks_lib
from spec_decode.parallel import partitioning
from spec_decode.t5 import vocab as vocab_lib


def partitioner(
  num_partitions: int | None = None,
  model_parallel_submesh: Sequence[int] | None = None,
  batch_size: int | None = None,
) -> partitioning.Partitioner | None:
  """The run's mesh: `model` = `num_partitions`, `data` = the other devices.

  Args:
    num_partitions: size of the `model` axis (T5X's
      `PjitPartitioner.num_partitions`; gin: NUM_PARTITIONS).
    model_parallel_submesh: T5X's `(x, y, z, cores)` model tile, whose
      product is the `model` size (gin: MODEL_PARALLEL_SUBMESH).
    batch_size: the run's rows per decode; with several processes it must
      split over the `data` axis (each process feeds its rows).

  Returns:
    None when neither knob is set in a single process (the models stay on
    one device, as before); else a `Partitioner` over all devices (of all
    processes).

  Raises:
    ValueError: a bad or inconsistent size, more partitions than devices,
      or a batch that does not split over `data` in a multi-process run.
  """
  import jax  # pylint: disable=g-import-not-at-top

  for name, value in (
    ('num_partitions', num_partitions),
    ('batch_size', batch_size),
  ):
    if value is not None and (
      isinstance(value, bool) or not isinstance(value, int) or value < 1
    ):
      raise ValueError(f'{name} must be an int >= 1 or None, got {value!r}')
  if model_parallel_submesh is not None:
    if isinstance(model_parallel_submesh, (str, bytes)) or not all(
      isinstance(n, int) and not isinstance(n, bool) and n >= 1
      for n in model_parallel_submesh
    ):
      raise ValueError(
        'model_parallel_submesh must be a tuple of ints >= 1 (T5X: '
        f'(x, y, z, cores)), got {model_parallel_submesh!r}'
      )
    model_parallel_submesh = tuple(model_parallel_submesh)
  processes = jax.process_count()
  if num_partitions is None and model_parallel_submesh is None:
    if processes == 1:
      return None
    num_partitions = 1
  p = partitioning.Partitioner(
    num_partitions=num_partitions,
    model_parallel_submesh=model_parallel_submesh,
  )
  if processes > 1 and batch_size is not None and batch_size % p.data_size:
    raise ValueError(
      f'BATCH_SIZE {batch_size} does not split over the data axis of the '
      f'{p.data_size} x {p.model_size} mesh ({processes} processes feed '
      f'their rows of every batch); use a multiple of {p.data_size}'
    )
  return p


def load_model(
  checkpoint: str | None = None,
  model_gin: str | None = None,
  seed: int = 0,
  vocabulary: Any = None,
  vocab_size: int | None = None,
  dtype: Any = None,
  search_paths: Sequence[str] = (),
  partitioner: partitioning.Partitioner | None = None,
  replicated: bool = False,
) -> sd.Model:
  """A model from a checkpoint, or with random weights from a gin file.

  Args:
    checkpoint: our orbax directory, a Hugging Face T5 directory or a T5X
      checkpoint; a relative path is also looked up in the repository.
    model_gin: a gin model file, ours (`models/t5_1_1/xxl.gin`,
      `models/t5gemma/2b_2b.gin`) or T5X's own: the hyperparameters of a
      T5X checkpoint, or, without a checkpoint, the network to initialize
      randomly (smoke tests; a T5Gemma file gives a `T5GemmaModel`).
    seed: seed of the random initialization.
    vocabulary: a `Vocabulary` or a sentencepiece `.model` path; overrides
      the checkpoint's (T5X checkpoints store none).
    vocab_size: embedding rows of a random model (default: the vocabulary's
      size).
    dtype: parameter storage dtype of a loaded checkpoint.
    search_paths: where the gin file's includes are looked up first (T5X's
      `--gin_search_paths`).
    partitioner: the run's mesh (`partitioner()`): every tensor is read
      or initialized straight into its shards; None: one device.
    replicated: put the parameters whole on every device of the mesh (a
      small draft, as docs/capacity_plan.md lays it out); the decode state
      is still split by rows.

  Returns:
    The `Model`.

  Raises:
    FileNotFoundError: the checkpoint does not exist.
    ValueError: neither a checkpoint nor a gin file, or no vocabulary size.
  """
  vocab = as_vocabulary(vocabulary)
  if partitioner is not None and replicated:
    partitioner = partitioner.replicated()
  if checkpoint:
    path = paths.resolve(checkpoint)
    if not os.path.exists(path):
      raise FileNotFoundError(f'checkpoint not found: {checkpoint}')
    return sd.Model.load(
      path,
      gin_file=model_gin,
      vocabulary=vocab,
      dtype=dtype,
      search_paths=tuple(search_paths),
      partitioner=partitioner,
    )
  if not model_gin:
    raise ValueError(
      'load_model needs a checkpoint or a model_gin file (gin: '
      'CHECKPOINT_PATH or DRAFT_CHECKPOINT; TARGET_MODEL_GIN or '
      'DRAFT_GIN_FILE alone builds random weights)'
    )
  if vocab_size is None:
    if vocab is None:
      raise ValueError(
        f'{model_gin}: a random model needs a vocabulary or a vocab_size'
      )
    vocab_size = vocab.vocab_size
  config, _ = gin_model.read(
    model_gin, search_paths=tuple(search_paths), vocab_size=int(vocab_size)
  )
  if isinstance(config, sd.T5Config):
    return sd.Model.init(
      config, seed=seed, vocabulary=vocab, partitioner=partitioner
    )
  # A T5Gemma model gin file (gin/models/t5gemma*/).
  model = sd.T5GemmaModel.init(config, seed=seed, vocabulary=vocab)
  return partitioner.shard_params(model) if partitioner else model


def as_vocabulary(vocabulary: Any) -> vocab_lib.Vocabulary | None:
  """A `Vocabulary` as is; a `.model` path (also under the repo) loaded."""
  if vocabulary is None or isinstance(vocabulary, vocab_lib.Vocabulary):
    return vocabulary
  return vocab_lib.Vocabulary.from_file(paths.resolve(vocabulary))


def task_vocabulary(
  task: str = 'synthetic_tiny',
  split: str = 'train',
  vocab_size: int = 64,
  extra_ids: int = 0,
) -> vocab_lib.Vocabulary:
  """A small sentencepiece vocabulary trained on a task split (smoke runs).

  Training is deterministic and cached per argument tuple, so target and
  draft built from the same arguments share one vocabulary.
  """
  return _train_vocabulary(task, split, int(vocab_size), int(extra_ids))


@functools.lru_cache(maxsize=8)
def _train_vocabulary(task, split, vocab_size, extra_ids):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  texts = []
  for ex in tasks_lib.examples(task, split):
    texts += [ex['inputs'], ex['targets']]
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(texts),
    model_writer=model,
    vocab_size=vocab_size,
    model_type='unigram',
    character_coverage=1.0,
    pad_id=0,
    eos_id=1,
    unk_id=2,
    bos_id=-1,
    hard_vocab_limit=False,
    num_threads=1,
    minloglevel=2,
  )
  return vocab_lib.Vocabulary(
    model.getvalue(), extra_ids=extra_ids, name=f'{task}/{split}'
  )


def describe(model: Any, name: str | None = None) -> str:
  """A short label: `name`, else the size of a T5 `Model`."""
  if name:
    return name
  cfg = getattr(model, 'config', None)
  params = getattr(model, 'params', None)
  if cfg is None or params is None:
    return type(model).__name__
  import jax  # pylint: disable=g-import-not-at-top

  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  if isinstance(model, sd.T5GemmaModel):
    family = 'T5Gemma 2' if cfg.version == 2 else 'T5Gemma'
    return (
      f'{family} {n / 1e6:.1f}M (d{cfg.encoder.emb_dim}, '
      f'{cfg.encoder.num_layers}+{cfg.decoder.num_layers}L)'
    )
  return (
    f'T5 {n / 1e6:.1f}M (d{cfg.emb_dim}, '
    f'{cfg.num_encoder_layers}+{cfg.num_decoder_layers}L)'
  )


def fingerprint(model: Any) -> dict[str, Any]:
  """Identifies a model or drafter: a T5 config, else a digest of leaves."""
  cfg = getattr(model, 'config', None)
  vocab = getattr(model, 'vocabulary', None)
  out = {
    'type': type(model).__name__,
    'config': cfg.to_dict() if hasattr(cfg, 'to_dict') else None,
    'vocabulary': getattr(vocab, 'digest', None),
  }
  if out['config'] is None:
    import jax  # pylint: disable=g-import-not-at-top

    leaves, tree = jax.tree.flatten(model)
    digest = hashlib.sha1(str(tree).encode())
    for leaf in leaves:
      if hasattr(leaf, 'dtype') and jax.dtypes.issubdtype(
        leaf.dtype, jax.dtypes.prng_key
      ):
        leaf = jax.random.key_data(leaf)
      digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    out['digest'] = digest.hexdigest()
  return out

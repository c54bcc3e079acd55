"""Trains a T5 `Model` on a task with optax (`spec-decode train`).

A run's settings are one `TrainSettings`; `run(settings)` trains. The
library functions below carry no gin decorators: `spec-decode train`
(`spec_decode.train.cli`) parses `--gin_file`s and `--gin.NAME=VALUE`
bindings and calls the gin-configured `train`, which takes the settings'
fields as keyword arguments and calls `run` (dynamic registration, so a
config binds `lm.train.<field>` after `from spec_decode.train import lm`),
the way T5X's `t5x/train.py` does.

    spec-decode train --gin_file=configs/train_demo_target.gin \\
        --model_dir=runs/demo/target [--gin.TRAIN_STEPS=2000]

What a run does:
  * tokenizes the task's train split once with the sentencepiece vocabulary,
    then groups examples into length buckets; every bucket has a fixed
    `[batch, input_len]` / `[batch, target_len]` shape, so the train step
    compiles once per bucket and never again; short buckets hold more rows
    (a constant token budget per batch). Examples longer than the largest
    bucket are dropped.
  * the batch of step `s` and its dropout key depend only on `(seed, s)`,
    so a resumed run sees the same batches as an uninterrupted one.
  * loss: cross-entropy on target tokens (padding masked), optional label
    smoothing and z-loss (T5X's `cross_entropy_with_logits`); with a
    teacher, `(1 - w) * CE + w * T^2 * KL(teacher_T || student_T)` on soft
    targets at temperature `T` (distillation of a draft from its target).
  * optimizer: AdamW, linear warmup then cosine decay, global-norm clipping.
  * validation loss every `eval_every` steps on the first `eval_examples`
    validation examples; a tqdm bar shows loss, tokens/s and the last
    validation loss; every logged step goes to `<model_dir>/train_log.jsonl`.
  * orbax checkpoints of `{step, params, opt_state}` every
    `checkpoint_every` steps under `<model_dir>/checkpoints/`; rerunning the
    same command resumes from the latest one. Ctrl-C (or SIGTERM, or the
    `max_minutes` budget) saves a checkpoint before exiting.
  * at the end (also after an interruption) the model is exported in
    `Model.save` format, with its vocabulary, to `<model_dir>/model`,
    parameters stored as `save_dtype`.

The data, optimizer, checkpoints and loop are `spec_decode.train.common`'s,
and the run's frame (optimizer and state, opening line, loop, export,
closing line) is `spec_decode.train.job`'s, both shared with Medusa-heads
training (`spec_decode.train.heads`).
"""

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import paths
from spec_decode.data import tasks as tasks_lib
from spec_decode.models import t5_model
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.config import PAD_ID
from spec_decode.t5.config import T5Config
from spec_decode.train import common
from spec_decode.train import greedy
from spec_decode.train import job

MODEL_DIR = 'model'

# (input_len, target_len, batch_size): about 2k tokens a side per batch.
DEFAULT_BUCKETS = ((32, 32, 64), (64, 64, 32), (128, 128, 16))


# ----------------------------------------------------------------- loss.


def cross_entropy(
  logits: jax.Array,
  targets: jax.Array,
  label_smoothing: float = 0.0,
  z_loss: float = 0.0,
) -> jax.Array:
  """Per-token cross-entropy `[B, T]` with optional smoothing and z-loss.

  With label smoothing the loss is shifted by the entropy of the smoothed
  target distribution, so a perfect prediction scores 0, as in T5X.

  Args:
    logits: `[B, T, V]` float32.
    targets: `[B, T]` int ids.
    label_smoothing: mass spread uniformly over the other ids.
    z_loss: coefficient of `logsumexp(logits)^2`.
  """
  vocab_size = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab_size - 1)
  normalizer = (
    -(
      confidence * math.log(confidence)
      + (vocab_size - 1) * low * math.log(low + 1e-20)
    )
    if label_smoothing
    else 0.0
  )
  soft = jax.nn.one_hot(targets, vocab_size) * (confidence - low) + low
  log_z = jax.nn.logsumexp(logits, axis=-1)
  log_p = logits - log_z[..., None]
  loss = -jnp.sum(soft * log_p, axis=-1) - normalizer
  return loss + z_loss * jnp.square(log_z)


@dataclasses.dataclass(frozen=True)
class LossSettings:
  """Static loss settings (hashable: a jit static argument)."""

  label_smoothing: float = 0.0
  z_loss: float = 0.0
  distill_weight: float = 0.0
  distill_temperature: float = 1.0


def _loss(
  params,
  config,
  batch_inputs,
  batch_targets,
  dropout_key,
  teacher,
  settings: LossSettings,
  deterministic: bool,
):
  module = t5_model.Model(config, params).module
  rngs = None if deterministic else {'dropout': dropout_key}
  logits = module.apply(
    {'params': params},
    batch_inputs,
    t5_model.shift_right(batch_targets),
    deterministic=deterministic,
    rngs=rngs,
  )
  weights = (batch_targets != PAD_ID).astype(jnp.float32)
  ce = cross_entropy(
    logits, batch_targets, settings.label_smoothing, settings.z_loss
  )
  per_token = ce
  if teacher is not None and settings.distill_weight:
    t_logits = jax.lax.stop_gradient(
      teacher.module.apply(
        {'params': teacher.params},
        batch_inputs,
        t5_model.shift_right(batch_targets),
      )
    )
    kl = common.kl_to_teacher(logits, t_logits, settings.distill_temperature)
    w = settings.distill_weight
    per_token = (1.0 - w) * ce + w * settings.distill_temperature**2 * kl
  denom = jnp.maximum(weights.sum(), 1.0)
  loss = jnp.sum(per_token * weights) / denom
  # Plain cross-entropy (no smoothing, no z-loss), for reporting.
  nll = cross_entropy(logits, batch_targets)
  return loss, {'nll': jnp.sum(nll * weights) / denom, 'tokens': weights.sum()}


def _train_step(
  state: common.TrainState,
  inputs,
  targets,
  base_key,
  teacher,
  config: T5Config,
  optimizer,
  settings: LossSettings,
):
  key = jax.random.fold_in(base_key, state.step)

  def loss_fn(params):
    return _loss(params, config, inputs, targets, key, teacher, settings, False)

  return common.apply_gradients(state, optimizer, loss_fn)


def _eval_step(params, inputs, targets, config: T5Config):
  _, aux = _loss(
    params, config, inputs, targets, None, None, LossSettings(), True
  )
  return aux['nll'] * aux['tokens'], aux['tokens']


# ------------------------------------------------------------ the run.


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """Everything a T5 training run takes (`run`); see the module docstring.

  `spec-decode train` binds these as `lm.train.<field>` (`train` takes
  them as arguments).

  Attributes:
    model_dir: where checkpoints, the log and the exported model go.
    model_config: the network; `vocab_size` must cover the vocabulary.
    vocabulary_file: a sentencepiece `.model` (T5 ids, 100 extra ids); a
      relative path is also looked up in the repository
      (`paths.resolve`). Required.
    task: a `tasks.task_names()` name, or several (a sequence, or names
      joined by `+`): their splits are concatenated, so each task weighs
      in proportion to its size, and the inputs' task prefixes tell them
      apart (one model for translation and summarization).
    data_dir: the task's data directory (None: the default).
    train_steps: total optimizer steps.
    buckets: `(input_len, target_len, batch_size)` batch shapes.
    learning_rate: peak AdamW learning rate.
    warmup_steps: linear warmup steps.
    final_lr_fraction: the cosine decay ends at this fraction of the peak.
    weight_decay: AdamW decoupled weight decay.
    clip_norm: global gradient-norm clip.
    label_smoothing: T5X-style label smoothing.
    z_loss: coefficient of the z-loss.
    teacher_path: a `Model.load` path (`paths.resolve`d); when set, the
      loss mixes in the KL to the teacher's soft targets (the teacher must
      share the vocabulary).
    init_from: a `Model.load` path (`paths.resolve`d) whose parameters
      start a new run instead of a random initialization (a warm start:
      the optimizer, step and schedule start fresh). Ignored when the run
      resumes from its own checkpoint. Its config must match
      `model_config`'s shapes and its vocabulary the run's.
    distill_weight: weight `w` of the KL term (1.0: pure distillation).
    distill_temperature: softmax temperature of the soft targets.
    distill_targets: with a teacher, what the student is trained on:
      `references` (the task's targets) or `teacher_greedy` (the teacher's
      own greedy outputs for the train inputs: sequence-level distillation,
      decoded once and cached in `<model_dir>/teacher_greedy.npz`).
    eval_every: steps between validation losses (0: only at the end).
    eval_examples: validation examples scored.
    checkpoint_every: steps between checkpoints.
    keep_checkpoints: checkpoints kept on disk.
    log_every: steps between log records and bar updates.
    max_minutes: wall-clock budget of this invocation; on expiry the run
      checkpoints and exits (rerun to continue).
    deadline: a `time.time()` at which the loop stops as on `max_minutes`
      (whichever comes first): for a driver with one budget for several
      runs (`spec-decode train pair`).
    save_dtype: storage dtype of the exported model's parameters.
    train_examples: use only the first N training examples.
    seed: initialization, data order and dropout seed.
    progress: show the tqdm bar.
  """

  model_dir: str
  model_config: T5Config
  vocabulary_file: str | None = None
  task: str | Sequence[str] = 'debian_ende'
  data_dir: str | None = None
  train_steps: int = 1000
  buckets: Sequence[Sequence[int]] = DEFAULT_BUCKETS
  learning_rate: float = 1e-3
  warmup_steps: int = 200
  final_lr_fraction: float = 0.1
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  label_smoothing: float = 0.0
  z_loss: float = 1e-4
  teacher_path: str | None = None
  init_from: str | None = None
  distill_weight: float = 1.0
  distill_temperature: float = 1.0
  distill_targets: str = 'references'
  eval_every: int = 200
  eval_examples: int = 256
  checkpoint_every: int = 200
  keep_checkpoints: int = 2
  log_every: int = 10
  max_minutes: float | None = None
  deadline: float | None = None
  save_dtype: Any = 'float32'
  train_examples: int | None = None
  seed: int = 0
  progress: bool = True


@dataclasses.dataclass
class TrainResult:
  """What `train` returns.

  Attributes:
    step: optimizer steps taken so far.
    train_loss: mean training loss of the last logged steps (None if none
      were logged by this invocation).
    validation_loss: validation cross-entropy per target token.
    stopped: `done`, `interrupted` (Ctrl-C / SIGTERM) or `time`
      (`max_minutes`).
    model_path: the exported `Model.save` directory.
  """

  step: int
  train_loss: float | None
  validation_loss: float | None
  stopped: str
  model_path: str


def train(*args, **kwargs) -> TrainResult:
  """`run(TrainSettings(*args, **kwargs))`: the entry point gin binds.

  Its parameters are `TrainSettings`'s fields, with their defaults (the
  signature is `TrainSettings`'s), so a config binds `lm.train.<field>`.

  Returns:
    A `TrainResult`.
  """
  return run(TrainSettings(*args, **kwargs))


train.__signature__ = job.signature_of(TrainSettings, TrainResult)


def run(settings: TrainSettings) -> TrainResult:
  """Trains (or resumes training) a T5 model; see the module docstring.

  Args:
    settings: the run's settings.

  Returns:
    A `TrainResult`.
  """
  s = settings
  os.makedirs(s.model_dir, exist_ok=True)
  vocabulary = _vocabulary(s)
  task_names = s.task.split('+') if isinstance(s.task, str) else list(s.task)
  if s.distill_targets not in ('references', 'teacher_greedy'):
    raise ValueError(
      "distill_targets must be 'references' or 'teacher_greedy', got "
      f'{s.distill_targets!r}'
    )
  if s.distill_targets == 'teacher_greedy' and not s.teacher_path:
    raise ValueError("distill_targets='teacher_greedy' needs a teacher_path")
  task_objs = [tasks_lib.get_task(name, s.data_dir) for name in task_names]
  # Checked before any tokenizing or compiling, so a wrong path or shape
  # fails in seconds.
  init_model = _init_model(s, vocabulary) if s.init_from else None

  def tokenized(split, limit):
    per_task = limit and -(-limit // len(task_objs))
    return [
      ex
      for t in task_objs
      for ex in common.tokenize_split(t, split, vocabulary, per_task)
    ]

  eval_data = common.BucketedData(
    tokenized('validation', s.eval_examples), s.buckets, s.seed
  )
  eval_batches = eval_data.all_batches()
  teacher, loss_settings = _teacher(s, vocabulary)
  if s.distill_targets == 'teacher_greedy':
    train_examples_list = _teacher_greedy_examples(
      teacher,
      tokenized('train', s.train_examples),
      s.buckets,
      s.model_dir,
      s.progress,
    )
  else:
    train_examples_list = tokenized('train', s.train_examples)
  train_data = common.BucketedData(train_examples_list, s.buckets, s.seed)

  config = s.model_config.replace(param_dtype=jnp.float32)

  def init_params():
    if init_model is not None:
      return jax.tree.map(
        lambda x: jnp.asarray(x, jnp.float32), init_model.params
      )
    return t5_model.Model.init(config, seed=s.seed).params

  optimizer, state, resumed = job.start(s, init_params)
  base_key = jax.random.fold_in(jax.random.key(s.seed), 1)
  train_step = jax.jit(
    _train_step, static_argnums=(5, 6, 7), donate_argnums=(0,)
  )
  eval_step = jax.jit(_eval_step, static_argnums=(3,))

  def step(state, batch):
    return train_step(
      state,
      batch.inputs,
      batch.targets,
      base_key,
      teacher,
      config,
      optimizer,
      loss_settings,
    )

  def validate(params):
    total, count = 0.0, 0.0
    for b in eval_batches:
      total_b, count_b = eval_step(params, b.inputs, b.targets, config)
      total += float(total_b)
      count += float(count_b)
    return {'validation_loss': total / max(count, 1.0)}

  def export(params):
    path = os.path.join(s.model_dir, MODEL_DIR)
    export_model(params, config, vocabulary, path, s.save_dtype)
    return path

  loop, model_path = job.finish(
    s,
    job.Job(
      name='train',
      intro=(
        f'{common.num_params(state.params):,} parameters; '
        f'{train_data.num_examples} train examples ({train_data.dropped} '
        'over the largest bucket dropped), '
        f'{train_data.batches_per_epoch} batches/epoch'
      ),
      intro_tail=(
        (' (distilling from ' + s.teacher_path + ')' if s.teacher_path else '')
        + (
          ' (initialized from ' + s.init_from + ')'
          if s.init_from and not resumed
          else ''
        )
      ),
      batch=train_data.batch,
      train_step=step,
      validate=validate,
      log_fields=lambda aux: {'nll': float(aux['nll'])},
      postfix=_postfix,
      batch_tokens=lambda b: (
        np.count_nonzero(b.targets) + np.count_nonzero(b.inputs)
      ),
      export=export,
      summary=_summary,
      product='model',
    ),
    state,
    resumed,
  )
  return TrainResult(
    int(loop.state.step),
    loop.train_loss,
    loop.validation['validation_loss'],
    loop.stopped,
    model_path,
  )


def _postfix(record, validation):
  val = '-' if validation is None else f'{validation["validation_loss"]:.3f}'
  return {'tok_s': f'{record["tokens_per_s"]:.0f}', 'val': val}


def _summary(loop: common.LoopResult) -> str:
  loss = loop.train_loss
  return (
    f', train loss {loss if loss is None else round(loss, 4)}, '
    f'validation loss {loop.validation["validation_loss"]:.4f}'
  )


def _vocabulary(settings: TrainSettings) -> vocab_lib.Vocabulary:
  """The run's vocabulary, checked against `model_config`."""
  vocabulary = (
    vocab_lib.Vocabulary.from_file(paths.resolve(settings.vocabulary_file))
    if settings.vocabulary_file
    else None
  )
  vocab_size = settings.model_config.vocab_size
  if vocabulary is not None and vocabulary.vocab_size > vocab_size:
    raise ValueError(
      f'vocabulary has {vocabulary.vocab_size} ids, model_config.vocab_size '
      f'is {vocab_size}'
    )
  if vocabulary is None:
    raise ValueError('train needs vocabulary_file (a sentencepiece model)')
  return vocabulary


def _init_model(
  settings: TrainSettings, vocabulary: vocab_lib.Vocabulary
) -> t5_model.Model:
  """The `init_from` model, checked against the vocabulary and shapes."""
  init_from = settings.init_from
  init_model = t5_model.Model.load(paths.resolve(init_from), dtype='float32')
  vocab_lib.check_compatible(init_model.vocabulary, vocabulary)
  want = jax.eval_shape(
    lambda: (
      t5_model.Model.init(
        settings.model_config.replace(param_dtype=jnp.float32),
        seed=settings.seed,
      ).params
    )
  )
  got = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), init_model.params
  )
  if jax.tree.structure(want) != jax.tree.structure(got) or any(
    a.shape != b.shape
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True)
  ):
    raise ValueError(
      f'init_from {init_from!r}: its parameters do not have the shapes of '
      'model_config (a different network)'
    )
  return init_model


def _teacher(
  settings: TrainSettings, vocabulary: vocab_lib.Vocabulary
) -> tuple[t5_model.Model | None, LossSettings]:
  """The frozen teacher (None without `teacher_path`) and the loss."""
  s = settings
  loss_settings = LossSettings(
    s.label_smoothing, s.z_loss, 0.0, s.distill_temperature
  )
  if not s.teacher_path:
    return None, loss_settings
  teacher = t5_model.Model.load(paths.resolve(s.teacher_path), dtype='float32')
  vocab_lib.check_compatible(teacher.vocabulary, vocabulary)
  if teacher.config.vocab_size != s.model_config.vocab_size:
    raise ValueError(
      f'teacher vocab_size {teacher.config.vocab_size} != '
      f'{s.model_config.vocab_size}'
    )
  teacher = t5_model.Model(
    teacher.config.replace(dropout_rate=0.0),
    jax.tree.map(jnp.asarray, teacher.params),
  )
  return teacher, dataclasses.replace(
    loss_settings, distill_weight=s.distill_weight
  )


def _teacher_greedy_examples(
  teacher: t5_model.Model,
  examples: list[tuple[np.ndarray, np.ndarray]],
  buckets: Sequence[Sequence[int]],
  model_dir: str,
  progress: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
  """The train inputs with the teacher's greedy outputs as targets."""
  spec = common.make_buckets(buckets)
  # Rows per decode: the largest bucket's batch times 4 (decoding holds no
  # gradients), at most 512.
  batch_size = min(512, 4 * max(b.batch_size for b in spec))
  inputs = [x for x, _ in examples]
  outputs = greedy.greedy_outputs(
    teacher,
    inputs,
    sorted({b.input_len for b in spec}),
    max(b.target_len for b in spec),
    batch_size,
    os.path.join(model_dir, 'teacher_greedy.npz'),
    progress,
  )
  return [(x, y) for x, y in zip(inputs, outputs, strict=True) if y is not None]


def export_model(
  params,
  config: T5Config,
  vocabulary: vocab_lib.Vocabulary | None,
  path: str,
  save_dtype: Any = None,
) -> t5_model.Model:
  """Writes `Model.save` format to `path` (replacing it), as `save_dtype`."""
  dtype = jnp.dtype(save_dtype or config.param_dtype)
  config = config.replace(param_dtype=dtype, dropout_rate=0.0)
  params = jax.tree.map(lambda x: np.asarray(x).astype(dtype), params)
  model = t5_model.Model(config, params, vocabulary)
  common.replace_dir(path, model.save)
  return model

"""`spec-decode train`: trains a T5 `Model` on a task with optax.

Configured with gin the way T5X's `lm.py` is: the library functions below
carry no gin decorators; `main` parses `--gin_file`s and `--gin.NAME=VALUE`
bindings and calls the gin-configured `train` (dynamic registration, so a
config binds `lm.train.<arg>` after `from spec_decode.train import lm`).

    spec-decode train --gin_file=configs/train_demo_target.gin \
        --model_dir=runs/demo/target [--gin.train.train.train_steps=2000]

A config that binds `train_heads.train_heads` instead (e.g.
`configs/train_demo_heads.gin`) trains Medusa heads on a frozen target with
the same flags; see `spec_decode.train.heads`.

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
"""

import argparse
import dataclasses
import importlib
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from spec_decode.data import tasks as tasks_lib
from spec_decode.models import t5_model
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.config import PAD_ID
from spec_decode.t5.config import T5Config

CHECKPOINT_DIR = 'checkpoints'
MODEL_DIR = 'model'
LOG_FILE = 'train_log.jsonl'
CONFIG_FILE = 'config.gin'

# (input_len, target_len, batch_size): about 2k tokens a side per batch.
DEFAULT_BUCKETS = ((32, 32, 64), (64, 64, 32), (128, 128, 16))


# ----------------------------------------------------------------- data.


@dataclasses.dataclass(frozen=True)
class Bucket:
  """A fixed batch shape: `[batch_size, input_len]`, `[.., target_len]`."""

  input_len: int
  target_len: int
  batch_size: int


def _buckets(spec: Iterable[Sequence[int]]) -> tuple[Bucket, ...]:
  out = tuple(Bucket(*map(int, b)) for b in spec)
  if not out:
    raise ValueError('at least one bucket is needed')
  return tuple(sorted(out, key=lambda b: (b.input_len, b.target_len)))


def tokenize_split(
  task: tasks_lib.Task | str,
  split: str,
  vocabulary: vocab_lib.Vocabulary,
  limit: int | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
  """`(inputs, targets)` token arrays of a split, each ending with EOS."""
  out = []
  for ex in tasks_lib.examples(task, split, limit):
    inputs = vocabulary.encode(ex['inputs']) + [vocabulary.eos_id]
    targets = vocabulary.encode(ex['targets']) + [vocabulary.eos_id]
    out.append((np.asarray(inputs, np.int32), np.asarray(targets, np.int32)))
  return out


@dataclasses.dataclass(frozen=True)
class Batch:
  """A padded batch.

  Attributes:
    inputs: encoder tokens `[B, S] int32`, 0-padded.
    targets: decoder targets `[B, T] int32`, EOS-terminated, 0-padded; an
      all-zero row is padding (weight 0).
  """

  inputs: np.ndarray
  targets: np.ndarray


class BucketedData:
  """Examples grouped into fixed-shape length buckets.

  The batches of one pass over the data (an epoch) are the per-bucket
  chunks of a seeded shuffle, in a seeded order; `batch(step)` is a pure
  function of `(seed, step)`.
  """

  def __init__(
    self,
    examples: Sequence[tuple[np.ndarray, np.ndarray]],
    buckets: Iterable[Sequence[int]],
    seed: int = 0,
  ):
    self.buckets = _buckets(buckets)
    self.seed = seed
    self._examples = examples
    members = [[] for _ in self.buckets]
    self.dropped = 0
    for i, (inp, tgt) in enumerate(examples):
      for k, b in enumerate(self.buckets):
        if len(inp) <= b.input_len and len(tgt) <= b.target_len:
          members[k].append(i)
          break
      else:
        self.dropped += 1
    self._members = [np.asarray(m, np.int64) for m in members]
    self.num_examples = sum(len(m) for m in self._members)
    if not self.num_examples:
      raise ValueError('no example fits the largest bucket')
    self.batches_per_epoch = sum(
      math.ceil(len(m) / b.batch_size)
      for m, b in zip(self._members, self.buckets, strict=True)
    )
    self._epoch_cache: tuple[int, list[tuple[int, np.ndarray]]] | None = None

  def _epoch(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    if self._epoch_cache is not None and self._epoch_cache[0] == epoch:
      return self._epoch_cache[1]
    rng = np.random.default_rng([self.seed, epoch])
    batches = []
    for k, (m, b) in enumerate(zip(self._members, self.buckets, strict=True)):
      order = m[rng.permutation(len(m))]
      for start in range(0, len(order), b.batch_size):
        batches.append((k, order[start : start + b.batch_size]))
    batches = [batches[i] for i in rng.permutation(len(batches))]
    self._epoch_cache = (epoch, batches)
    return batches

  def make_batch(self, bucket: int, indices: Sequence[int]) -> Batch:
    b = self.buckets[bucket]
    inputs = np.zeros((b.batch_size, b.input_len), np.int32)
    targets = np.zeros((b.batch_size, b.target_len), np.int32)
    for row, i in enumerate(indices):
      inp, tgt = self._examples[i]
      inputs[row, : len(inp)] = inp
      targets[row, : len(tgt)] = tgt
    return Batch(inputs, targets)

  def batch(self, step: int) -> Batch:
    """The training batch of `step` (0-based)."""
    epoch, i = divmod(step, self.batches_per_epoch)
    return self.make_batch(*self._epoch(epoch)[i])

  def all_batches(self) -> list[Batch]:
    """Every example once, in order (for validation)."""
    out = []
    for k, (m, b) in enumerate(zip(self._members, self.buckets, strict=True)):
      for start in range(0, len(m), b.batch_size):
        out.append(self.make_batch(k, m[start : start + b.batch_size]))
    return out


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


def kl_to_teacher(
  logits: jax.Array, teacher_logits: jax.Array, temperature: float = 1.0
) -> jax.Array:
  """Per-token `KL(teacher || student)` at `temperature`, `[B, T]`."""
  t_logp = jax.nn.log_softmax(teacher_logits / temperature, axis=-1)
  s_logp = jax.nn.log_softmax(logits / temperature, axis=-1)
  return jnp.sum(jnp.exp(t_logp) * (t_logp - s_logp), axis=-1)


# ---------------------------------------------------------- train state.


@flax.struct.dataclass
class TrainState:
  """What a checkpoint holds.

  Attributes:
    step: `[] int32`, optimizer steps taken.
    params: the parameter tree (float32).
    opt_state: the optax state.
  """

  step: jax.Array
  params: Any
  opt_state: Any


def make_optimizer(
  learning_rate: float,
  train_steps: int,
  warmup_steps: int,
  final_lr_fraction: float = 0.1,
  weight_decay: float = 0.01,
  b2: float = 0.98,
  clip_norm: float = 1.0,
) -> optax.GradientTransformation:
  """AdamW with linear warmup and cosine decay to `final_lr_fraction`."""
  warmup_steps = max(1, min(warmup_steps, train_steps - 1))
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=learning_rate,
    warmup_steps=warmup_steps,
    decay_steps=max(train_steps, warmup_steps + 1),
    end_value=learning_rate * final_lr_fraction,
  )
  return optax.chain(
    optax.clip_by_global_norm(clip_norm),
    optax.adamw(schedule, b1=0.9, b2=b2, weight_decay=weight_decay),
  )


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
    kl = kl_to_teacher(logits, t_logits, settings.distill_temperature)
    w = settings.distill_weight
    per_token = (1.0 - w) * ce + w * settings.distill_temperature**2 * kl
  denom = jnp.maximum(weights.sum(), 1.0)
  loss = jnp.sum(per_token * weights) / denom
  # Plain cross-entropy (no smoothing, no z-loss), for reporting.
  nll = cross_entropy(logits, batch_targets)
  return loss, {'nll': jnp.sum(nll * weights) / denom, 'tokens': weights.sum()}


def _train_step(
  state: TrainState,
  inputs,
  targets,
  base_key,
  teacher,
  config: T5Config,
  optimizer,
  settings: LossSettings,
):
  key = jax.random.fold_in(base_key, state.step)
  grad_fn = jax.value_and_grad(_loss, has_aux=True)
  (loss, aux), grads = grad_fn(
    state.params, config, inputs, targets, key, teacher, settings, False
  )
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  new_state = TrainState(
    step=state.step + 1, params=params, opt_state=opt_state
  )
  return new_state, dict(aux, loss=loss, grad_norm=optax.tree.norm(grads))


def _eval_step(params, inputs, targets, config: T5Config):
  _, aux = _loss(
    params, config, inputs, targets, None, None, LossSettings(), True
  )
  return aux['nll'] * aux['tokens'], aux['tokens']


# ----------------------------------------------------------- checkpoints.


def _manager(model_dir: str, keep: int):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  return ocp.CheckpointManager(
    os.path.abspath(os.path.join(model_dir, CHECKPOINT_DIR)),
    options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
  )


def _save(manager, state: TrainState) -> None:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  step = int(state.step)
  if manager.latest_step() == step:
    return
  manager.save(step, args=ocp.args.StandardSave(state), force=True)
  manager.wait_until_finished()


def restore_state(model_dir: str, abstract: TrainState) -> TrainState | None:
  """The latest checkpointed `TrainState` of `model_dir`, or None."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  if not os.path.isdir(os.path.join(model_dir, CHECKPOINT_DIR)):
    return None
  manager = _manager(model_dir, keep=1000)
  try:
    step = manager.latest_step()
    if step is None:
      return None
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract)
    return manager.restore(step, args=ocp.args.StandardRestore(target))
  finally:
    manager.close()


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
  tmp = path.rstrip('/') + '.tmp'
  shutil.rmtree(tmp, ignore_errors=True)
  model.save(tmp)
  shutil.rmtree(path, ignore_errors=True)
  os.replace(tmp, path)
  return model


# ------------------------------------------------------------ the run.


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


def _log(model_dir: str, record: dict[str, Any]) -> None:
  with open(os.path.join(model_dir, LOG_FILE), 'a') as f:
    f.write(json.dumps(record, sort_keys=True) + '\n')


class _Interrupt:
  """Turns SIGTERM into KeyboardInterrupt while training."""

  def __enter__(self):
    try:
      self._old = signal.signal(signal.SIGTERM, self._raise)
    except ValueError:  # Not the main thread.
      self._old = None
    return self

  @staticmethod
  def _raise(signum, frame):
    del signum, frame
    raise KeyboardInterrupt

  def __exit__(self, *exc):
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)
    return False


def train(
  model_dir: str,
  model_config: T5Config,
  vocabulary_file: str | None = None,
  task: str = 'debian_ende',
  data_dir: str | None = None,
  train_steps: int = 1000,
  buckets: Sequence[Sequence[int]] = DEFAULT_BUCKETS,
  learning_rate: float = 1e-3,
  warmup_steps: int = 200,
  final_lr_fraction: float = 0.1,
  weight_decay: float = 0.01,
  clip_norm: float = 1.0,
  label_smoothing: float = 0.0,
  z_loss: float = 1e-4,
  teacher_path: str | None = None,
  distill_weight: float = 1.0,
  distill_temperature: float = 1.0,
  eval_every: int = 200,
  eval_examples: int = 256,
  checkpoint_every: int = 200,
  keep_checkpoints: int = 2,
  log_every: int = 10,
  max_minutes: float | None = None,
  save_dtype: Any = 'float32',
  train_examples: int | None = None,
  seed: int = 0,
  progress: bool = True,
) -> TrainResult:
  """Trains (or resumes training) a T5 model; see the module docstring.

  Args:
    model_dir: where checkpoints, the log and the exported model go.
    model_config: the network; `vocab_size` must cover the vocabulary.
    vocabulary_file: a sentencepiece `.model` (T5 ids, 100 extra ids); None
      for a byte-free test run is not allowed for text tasks.
    task: a `tasks.task_names()` name.
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
    teacher_path: a `Model.load` path; when set, the loss mixes in the KL to
      the teacher's soft targets (the teacher must share the vocabulary).
    distill_weight: weight `w` of the KL term (1.0: pure distillation).
    distill_temperature: softmax temperature of the soft targets.
    eval_every: steps between validation losses (0: only at the end).
    eval_examples: validation examples scored.
    checkpoint_every: steps between checkpoints.
    keep_checkpoints: checkpoints kept on disk.
    log_every: steps between log records and bar updates.
    max_minutes: wall-clock budget of this invocation; on expiry the run
      checkpoints and exits (rerun to continue).
    save_dtype: storage dtype of the exported model's parameters.
    train_examples: use only the first N training examples.
    seed: initialization, data order and dropout seed.
    progress: show the tqdm bar.

  Returns:
    A `TrainResult`.
  """
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

  os.makedirs(model_dir, exist_ok=True)
  vocabulary = (
    vocab_lib.Vocabulary.from_file(vocabulary_file) if vocabulary_file else None
  )
  if vocabulary is not None and vocabulary.vocab_size > model_config.vocab_size:
    raise ValueError(
      f'vocabulary has {vocabulary.vocab_size} ids, model_config.vocab_size '
      f'is {model_config.vocab_size}'
    )
  if vocabulary is None:
    raise ValueError('train needs vocabulary_file (a sentencepiece model)')
  task_obj = tasks_lib.get_task(task, data_dir)
  train_data = BucketedData(
    tokenize_split(task_obj, 'train', vocabulary, train_examples), buckets, seed
  )
  eval_data = BucketedData(
    tokenize_split(task_obj, 'validation', vocabulary, eval_examples),
    buckets,
    seed,
  )
  eval_batches = eval_data.all_batches()

  teacher = None
  settings = LossSettings(label_smoothing, z_loss, 0.0, distill_temperature)
  if teacher_path:
    teacher = t5_model.Model.load(teacher_path, dtype='float32')
    vocab_lib.check_compatible(teacher.vocabulary, vocabulary)
    if teacher.config.vocab_size != model_config.vocab_size:
      raise ValueError(
        f'teacher vocab_size {teacher.config.vocab_size} != '
        f'{model_config.vocab_size}'
      )
    teacher = t5_model.Model(
      teacher.config.replace(dropout_rate=0.0),
      jax.tree.map(jnp.asarray, teacher.params),
    )
    settings = dataclasses.replace(settings, distill_weight=distill_weight)

  config = model_config.replace(param_dtype=jnp.float32)
  optimizer = make_optimizer(
    learning_rate,
    train_steps,
    warmup_steps,
    final_lr_fraction,
    weight_decay,
    clip_norm=clip_norm,
  )

  def init_state():
    params = t5_model.Model.init(config, seed=seed).params
    return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=optimizer.init(params),
    )

  abstract = jax.eval_shape(init_state)
  state = restore_state(model_dir, abstract)
  resumed = state is not None
  if state is None:
    state = init_state()
  start = int(state.step)
  base_key = jax.random.fold_in(jax.random.key(seed), 1)

  train_step = jax.jit(
    _train_step, static_argnums=(5, 6, 7), donate_argnums=(0,)
  )
  eval_step = jax.jit(_eval_step, static_argnums=(3,))

  def validation_loss(params):
    total, count = 0.0, 0.0
    for b in eval_batches:
      s, n = eval_step(params, b.inputs, b.targets, config)
      total += float(s)
      count += float(n)
    return total / max(count, 1.0)

  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  print(
    f'train: {n_params:,} parameters; {train_data.num_examples} train '
    f'examples ({train_data.dropped} over the largest bucket dropped), '
    f'{train_data.batches_per_epoch} batches/epoch; '
    f'{"resuming at" if resumed else "starting at"} step {start} of '
    f'{train_steps}'
    + (' (distilling from ' + teacher_path + ')' if teacher_path else ''),
    flush=True,
  )
  manager = _manager(model_dir, keep_checkpoints)
  model_path = os.path.join(model_dir, MODEL_DIR)
  deadline = (time.monotonic() + 60.0 * max_minutes) if max_minutes else None
  stopped = 'done'
  last_loss = last_val = last_val_step = None
  bar = tqdm.tqdm(
    total=train_steps,
    initial=start,
    disable=not progress,
    unit='step',
    dynamic_ncols=True,
    desc='train',
  )
  tokens_acc, time_acc, loss_acc, n_acc = 0.0, 0.0, 0.0, 0
  step = start
  try:
    with _Interrupt():
      while step < train_steps:
        batch = train_data.batch(step)
        t0 = time.perf_counter()
        state, aux = train_step(
          state,
          batch.inputs,
          batch.targets,
          base_key,
          teacher,
          config,
          optimizer,
          settings,
        )
        loss = float(aux['loss'])
        dt = time.perf_counter() - t0
        step += 1
        if not math.isfinite(loss):
          raise FloatingPointError(f'loss is {loss} at step {step}')
        tokens_acc += float(
          np.count_nonzero(batch.targets) + np.count_nonzero(batch.inputs)
        )
        time_acc += dt
        loss_acc += loss
        n_acc += 1
        bar.update(1)
        if step % log_every == 0 or step == train_steps:
          last_loss = loss_acc / n_acc
          record = {
            'step': step,
            'loss': last_loss,
            'nll': float(aux['nll']),
            'grad_norm': float(aux['grad_norm']),
            'tokens_per_s': tokens_acc / max(time_acc, 1e-9),
            'time': time.time(),
          }
          if eval_every and step % eval_every == 0:
            last_val = validation_loss(state.params)
            last_val_step = step
            record['validation_loss'] = last_val
          _log(model_dir, record)
          bar.set_postfix(
            loss=f'{last_loss:.3f}',
            tok_s=f'{record["tokens_per_s"]:.0f}',
            val='-' if last_val is None else f'{last_val:.3f}',
          )
          tokens_acc, time_acc, loss_acc, n_acc = 0.0, 0.0, 0.0, 0
        if step % checkpoint_every == 0:
          _save(manager, state)
        if deadline is not None and time.monotonic() > deadline:
          print(
            f'\ntrain: max_minutes={max_minutes} reached at step '
            f'{step}; checkpointing (rerun to continue)',
            flush=True,
          )
          stopped = 'time'
          break
  except KeyboardInterrupt:
    stopped = 'interrupted'
    print(
      f'\ntrain: interrupted at step {int(state.step)}; checkpointing',
      flush=True,
    )
  finally:
    bar.close()
  _save(manager, state)
  manager.close()
  if last_val_step != int(state.step):
    last_val = validation_loss(state.params)
    _log(
      model_dir,
      {
        'step': int(state.step),
        'validation_loss': last_val,
        'time': time.time(),
      },
    )
  export_model(state.params, config, vocabulary, model_path, save_dtype)
  print(
    f'train: step {int(state.step)}, train loss '
    f'{last_loss if last_loss is None else round(last_loss, 4)}, '
    f'validation loss {last_val:.4f}; model in {model_path}',
    flush=True,
  )
  return TrainResult(int(state.step), last_loss, last_val, stopped, model_path)


# ------------------------------------------------------------ gin / CLI.


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
  """Parses gin files (paths, or relative to `gin/` or `configs/`)."""
  import gin  # pylint: disable=g-import-not-at-top
  from spec_decode.checkpoints import gin_model  # pylint: disable=g-import-not-at-top

  root = os.path.dirname(gin_model.GIN_DIR)
  configs_dir = os.path.join(root, 'configs')
  # Ours first: gin logs an error for every search prefix that misses.
  prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
  for d in (configs_dir, gin_model.GIN_DIR):
    if d in prefixes:
      prefixes.remove(d)
    prefixes.insert(0, d)
  files = []
  for f in gin_files:
    for candidate in (
      f,
      os.path.join(root, f),
      os.path.join(configs_dir, f),
      os.path.join(gin_model.GIN_DIR, f),
    ):
      if os.path.isfile(candidate):
        files.append(os.path.abspath(candidate))
        break
    else:
      raise FileNotFoundError(f'gin file not found: {f}')
  gin.parse_config_files_and_bindings(
    files, list(bindings), finalize_config=False
  )


def split_gin_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Separates `--gin.NAME=VALUE` flags (as bindings) from the others."""
  bindings, rest = [], []
  it = iter(argv)
  for arg in it:
    if arg.startswith('--gin.'):
      body = arg[len('--gin.') :]
      if '=' not in body:
        body = f'{body}={next(it)}'
      name, value = body.split('=', 1)
      bindings.append(f'{name} = {value}')
    else:
      rest.append(arg)
  return bindings, rest


def main(argv: list[str] | None = None) -> int:
  """`spec-decode train --gin_file=F [--gin.NAME=VALUE ...] --model_dir=D`."""
  import gin  # pylint: disable=g-import-not-at-top

  argv = list(sys.argv[1:] if argv is None else argv)
  bindings, rest = split_gin_args(argv)
  parser = argparse.ArgumentParser(
    prog='spec-decode train',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
    '--gin_file',
    action='append',
    default=[],
    help='gin config file (repeatable)',
  )
  parser.add_argument(
    '--gin_bindings',
    action='append',
    default=[],
    help='a gin binding NAME=VALUE (repeatable); same as --gin.NAME=VALUE',
  )
  parser.add_argument(
    '--model_dir', default=None, help='output directory (overrides MODEL_DIR)'
  )
  args = parser.parse_args(rest)
  if not args.gin_file:
    parser.error('--gin_file is required (e.g. configs/train_demo_target.gin)')
  bindings = list(args.gin_bindings) + bindings
  if args.model_dir:
    bindings.append(f'MODEL_DIR = {args.model_dir!r}')
  parse_gin(args.gin_file, bindings)
  # The module's own `train` (not `__main__.train` under `python -m`); a
  # config binding `train_heads.train_heads` trains Medusa heads instead.
  heads = importlib.import_module('spec_decode.train.heads')
  if heads.gin_binds_heads():
    train_using_gin = gin.get_configurable(heads.train_heads)
  else:
    train_using_gin = gin.get_configurable(
      importlib.import_module('spec_decode.train.lm').train
    )
  model_dir = _macro('MODEL_DIR')
  if isinstance(model_dir, str):
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, CONFIG_FILE), 'w') as f:
      f.write(gin.config_str())
  result = train_using_gin()
  return 130 if result.stopped == 'interrupted' else 0


def _macro(name: str) -> Any:
  import gin  # pylint: disable=g-import-not-at-top

  try:
    return gin.query_parameter(f'%{name}')
  except ValueError:
    return None


if __name__ == '__main__':
  raise SystemExit(main())

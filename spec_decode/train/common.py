"""What LM training (`lm.py`) and Medusa-heads training (`heads.py`) share.

* data: tokenized `(inputs, targets)` examples grouped into fixed-shape
  length buckets (`BucketedData`); the batch of step `s` depends only on
  `(seed, s)`, so a resumed run sees the same batches as an uninterrupted
  one.
* the optimizer (AdamW, linear warmup, cosine decay, global-norm clip),
  the checkpointed `TrainState` and one optimizer step
  (`apply_gradients`).
* orbax checkpoints of `{step, params, opt_state}` under
  `<model_dir>/checkpoints/`, the JSON-lines log
  `<model_dir>/train_log.jsonl`, SIGTERM turned into Ctrl-C.
* `train_loop`, the loop both run with their own batches, train step and
  validation: a tqdm bar, a log record every `log_every` steps,
  validation every `eval_every` steps and at the end, a checkpoint every
  `checkpoint_every` steps and on exit (done, Ctrl-C, SIGTERM or the
  `max_minutes` budget).
"""

import dataclasses
import json
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from spec_decode.data import tasks as tasks_lib
from spec_decode.t5 import vocab as vocab_lib

CHECKPOINT_DIR = 'checkpoints'
LOG_FILE = 'train_log.jsonl'


# ----------------------------------------------------------------- data.


@dataclasses.dataclass(frozen=True)
class Bucket:
  """A fixed batch shape: `[batch_size, input_len]`, `[.., target_len]`."""

  input_len: int
  target_len: int
  batch_size: int


def make_buckets(spec: Iterable[Sequence[int]]) -> tuple[Bucket, ...]:
  """`(input_len, target_len, batch_size)` triples -> sorted `Bucket`s."""
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

  Attributes:
    buckets: the sorted `Bucket`s.
    examples: the `(inputs, targets)` examples, as given.
    num_examples: examples that fit a bucket.
    dropped: examples longer than the largest bucket (never batched).
    batches_per_epoch: batches of one pass over the data.
  """

  def __init__(
    self,
    examples: Sequence[tuple[np.ndarray, np.ndarray]],
    buckets: Iterable[Sequence[int]],
    seed: int = 0,
  ):
    self.buckets = make_buckets(buckets)
    self.seed = seed
    self.examples = examples
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

  def step_indices(self, step: int) -> tuple[int, np.ndarray]:
    """`(bucket, example indices)` of the training batch of `step`."""
    epoch, i = divmod(step, self.batches_per_epoch)
    return self._epoch(epoch)[i]

  def chunks(self) -> list[tuple[int, np.ndarray]]:
    """`(bucket, example indices)` covering every example once, in order."""
    return [
      (k, m[start : start + b.batch_size])
      for k, (m, b) in enumerate(zip(self._members, self.buckets, strict=True))
      for start in range(0, len(m), b.batch_size)
    ]

  def make_batch(self, bucket: int, indices: Sequence[int]) -> Batch:
    b = self.buckets[bucket]
    inputs = np.zeros((b.batch_size, b.input_len), np.int32)
    targets = np.zeros((b.batch_size, b.target_len), np.int32)
    for row, i in enumerate(indices):
      inp, tgt = self.examples[i]
      inputs[row, : len(inp)] = inp
      targets[row, : len(tgt)] = tgt
    return Batch(inputs, targets)

  def batch(self, step: int) -> Batch:
    """The training batch of `step` (0-based)."""
    return self.make_batch(*self.step_indices(step))

  def all_batches(self) -> list[Batch]:
    """Every example once, in order (for validation)."""
    return [self.make_batch(k, idx) for k, idx in self.chunks()]


# ----------------------------------------------------------------- loss.


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


def apply_gradients(
  state: TrainState,
  optimizer: optax.GradientTransformation,
  loss_fn: Callable[[Any], tuple[jax.Array, dict[str, Any]]],
) -> tuple[TrainState, dict[str, Any]]:
  """One optimizer step on `loss_fn(params) -> (loss, aux)`.

  Returns:
    The new state and `aux` plus `loss` and `grad_norm`.
  """
  (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  new_state = TrainState(
    step=state.step + 1, params=params, opt_state=opt_state
  )
  return new_state, dict(aux, loss=loss, grad_norm=optax.tree.norm(grads))


def num_params(tree: Any) -> int:
  """Scalars in a parameter tree."""
  return sum(x.size for x in jax.tree.leaves(tree))


# ----------------------------------------------------------- checkpoints.


def checkpoint_manager(model_dir: str, keep: int):
  """An orbax `CheckpointManager` of `<model_dir>/checkpoints`."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  return ocp.CheckpointManager(
    os.path.abspath(os.path.join(model_dir, CHECKPOINT_DIR)),
    options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
  )


def save_checkpoint(manager, state: TrainState) -> None:
  """Checkpoints `state` (once per step) and waits until it is written."""
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
  manager = checkpoint_manager(model_dir, keep=1000)
  try:
    step = manager.latest_step()
    if step is None:
      return None
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract)
    return manager.restore(step, args=ocp.args.StandardRestore(target))
  finally:
    manager.close()


def init_or_restore(
  model_dir: str,
  init_params: Callable[[], Any],
  optimizer: optax.GradientTransformation,
) -> tuple[TrainState, bool]:
  """The latest checkpointed state of `model_dir`, else a fresh one.

  Args:
    model_dir: the run's directory.
    init_params: makes the initial parameters (also traced abstractly for
      the checkpoint's shapes).
    optimizer: initializes `opt_state`.

  Returns:
    The state and whether it was restored.
  """

  def init_state():
    params = init_params()
    return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=optimizer.init(params),
    )

  state = restore_state(model_dir, jax.eval_shape(init_state))
  if state is None:
    return init_state(), False
  return state, True


def replace_dir(path: str, write: Callable[[str], None]) -> None:
  """Calls `write(tmp)` next to `path`, then moves `tmp` over `path`."""
  tmp = path.rstrip('/') + '.tmp'
  shutil.rmtree(tmp, ignore_errors=True)
  write(tmp)
  shutil.rmtree(path, ignore_errors=True)
  os.replace(tmp, path)


# ------------------------------------------------------------- the loop.


def append_log(model_dir: str, record: dict[str, Any]) -> None:
  """Appends `record` as a JSON line to `<model_dir>/train_log.jsonl`."""
  with open(os.path.join(model_dir, LOG_FILE), 'a') as f:
    f.write(json.dumps(record, sort_keys=True) + '\n')


class SigtermAsInterrupt:
  """A context in which SIGTERM raises KeyboardInterrupt (main thread)."""

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


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """The knobs of `train_loop`.

  Attributes:
    train_steps: train until `state.step` reaches this.
    eval_every: steps between validations (0: only at the end).
    checkpoint_every: steps between checkpoints.
    keep_checkpoints: checkpoints kept on disk.
    log_every: steps between log records and bar updates.
    max_minutes: wall-clock budget of the loop (None: none); on expiry it
      checkpoints and stops (rerun to continue).
    progress: show the tqdm bar.
    deadline: a `time.time()` at which the loop stops as on `max_minutes`
      (None: none; whichever comes first): for a driver that gives several
      runs one budget and must see each run's model exported in time.
  """

  train_steps: int
  eval_every: int
  checkpoint_every: int
  keep_checkpoints: int
  log_every: int
  max_minutes: float | None
  progress: bool
  deadline: float | None = None


@dataclasses.dataclass
class LoopResult:
  """What `train_loop` returns.

  Attributes:
    state: the last `TrainState` (checkpointed).
    stopped: `done`, `interrupted` (Ctrl-C / SIGTERM) or `time`
      (`max_minutes` or `deadline`).
    train_loss: mean training loss of the last logged steps (None if none
      were logged).
    validation: the last `validate` fields, of the final state.
    seconds: time spent in the loop (the final checkpoint excluded).
  """

  state: TrainState
  stopped: str
  train_loss: float | None
  validation: dict[str, Any]
  seconds: float


def train_loop(
  state: TrainState,
  batch: Callable[[int], Any],
  train_step: Callable[[TrainState, Any], tuple[TrainState, dict[str, Any]]],
  validate: Callable[[Any], dict[str, Any]],
  model_dir: str,
  settings: LoopSettings,
  log_fields: Callable[[dict[str, Any]], dict[str, Any]],
  postfix: Callable[[dict[str, Any], dict[str, Any] | None], dict[str, str]],
  batch_tokens: Callable[[Any], float] | None = None,
  name: str = 'train',
) -> LoopResult:
  """Trains from `state.step` to `settings.train_steps`, then checkpoints.

  Each step runs `train_step(state, batch(step))`; its `aux` must hold
  `loss` and `grad_norm`. Every `log_every` steps (and at the last) a
  record `{step, loss, grad_norm, time, **log_fields(aux)}` goes to the
  log, plus `tokens_per_s` with `batch_tokens` and `validate(params)`'s
  fields every `eval_every` steps. The final state is checkpointed and
  validated (unless it just was) whatever stops the loop, except an error.

  Args:
    state: the state to continue from.
    batch: the training batch of a step (0-based).
    train_step: `(state, batch) -> (state, aux)`.
    validate: `params -> log fields` of the validation data.
    model_dir: where checkpoints and the log go.
    settings: the loop's knobs.
    log_fields: `aux -> log fields` of the last step.
    postfix: `(record, validation or None) -> progress-bar fields` (besides
      the loss).
    batch_tokens: tokens of a batch, for `tokens_per_s` (None: not logged).
    name: the job's name in messages (on the bar, `_` reads as a space).

  Returns:
    A `LoopResult`.
  """
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

  s = settings
  manager = checkpoint_manager(model_dir, s.keep_checkpoints)
  deadline = (
    (time.monotonic() + 60.0 * s.max_minutes) if s.max_minutes else None
  )
  if s.deadline is not None:  # Wall clock -> monotonic, the earlier wins.
    at = time.monotonic() + s.deadline - time.time()
    deadline = at if deadline is None else min(deadline, at)
  stopped = 'done'
  last_loss = last_val = last_val_step = None
  bar = tqdm.tqdm(
    total=s.train_steps,
    initial=int(state.step),
    disable=not s.progress,
    unit='step',
    dynamic_ncols=True,
    desc=name.replace('_', ' '),
  )
  tokens_acc, time_acc, loss_acc, n_acc = 0.0, 0.0, 0.0, 0
  step = int(state.step)
  t_start = time.monotonic()
  try:
    with SigtermAsInterrupt():
      while step < s.train_steps:
        inputs = batch(step)
        t0 = time.perf_counter()
        state, aux = train_step(state, inputs)
        loss = float(aux['loss'])
        dt = time.perf_counter() - t0
        step += 1
        if not math.isfinite(loss):
          raise FloatingPointError(f'loss is {loss} at step {step}')
        if batch_tokens is not None:
          tokens_acc += float(batch_tokens(inputs))
        time_acc += dt
        loss_acc += loss
        n_acc += 1
        bar.update(1)
        if step % s.log_every == 0 or step == s.train_steps:
          last_loss = loss_acc / n_acc
          record = {
            'step': step,
            'loss': last_loss,
            **log_fields(aux),
            'grad_norm': float(aux['grad_norm']),
            'time': time.time(),
          }
          if batch_tokens is not None:
            record['tokens_per_s'] = tokens_acc / max(time_acc, 1e-9)
          if s.eval_every and step % s.eval_every == 0:
            last_val = validate(state.params)
            last_val_step = step
            record.update(last_val)
          append_log(model_dir, record)
          bar.set_postfix(loss=f'{last_loss:.3f}', **postfix(record, last_val))
          tokens_acc, time_acc, loss_acc, n_acc = 0.0, 0.0, 0.0, 0
        if step % s.checkpoint_every == 0:
          save_checkpoint(manager, state)
        if deadline is not None and time.monotonic() > deadline:
          budget = (
            f'max_minutes={s.max_minutes}'
            if s.deadline is None or s.deadline > time.time()
            else 'the deadline'
          )
          print(
            f'\n{name}: {budget} reached at step {step}; checkpointing '
            '(rerun to continue)',
            flush=True,
          )
          stopped = 'time'
          break
  except KeyboardInterrupt:
    stopped = 'interrupted'
    print(
      f'\n{name}: interrupted at step {int(state.step)}; checkpointing',
      flush=True,
    )
  finally:
    bar.close()
  seconds = time.monotonic() - t_start
  save_checkpoint(manager, state)
  manager.close()
  if last_val_step != int(state.step):
    last_val = validate(state.params)
    append_log(
      model_dir, {'step': int(state.step), **last_val, 'time': time.time()}
    )
  return LoopResult(state, stopped, last_loss, last_val, seconds)

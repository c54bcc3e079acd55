"""Trains Medusa heads (`drafters.Heads`) on a frozen target.

Run through `spec-decode train`: a gin file that binds
`heads.train_heads` (after `from spec_decode.train import heads`)
makes `spec-decode train` call this module's `train_heads` instead of
`train.train`; the flags are the same.

    spec-decode train --gin_file=configs/train_demo_heads.gin \\
        --model_dir=runs/demo/heads [--gin.TRAIN_STEPS=600]

What a run does:
  * loads the frozen target (`target_path`, any `Model.load` path);
  * the training data is the target's own greedy outputs on the task's
    train inputs (and, for validation, on validation inputs), decoded in
    fixed-shape batches with plain decoding and cached in
    `<model_dir>/greedy_<split>.npz`, written every few batches, so an
    interrupted or resumed run continues where it stopped and never decodes
    an input twice;
  * the target is teacher-forced once over those outputs for its final
    hidden states `h_t` (input t), kept in memory (recomputed on resume);
    head k learns to predict output token `t + 1 + k` from `h_t` by
    cross-entropy, optionally mixed with the KL to the target's own
    distribution of that token (`distill_weight`; padding and everything
    after EOS masked), weighted by `head_decay^(k-1)`;
  * AdamW with warmup and cosine decay (`train.make_optimizer`), a tqdm
    bar, validation per-head top-1 accuracy every `eval_every` steps, log
    records in `<model_dir>/train_log.jsonl`, orbax checkpoints of
    `{step, params, opt_state}` under `<model_dir>/checkpoints/` (rerunning
    resumes; Ctrl-C, SIGTERM or `max_minutes` checkpoint before exiting);
  * at the end the heads are exported with `Heads.save` to
    `<model_dir>/heads`.

Head k's validation accuracy is the fraction of (teacher-forced) positions
where its argmax equals the target's greedy token k steps after the next
one: under greedy decoding, how often its proposal would survive if every
token before it did.
"""

import dataclasses
import json
import math
import os
import shutil
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spec_decode.core import generation
from spec_decode.data import tasks as tasks_lib
from spec_decode.drafters import heads as heads_lib
from spec_decode.models import t5_model
from spec_decode.t5.config import PAD_ID
from spec_decode.train import lm as train_lib

HEADS_DIR = 'heads'
GREEDY_FILE = 'greedy_{split}.npz'

# (input_len, target_len, batch_size); the largest target_len must be at
# least max_decode_len. Train steps see only `[batch_size, target_len]`
# (about 1k positions each); input_len matters for decoding and features.
DEFAULT_BUCKETS = (
  (32, 16, 64),
  (32, 32, 32),
  (32, 64, 16),
  (64, 32, 32),
  (64, 64, 16),
  (96, 32, 32),
  (96, 64, 16),
)


# ------------------------------------------------------------ greedy data.


def greedy_outputs(
  target: t5_model.Model,
  inputs: Sequence[np.ndarray],
  input_lens: Sequence[int],
  max_decode_len: int,
  batch_size: int,
  cache_file: str | None = None,
  progress: bool = True,
  save_every: int = 10,
) -> list[np.ndarray | None]:
  """The target's greedy output for each input (None: input too long).

  Inputs are decoded in batches of `batch_size` rows padded to the smallest
  of `input_lens` that holds them (one compilation per length). With a
  `cache_file`, finished outputs are written there every `save_every`
  batches and on Ctrl-C, and read back first, so no input is decoded twice.

  Args:
    target: the model.
    inputs: encoder token arrays, each ending with EOS.
    input_lens: the encoder lengths to pad to.
    max_decode_len: output tokens per row at most (a longer output is cut,
      without EOS).
    batch_size: rows per decode.
    cache_file: the `.npz` cache, or None.
    progress: show a tqdm bar.
    save_every: batches between cache writes.

  Returns:
    Per input, its output tokens (EOS included when reached), or None.
  """
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

  n = len(inputs)
  outputs = np.zeros((n, max_decode_len), np.int32)
  lengths = np.zeros((n,), np.int32)
  done = np.zeros((n,), bool)
  if cache_file and os.path.isfile(cache_file):
    cached = np.load(cache_file)
    if (
      cached['outputs'].shape == outputs.shape
      and cached['num_inputs'] == n
      and np.array_equal(cached['input_digest'], _digest(inputs))
    ):
      outputs, lengths, done = (
        cached['outputs'],
        cached['lengths'],
        cached['done'],
      )
    else:
      print(f'train_heads: {cache_file} is for other inputs; redecoding')
  input_lens = sorted(int(x) for x in input_lens)
  groups = {length: [] for length in input_lens}
  too_long = 0
  for i, x in enumerate(inputs):
    fit = [length for length in input_lens if len(x) <= length]
    if not fit:
      too_long += 1
    elif not done[i]:
      groups[fit[0]].append(i)
  batches = [
    (length, idx[s : s + batch_size])
    for length, idx in groups.items()
    for s in range(0, len(idx), batch_size)
  ]

  def save():
    if cache_file:
      tmp = cache_file + '.tmp.npz'
      np.savez(
        tmp,
        outputs=outputs,
        lengths=lengths,
        done=done,
        num_inputs=n,
        input_digest=_digest(inputs),
      )
      os.replace(tmp, cache_file)

  if batches:
    bar = tqdm.tqdm(
      total=len(batches),
      disable=not progress,
      unit='batch',
      dynamic_ncols=True,
      desc=f'greedy outputs ({int(done.sum())}/{n} cached)',
    )
    try:
      for b, (length, idx) in enumerate(batches):
        enc = np.zeros((batch_size, length), np.int32)
        for row in range(batch_size):
          x = inputs[idx[min(row, len(idx) - 1)]]  # Repeat to fill the batch.
          enc[row, : len(x)] = x
        out = generation.generate(
          target, enc, max_decode_len=max_decode_len, temperature=0.0
        )
        outputs[idx] = out.tokens[: len(idx)]
        lengths[idx] = out.lengths[: len(idx)]
        done[idx] = True
        bar.update(1)
        if (b + 1) % save_every == 0:
          save()
    finally:
      bar.close()
      save()
  return [
    None if not done[i] or lengths[i] == 0 else outputs[i, : lengths[i]].copy()
    for i in range(n)
  ]


def _digest(inputs: Sequence[np.ndarray]) -> np.ndarray:
  """A cheap fingerprint of a list of token arrays (`[4] int64`)."""
  lens = np.asarray([len(x) for x in inputs], np.int64)
  flat = np.concatenate(list(inputs) + [np.zeros(1, np.int32)]).astype(np.int64)
  pos = np.arange(len(flat), dtype=np.int64)
  return np.asarray(
    [len(inputs), lens.sum(), (flat * (pos % 9973 + 1)).sum(), flat.sum()],
    np.int64,
  )


def greedy_dataset(
  target: t5_model.Model,
  task: tasks_lib.Task,
  split: str,
  limit: int | None,
  buckets: Sequence[train_lib.Bucket],
  max_decode_len: int,
  batch_size: int,
  cache_file: str | None,
  progress: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
  """`(inputs, greedy outputs)` pairs of a split (over-long inputs out)."""
  pairs = train_lib.tokenize_split(task, split, target.vocabulary, limit)
  inputs = [x for x, _ in pairs]
  outs = greedy_outputs(
    target,
    inputs,
    sorted({b.input_len for b in buckets}),
    max_decode_len,
    batch_size,
    cache_file,
    progress,
  )
  return [(x, y) for x, y in zip(inputs, outs, strict=True) if y is not None]


# ------------------------------------------------------------------ loss.


def head_labels(targets: jax.Array, num_heads: int) -> jax.Array:
  """Labels `[B, T, K]`: head k at input t predicts `targets[:, t + k]`.

  `targets [B, T]` are output tokens 1..T (0-padded); input t (0 = start)
  has the hidden state that predicts output token t + 1 (`targets[:, t]`),
  so head k predicts output token t + 1 + k; 0 (padding) past the end.
  """
  b, t = targets.shape
  padded = jnp.concatenate(
    [targets, jnp.zeros((b, num_heads), targets.dtype)], axis=1
  )
  return jnp.stack(
    [padded[:, k : k + t] for k in range(1, num_heads + 1)], axis=-1
  )


def heads_loss(
  arrays: dict[str, jax.Array],
  features: jax.Array,
  targets: jax.Array,
  head_weights: jax.Array,
  base_projection: jax.Array | None = None,
  distill_weight: float = 0.0,
):
  """Weighted per-head loss of heads on target features.

  Head k's loss is `(1 - w) * CE(label) + w * KL(p || q_k)`, where the
  label is the greedy output token `t + 1 + k` and `p` the target's own
  distribution of that token (its base head at input `t + k`): the soft
  targets make the heads' distributions useful for sampling too (Medusa's
  self-distillation).

  Args:
    arrays: `Heads` arrays (`weights`, `biases`, `projection`).
    features: `[B, T, D]` the target's hidden states at inputs 0..T-1.
    targets: `[B, T]` output tokens (0-padded).
    head_weights: `[K]` loss weight per head.
    base_projection: `[D, V]` the target's output projection (needed when
      `distill_weight > 0`).
    distill_weight: `w` above.

  Returns:
    The loss and `{'nll': [K], 'correct': [K], 'count': [K]}` (per-head
    mean cross-entropy, top-1 hits and labelled positions).
  """
  heads = heads_lib.Heads(**arrays)
  logits = heads.logits(features)  # [B, T, K, V]
  labels = head_labels(targets, heads.num_heads)
  weights = (labels != PAD_ID).astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  count = weights.sum((0, 1))
  denom = jnp.maximum(count, 1.0)
  nll = (ce * weights).sum((0, 1)) / denom
  correct = ((jnp.argmax(logits, -1) == labels) * weights).sum((0, 1))
  per_head = nll
  if distill_weight:
    teacher = jnp.einsum('btd,dv->btv', features, base_projection)
    t, k = features.shape[1], heads.num_heads
    teacher = jnp.pad(teacher, ((0, 0), (0, k), (0, 0)))
    teacher = jnp.stack(
      [teacher[:, i : i + t] for i in range(1, k + 1)], axis=2
    )  # [B, T, K, V]: the target's distribution of token t + 1 + k.
    kl = train_lib.kl_to_teacher(logits, jax.lax.stop_gradient(teacher))
    kl = (kl * weights).sum((0, 1)) / denom
    per_head = (1.0 - distill_weight) * nll + distill_weight * kl
  loss = jnp.sum(head_weights * per_head)
  return loss, {'nll': nll, 'correct': correct, 'count': count}


class FeatureData(train_lib.BucketedData):
  """`BucketedData` plus the frozen target's hidden states per example.

  The target is frozen, so its features over the greedy outputs are
  computed once (`compute`, one teacher-forced pass) and kept in memory
  (`num_tokens * D` float32); a train step then costs only the heads.
  """

  def compute(self, target: t5_model.Model, progress: bool = False) -> None:
    """Teacher-forces `target` over every example once."""
    from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

    self.features: list[np.ndarray | None] = [None] * len(self._examples)
    jobs = [
      (k, m[s : s + b.batch_size])
      for k, (m, b) in enumerate(zip(self._members, self.buckets, strict=True))
      for s in range(0, len(m), b.batch_size)
    ]
    for k, idx in tqdm.tqdm(
      jobs, disable=not progress, desc='target features', unit='batch'
    ):
      batch = self.make_batch(k, idx)
      feats = np.asarray(
        target.features(batch.inputs, t5_model.shift_right(batch.targets))
      )
      for row, i in enumerate(idx):
        self.features[i] = feats[row, : len(self._examples[i][1])].copy()

  def _with_features(self, bucket: int, indices) -> tuple[np.ndarray, ...]:
    batch = self.make_batch(bucket, indices)
    b = self.buckets[bucket]
    dim = next(f for f in self.features if f is not None).shape[-1]
    feats = np.zeros((b.batch_size, b.target_len, dim), np.float32)
    for row, i in enumerate(indices):
      feats[row, : len(self.features[i])] = self.features[i]
    return feats, batch.targets

  def feature_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    """`(features [B, T, D], targets [B, T])` of training step `step`."""
    epoch, i = divmod(step, self.batches_per_epoch)
    return self._with_features(*self._epoch(epoch)[i])

  def all_feature_batches(self) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every example once (for validation)."""
    return [
      self._with_features(k, m[s : s + b.batch_size])
      for k, (m, b) in enumerate(zip(self._members, self.buckets, strict=True))
      for s in range(0, len(m), b.batch_size)
    ]


def _train_step(
  state: train_lib.TrainState,
  frozen,
  features,
  targets,
  head_weights,
  base_projection,
  optimizer,
  distill_weight: float,
):
  def loss_fn(params):
    return heads_loss(
      {**frozen, **params},
      features,
      targets,
      head_weights,
      base_projection,
      distill_weight,
    )

  (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  new_state = train_lib.TrainState(
    step=state.step + 1, params=params, opt_state=opt_state
  )
  return new_state, dict(aux, loss=loss, grad_norm=optax.tree.norm(grads))


def _eval_step(params, frozen, features, targets, head_weights):
  _, aux = heads_loss({**frozen, **params}, features, targets, head_weights)
  return aux


# ------------------------------------------------------------------ run.


@dataclasses.dataclass
class HeadsTrainResult:
  """What `train_heads` returns.

  Attributes:
    step: optimizer steps taken so far.
    train_loss: mean training loss of the last logged steps (None if none).
    validation_accuracy: `[K]` per-head top-1 accuracy on the validation
      split's greedy outputs.
    validation_nll: `[K]` per-head cross-entropy there.
    stopped: `done`, `interrupted` or `time`.
    heads_path: the exported `Heads.save` directory.
  """

  step: int
  train_loss: float | None
  validation_accuracy: list[float]
  validation_nll: list[float]
  stopped: str
  heads_path: str


def train_heads(
  model_dir: str,
  target_path: str,
  num_heads: int = 4,
  depth: int = 1,
  share_projection: bool = False,
  train_projection: bool = True,
  task: str = 'debian_ende',
  data_dir: str | None = None,
  train_examples: int | None = 4096,
  eval_examples: int = 256,
  max_decode_len: int = 64,
  generate_batch_size: int = 64,
  buckets: Sequence[Sequence[int]] = DEFAULT_BUCKETS,
  train_steps: int = 500,
  learning_rate: float = 1e-3,
  warmup_steps: int = 50,
  final_lr_fraction: float = 0.1,
  weight_decay: float = 0.0,
  clip_norm: float = 1.0,
  head_decay: float = 0.8,
  distill_weight: float = 0.0,
  eval_every: int = 100,
  checkpoint_every: int = 100,
  keep_checkpoints: int = 2,
  log_every: int = 10,
  max_minutes: float | None = None,
  seed: int = 0,
  progress: bool = True,
) -> HeadsTrainResult:
  """Trains (or resumes training) Medusa heads; see the module docstring.

  Args:
    model_dir: where the greedy-output cache, checkpoints, the log and the
      exported heads go.
    target_path: the frozen target (`Model.load` path).
    num_heads: K, heads (draft tokens per iteration at most).
    depth: residual blocks per head.
    share_projection: one vocabulary projection for all heads.
    train_projection: train the projection(s); False keeps the target's.
    task: a `tasks.task_names()` name (its inputs are used, not its
      references).
    data_dir: the task's data directory (None: the default).
    train_examples: decode and train on the first N training inputs (None:
      all).
    eval_examples: validation inputs.
    max_decode_len: greedy output length cap.
    generate_batch_size: rows per greedy decode.
    buckets: `(input_len, target_len, batch_size)` train batch shapes;
      `target_len >= max_decode_len`.
    train_steps: total optimizer steps.
    learning_rate: peak AdamW learning rate.
    warmup_steps: linear warmup steps.
    final_lr_fraction: the cosine decay ends at this fraction of the peak.
    weight_decay: AdamW decoupled weight decay.
    clip_norm: global gradient-norm clip.
    head_decay: head k's loss weight is `head_decay^(k-1)` (Medusa: 0.8).
    distill_weight: weight of the KL to the target's own distribution of
      each head's token, against the greedy label's cross-entropy (see
      `heads_loss`); > 0 helps sampled decoding.
    eval_every: steps between validation runs (0: only at the end).
    checkpoint_every: steps between checkpoints.
    keep_checkpoints: checkpoints kept on disk.
    log_every: steps between log records and bar updates.
    max_minutes: wall-clock budget of the training loop; on expiry the run
      checkpoints and exits (rerun to continue).
    seed: data order and (unused by the identity init) head init seed.
    progress: show tqdm bars.

  Returns:
    A `HeadsTrainResult`.
  """
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

  os.makedirs(model_dir, exist_ok=True)
  bucket_specs = train_lib._buckets(buckets)  # pylint: disable=protected-access
  if max(b.target_len for b in bucket_specs) < max_decode_len:
    raise ValueError(
      f'the largest bucket target_len is under max_decode_len='
      f'{max_decode_len}: long greedy outputs would be dropped'
    )
  target = t5_model.Model.load(target_path, dtype='float32')
  if target.vocabulary is None:
    raise ValueError(f'{target_path}: the target has no vocabulary')
  task_obj = tasks_lib.get_task(task, data_dir)

  def data(split, limit):
    return greedy_dataset(
      target,
      task_obj,
      split,
      limit,
      bucket_specs,
      max_decode_len,
      generate_batch_size,
      os.path.join(model_dir, GREEDY_FILE.format(split=split)),
      progress,
    )

  try:
    t0 = time.monotonic()
    train_pairs = data('train', train_examples)
    eval_pairs = data('validation', eval_examples)
    gen_seconds = time.monotonic() - t0
  except KeyboardInterrupt:
    print('\ntrain_heads: interrupted while decoding (cached so far)')
    raise
  t0 = time.monotonic()
  feature_model = target.unpacked()
  train_data = FeatureData(train_pairs, buckets, seed)
  train_data.compute(feature_model, progress)
  eval_data = FeatureData(eval_pairs, buckets, seed)
  eval_data.compute(feature_model, progress)
  eval_batches = eval_data.all_feature_batches()
  feature_seconds = time.monotonic() - t0

  init_heads = heads_lib.Heads.init(
    target, num_heads, depth, seed=seed, share_projection=share_projection
  )
  all_arrays = init_heads.arrays()
  trained = ('weights', 'biases') + (
    ('projection',) if train_projection else ()
  )
  frozen = {k: v for k, v in all_arrays.items() if k not in trained}
  optimizer = train_lib.make_optimizer(
    learning_rate,
    train_steps,
    warmup_steps,
    final_lr_fraction,
    weight_decay,
    clip_norm=clip_norm,
  )

  def init_state():
    params = {k: all_arrays[k] for k in trained}
    return train_lib.TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=optimizer.init(params),
    )

  abstract = jax.eval_shape(init_state)
  state = train_lib.restore_state(model_dir, abstract)
  resumed = state is not None
  if state is None:
    state = init_state()
  start = int(state.step)
  head_weights = jnp.asarray(
    [head_decay**k for k in range(num_heads)], jnp.float32
  )
  train_step = jax.jit(_train_step, static_argnums=(6, 7), donate_argnums=(0,))
  base_projection = heads_lib.target_projection(target)
  eval_step = jax.jit(_eval_step)

  def validate(params):
    correct = np.zeros(num_heads)
    count = np.zeros(num_heads)
    nll = np.zeros(num_heads)
    for features, targets in eval_batches:
      aux = eval_step(params, frozen, features, targets, head_weights)
      c = np.asarray(aux['count'])
      correct += np.asarray(aux['correct'])
      nll += np.asarray(aux['nll']) * c
      count += c
    count = np.maximum(count, 1.0)
    return (correct / count).tolist(), (nll / count).tolist()

  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  print(
    f'train_heads: {num_heads} heads of depth {depth} on {target_path} '
    f'({n_params:,} trained parameters); {train_data.num_examples} greedy '
    f'train outputs ({gen_seconds:.0f} s to decode or load, '
    f'{feature_seconds:.0f} s for their features), '
    f'{len(eval_pairs)} validation; '
    f'{"resuming at" if resumed else "starting at"} step {start} of '
    f'{train_steps}',
    flush=True,
  )
  manager = train_lib._manager(model_dir, keep_checkpoints)  # pylint: disable=protected-access
  heads_path = os.path.join(model_dir, HEADS_DIR)
  deadline = (time.monotonic() + 60.0 * max_minutes) if max_minutes else None
  stopped = 'done'
  last_loss = None
  last_val, last_val_step = None, None
  bar = tqdm.tqdm(
    total=train_steps,
    initial=start,
    disable=not progress,
    unit='step',
    dynamic_ncols=True,
    desc='train heads',
  )
  loss_acc, n_acc = 0.0, 0
  step = start
  t_train = time.monotonic()
  try:
    with train_lib._Interrupt():  # pylint: disable=protected-access
      while step < train_steps:
        features, targets = train_data.feature_batch(step)
        state, aux = train_step(
          state,
          frozen,
          features,
          targets,
          head_weights,
          base_projection,
          optimizer,
          distill_weight,
        )
        loss = float(aux['loss'])
        step += 1
        if not math.isfinite(loss):
          raise FloatingPointError(f'loss is {loss} at step {step}')
        loss_acc += loss
        n_acc += 1
        bar.update(1)
        if step % log_every == 0 or step == train_steps:
          last_loss = loss_acc / n_acc
          count = np.maximum(np.asarray(aux['count']), 1.0)
          record = {
            'step': step,
            'loss': last_loss,
            'nll': np.asarray(aux['nll']).tolist(),
            'accuracy': (np.asarray(aux['correct']) / count).tolist(),
            'grad_norm': float(aux['grad_norm']),
            'time': time.time(),
          }
          if eval_every and step % eval_every == 0:
            last_val = validate(state.params)
            last_val_step = step
            record['validation_accuracy'] = last_val[0]
            record['validation_nll'] = last_val[1]
          train_lib._log(model_dir, record)  # pylint: disable=protected-access
          bar.set_postfix(
            loss=f'{last_loss:.3f}',
            acc1=f'{record["accuracy"][0]:.2f}',
            val1='-' if last_val is None else f'{last_val[0][0]:.2f}',
          )
          loss_acc, n_acc = 0.0, 0
        if step % checkpoint_every == 0:
          train_lib._save(manager, state)  # pylint: disable=protected-access
        if deadline is not None and time.monotonic() > deadline:
          print(
            f'\ntrain_heads: max_minutes={max_minutes} reached at step '
            f'{step}; checkpointing (rerun to continue)',
            flush=True,
          )
          stopped = 'time'
          break
  except KeyboardInterrupt:
    stopped = 'interrupted'
    print(
      f'\ntrain_heads: interrupted at step {int(state.step)}; checkpointing',
      flush=True,
    )
  finally:
    bar.close()
  train_seconds = time.monotonic() - t_train
  train_lib._save(manager, state)  # pylint: disable=protected-access
  manager.close()
  if last_val_step != int(state.step):
    last_val = validate(state.params)
    train_lib._log(  # pylint: disable=protected-access
      model_dir,
      {
        'step': int(state.step),
        'validation_accuracy': last_val[0],
        'validation_nll': last_val[1],
        'time': time.time(),
      },
    )
  heads = init_heads.with_arrays(
    {k: jnp.asarray(v) for k, v in {**frozen, **state.params}.items()}
  )
  export_heads(heads, heads_path)
  print(
    f'train_heads: step {int(state.step)} ({train_seconds:.0f} s this run), '
    f'validation top-1 accuracy per head '
    f'{json.dumps([round(a, 4) for a in last_val[0]])}; heads in '
    f'{heads_path}',
    flush=True,
  )
  return HeadsTrainResult(
    int(state.step), last_loss, last_val[0], last_val[1], stopped, heads_path
  )


def export_heads(heads: heads_lib.Heads, path: str) -> None:
  """Writes `Heads.save` format to `path`, replacing it."""
  tmp = path.rstrip('/') + '.tmp'
  shutil.rmtree(tmp, ignore_errors=True)
  heads.save(tmp)
  shutil.rmtree(path, ignore_errors=True)
  os.replace(tmp, path)


def gin_binds_heads() -> bool:
  """Whether the parsed gin config binds `heads.train_heads`."""
  import gin  # pylint: disable=g-import-not-at-top

  try:
    return bool(gin.get_bindings(train_heads))
  except (ValueError, KeyError):
    return False

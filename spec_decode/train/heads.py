"""Trains Medusa heads (`drafters.Heads`) on a frozen target.

Run through `spec-decode train`: a gin file that binds
`heads.train_heads` (after `from spec_decode.train import heads`)
makes `spec-decode train` call this module's `train_heads` instead of
`lm.train`; the flags are the same.

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
  * AdamW with warmup and cosine decay (`common.make_optimizer`) in the
    loop LM training runs too (`common.train_loop`): a tqdm bar, validation
    per-head top-1 accuracy every `eval_every` steps, log records in
    `<model_dir>/train_log.jsonl`, orbax checkpoints of
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
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spec_decode import paths
from spec_decode.data import tasks as tasks_lib
from spec_decode.drafters import heads as heads_lib
from spec_decode.models import t5_model
from spec_decode.t5.config import PAD_ID
from spec_decode.train import common
from spec_decode.train import greedy

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
    kl = common.kl_to_teacher(logits, jax.lax.stop_gradient(teacher))
    kl = (kl * weights).sum((0, 1)) / denom
    per_head = (1.0 - distill_weight) * nll + distill_weight * kl
  loss = jnp.sum(head_weights * per_head)
  return loss, {'nll': nll, 'correct': correct, 'count': count}


class FeatureData(common.BucketedData):
  """`BucketedData` plus the frozen target's hidden states per example.

  The target is frozen, so its features over the greedy outputs are
  computed once (`compute`, one teacher-forced pass) and kept in memory
  (`num_tokens * D` float32); a train step then costs only the heads.
  """

  def compute(self, target: t5_model.Model, progress: bool = False) -> None:
    """Teacher-forces `target` over every example once."""
    from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

    self.features: list[np.ndarray | None] = [None] * len(self.examples)
    for k, idx in tqdm.tqdm(
      self.chunks(), disable=not progress, desc='target features', unit='batch'
    ):
      batch = self.make_batch(k, idx)
      feats = np.asarray(
        target.features(batch.inputs, t5_model.shift_right(batch.targets))
      )
      for row, i in enumerate(idx):
        self.features[i] = feats[row, : len(self.examples[i][1])].copy()

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
    return self._with_features(*self.step_indices(step))

  def all_feature_batches(self) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every example once (for validation)."""
    return [self._with_features(k, idx) for k, idx in self.chunks()]


def _train_step(
  state: common.TrainState,
  batch: tuple[jax.Array, jax.Array],
  fixed: tuple[dict[str, jax.Array], jax.Array, jax.Array],
  optimizer,
  distill_weight: float,
):
  """One optimizer step on a `(features, targets)` batch.

  `fixed` is `(frozen head arrays, per-head loss weights, the target's
  output projection)`.
  """
  features, targets = batch
  frozen, head_weights, base_projection = fixed

  def loss_fn(params):
    return heads_loss(
      {**frozen, **params},
      features,
      targets,
      head_weights,
      base_projection,
      distill_weight,
    )

  return common.apply_gradients(state, optimizer, loss_fn)


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
    target_path: the frozen target (a `Model.load` path; a relative path is
      also looked up in the repository, `paths.resolve`).
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
  os.makedirs(model_dir, exist_ok=True)
  bucket_specs = common.make_buckets(buckets)
  if max(b.target_len for b in bucket_specs) < max_decode_len:
    raise ValueError(
      f'the largest bucket target_len is under max_decode_len='
      f'{max_decode_len}: long greedy outputs would be dropped'
    )
  target_path = paths.resolve(target_path)
  target = t5_model.Model.load(target_path, dtype='float32')
  if target.vocabulary is None:
    raise ValueError(f'{target_path}: the target has no vocabulary')
  task_obj = tasks_lib.get_task(task, data_dir)

  def data(split, limit):
    return greedy.greedy_dataset(
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
  optimizer = common.make_optimizer(
    learning_rate,
    train_steps,
    warmup_steps,
    final_lr_fraction,
    weight_decay,
    clip_norm=clip_norm,
  )
  state, resumed = common.init_or_restore(
    model_dir, lambda: {k: all_arrays[k] for k in trained}, optimizer
  )
  head_weights = jnp.asarray(
    [head_decay**k for k in range(num_heads)], jnp.float32
  )
  train_step = jax.jit(_train_step, static_argnums=(3, 4), donate_argnums=(0,))
  fixed = (frozen, head_weights, heads_lib.target_projection(target))
  eval_step = jax.jit(_eval_step)

  def step(state, batch):
    return train_step(state, batch, fixed, optimizer, distill_weight)

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
    return {
      'validation_accuracy': (correct / count).tolist(),
      'validation_nll': (nll / count).tolist(),
    }

  def log_fields(aux):
    count = np.maximum(np.asarray(aux['count']), 1.0)
    return {
      'nll': np.asarray(aux['nll']).tolist(),
      'accuracy': (np.asarray(aux['correct']) / count).tolist(),
    }

  def postfix(record, validation):
    val1 = (
      '-'
      if validation is None
      else f'{validation["validation_accuracy"][0]:.2f}'
    )
    return {'acc1': f'{record["accuracy"][0]:.2f}', 'val1': val1}

  print(
    f'train_heads: {num_heads} heads of depth {depth} on {target_path} '
    f'({common.num_params(state.params):,} trained parameters); '
    f'{train_data.num_examples} greedy '
    f'train outputs ({gen_seconds:.0f} s to decode or load, '
    f'{feature_seconds:.0f} s for their features), '
    f'{len(eval_pairs)} validation; '
    f'{"resuming at" if resumed else "starting at"} step {int(state.step)} '
    f'of {train_steps}',
    flush=True,
  )
  run = common.train_loop(
    state,
    train_data.feature_batch,
    step,
    validate,
    model_dir,
    common.LoopSettings(
      train_steps,
      eval_every,
      checkpoint_every,
      keep_checkpoints,
      log_every,
      max_minutes,
      progress,
    ),
    log_fields=log_fields,
    postfix=postfix,
    name='train_heads',
  )
  heads_path = os.path.join(model_dir, HEADS_DIR)
  heads = init_heads.with_arrays(
    {k: jnp.asarray(v) for k, v in {**frozen, **run.state.params}.items()}
  )
  export_heads(heads, heads_path)
  accuracy = run.validation['validation_accuracy']
  print(
    f'train_heads: step {int(run.state.step)} ({run.seconds:.0f} s this '
    f'run), validation top-1 accuracy per head '
    f'{json.dumps([round(a, 4) for a in accuracy])}; heads in '
    f'{heads_path}',
    flush=True,
  )
  return HeadsTrainResult(
    int(run.state.step),
    run.train_loss,
    accuracy,
    run.validation['validation_nll'],
    run.stopped,
    heads_path,
  )


def export_heads(heads: heads_lib.Heads, path: str) -> None:
  """Writes `Heads.save` format to `path`, replacing it."""
  common.replace_dir(path, heads.save)

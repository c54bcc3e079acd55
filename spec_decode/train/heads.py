"""Trains Medusa heads (`drafters.Heads`) on a frozen target.

A run's settings are one `HeadsTrainSettings`; `run(settings)` trains.
Run through `spec-decode train`: a gin file that binds
`heads.train_heads` (after `from spec_decode.train import heads`)
makes `spec-decode train` call this module's `train_heads` (the settings'
fields as keyword arguments; it calls `run`) instead of `lm.train`; the
flags are the same.

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
    loop and frame LM training runs too (`common.train_loop`,
    `job.finish`): a tqdm bar, validation per-head top-1 accuracy every
    `eval_every` steps, log records in
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
from spec_decode.train import job

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


@dataclasses.dataclass(frozen=True)
class HeadsTrainSettings:
  """Everything a heads training run takes (`run`); see the module docs.

  `spec-decode train` binds these as `heads.train_heads.<field>`
  (`train_heads` takes them as arguments).

  Attributes:
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
    deadline: a `time.time()` at which the loop stops as on `max_minutes`
      (whichever comes first).
    seed: data order and (unused by the identity init) head init seed.
    progress: show tqdm bars.
  """

  model_dir: str
  target_path: str
  num_heads: int = 4
  depth: int = 1
  share_projection: bool = False
  train_projection: bool = True
  task: str = 'debian_ende'
  data_dir: str | None = None
  train_examples: int | None = 4096
  eval_examples: int = 256
  max_decode_len: int = 64
  generate_batch_size: int = 64
  buckets: Sequence[Sequence[int]] = DEFAULT_BUCKETS
  train_steps: int = 500
  learning_rate: float = 1e-3
  warmup_steps: int = 50
  final_lr_fraction: float = 0.1
  weight_decay: float = 0.0
  clip_norm: float = 1.0
  head_decay: float = 0.8
  distill_weight: float = 0.0
  eval_every: int = 100
  checkpoint_every: int = 100
  keep_checkpoints: int = 2
  log_every: int = 10
  max_minutes: float | None = None
  deadline: float | None = None
  seed: int = 0
  progress: bool = True


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


def train_heads(*args, **kwargs) -> HeadsTrainResult:
  """`run(HeadsTrainSettings(*args, **kwargs))`: the entry point gin binds.

  Its parameters are `HeadsTrainSettings`'s fields, with their defaults
  (the signature is `HeadsTrainSettings`'s), so a config binds
  `heads.train_heads.<field>`.

  Returns:
    A `HeadsTrainResult`.
  """
  return run(HeadsTrainSettings(*args, **kwargs))


train_heads.__signature__ = job.signature_of(
  HeadsTrainSettings, HeadsTrainResult
)


def run(settings: HeadsTrainSettings) -> HeadsTrainResult:
  """Trains (or resumes training) Medusa heads; see the module docstring.

  Args:
    settings: the run's settings.

  Returns:
    A `HeadsTrainResult`.
  """
  s = settings
  os.makedirs(s.model_dir, exist_ok=True)
  bucket_specs = common.make_buckets(s.buckets)
  if max(b.target_len for b in bucket_specs) < s.max_decode_len:
    raise ValueError(
      f'the largest bucket target_len is under max_decode_len='
      f'{s.max_decode_len}: long greedy outputs would be dropped'
    )
  target_path = paths.resolve(s.target_path)
  target = t5_model.Model.load(target_path, dtype='float32')
  if target.vocabulary is None:
    raise ValueError(f'{target_path}: the target has no vocabulary')
  task_obj = tasks_lib.get_task(s.task, s.data_dir)

  def data(split, limit):
    return greedy.greedy_dataset(
      target,
      task_obj,
      split,
      limit,
      bucket_specs,
      s.max_decode_len,
      s.generate_batch_size,
      os.path.join(s.model_dir, GREEDY_FILE.format(split=split)),
      s.progress,
    )

  try:
    t0 = time.monotonic()
    train_pairs = data('train', s.train_examples)
    eval_pairs = data('validation', s.eval_examples)
    gen_seconds = time.monotonic() - t0
  except KeyboardInterrupt:
    print('\ntrain_heads: interrupted while decoding (cached so far)')
    raise
  t0 = time.monotonic()
  feature_model = target.unpacked()
  train_data = FeatureData(train_pairs, s.buckets, s.seed)
  train_data.compute(feature_model, s.progress)
  eval_data = FeatureData(eval_pairs, s.buckets, s.seed)
  eval_data.compute(feature_model, s.progress)
  eval_batches = eval_data.all_feature_batches()
  feature_seconds = time.monotonic() - t0

  init_heads = heads_lib.Heads.init(
    target,
    s.num_heads,
    s.depth,
    seed=s.seed,
    share_projection=s.share_projection,
  )
  all_arrays = init_heads.arrays()
  trained = ('weights', 'biases') + (
    ('projection',) if s.train_projection else ()
  )
  frozen = {k: v for k, v in all_arrays.items() if k not in trained}
  optimizer, state, resumed = job.start(
    s, lambda: {k: all_arrays[k] for k in trained}
  )
  head_weights = jnp.asarray(
    [s.head_decay**k for k in range(s.num_heads)], jnp.float32
  )
  train_step = jax.jit(_train_step, static_argnums=(3, 4), donate_argnums=(0,))
  fixed = (frozen, head_weights, heads_lib.target_projection(target))

  def step(state, batch):
    return train_step(state, batch, fixed, optimizer, s.distill_weight)

  def export(params):
    path = os.path.join(s.model_dir, HEADS_DIR)
    export_heads(
      init_heads.with_arrays(
        {k: jnp.asarray(v) for k, v in {**frozen, **params}.items()}
      ),
      path,
    )
    return path

  loop, heads_path = job.finish(
    s,
    job.Job(
      name='train_heads',
      intro=(
        f'{s.num_heads} heads of depth {s.depth} on {target_path} '
        f'({common.num_params(state.params):,} trained parameters); '
        f'{train_data.num_examples} greedy '
        f'train outputs ({gen_seconds:.0f} s to decode or load, '
        f'{feature_seconds:.0f} s for their features), '
        f'{len(eval_pairs)} validation'
      ),
      batch=train_data.feature_batch,
      train_step=step,
      validate=_validator(frozen, eval_batches, head_weights, s.num_heads),
      log_fields=_log_fields,
      postfix=_postfix,
      export=export,
      summary=_summary,
      product='heads',
    ),
    state,
    resumed,
  )
  return HeadsTrainResult(
    int(loop.state.step),
    loop.train_loss,
    loop.validation['validation_accuracy'],
    loop.validation['validation_nll'],
    loop.stopped,
    heads_path,
  )


def _validator(frozen, eval_batches, head_weights, num_heads):
  """`params -> {validation_accuracy, validation_nll}` (per head)."""
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
    return {
      'validation_accuracy': (correct / count).tolist(),
      'validation_nll': (nll / count).tolist(),
    }

  return validate


def _log_fields(aux):
  count = np.maximum(np.asarray(aux['count']), 1.0)
  return {
    'nll': np.asarray(aux['nll']).tolist(),
    'accuracy': (np.asarray(aux['correct']) / count).tolist(),
  }


def _postfix(record, validation):
  val1 = (
    '-' if validation is None else f'{validation["validation_accuracy"][0]:.2f}'
  )
  return {'acc1': f'{record["accuracy"][0]:.2f}', 'val1': val1}


def _summary(loop: common.LoopResult) -> str:
  accuracy = loop.validation['validation_accuracy']
  return (
    f' ({loop.seconds:.0f} s this run), validation top-1 accuracy per head '
    f'{json.dumps([round(a, 4) for a in accuracy])}'
  )


def export_heads(heads: heads_lib.Heads, path: str) -> None:
  """Writes `Heads.save` format to `path`, replacing it."""
  common.replace_dir(path, heads.save)

"""Trains an EAGLE-style feature draft (`drafters.FeatureDraft`).

A run's settings are one `FeatureTrainSettings`; `run(settings)` trains.
Run through `spec-decode train`: a gin file that binds
`feature.train_feature` (after `from spec_decode.train import feature`)
makes `spec-decode train` call this module's `train_feature`; the flags are
the same as for LM and heads training.

    spec-decode train --gin_file=configs/train_demo_feature.gin \\
        --model_dir=runs/demo/feature [--gin.TRAIN_STEPS=600]

What a run does:
  * loads the frozen target (`target_path`, any `Model.load` path: a T5
    or a T5Gemma / T5Gemma 2 target, whose draft then has T5Gemma layers,
    `drafters.feature_t5gemma`; the recipe and the settings are the same,
    except `mlp_dim`, which a T5Gemma draft does not take);
  * the training outputs are the target's own greedy outputs on the task's
    train inputs (`targets='greedy'`, decoded once and cached in
    `<model_dir>/greedy_<split>.npz` as heads training does), the task's
    references (`targets='references'`), or both (`'both'`: each input
    twice; sampled decoding leaves the greedy paths, and the references
    show the draft other prefixes);
  * the target is teacher-forced once over them for its final hidden
    states `h_t` (input t), kept in memory (`cache_features`; without it,
    for large targets and data, each step teacher-forces the target
    again);
  * the draft reads `(h_{t-1} + noise, token t)` and predicts `h_t`
    (`FeatureDraft.teacher_forced_from`), with its cross-attention on the
    target's encoder-side keys and values (computed by the frozen target
    each step). EAGLE's two losses: the feature regression, smooth L1
    between the predicted and the target's `h_t` (mean over D), and the
    token loss, the cross-entropy from the target's distribution
    `softmax(project(h_t))` to the draft's `softmax(project(predicted))`,
    `loss = feature_weight * L_feature + token_weight * L_token` over the
    output positions (padding masked). The noise, uniform in
    `[-feature_noise, feature_noise]`, is EAGLE's: drafting feeds the
    draft its own (imperfect) features;
  * the shared frame of LM and heads training (`job.finish`): AdamW with
    warmup and cosine decay, a tqdm bar, validation every `eval_every`
    steps, `<model_dir>/train_log.jsonl`, orbax checkpoints under
    `<model_dir>/checkpoints/` (rerunning resumes; Ctrl-C, SIGTERM or
    `max_minutes` checkpoint before exiting);
  * with `draft_vocab_size` N, the draft vocabulary is the N most frequent
    tokens of the training outputs (the targets above, EOS included, ties
    to the smaller id; `draft_vocabulary`), stored with the draft. The
    losses are unchanged (the features, and the token loss over the full
    vocabulary); validation measures the draft as it drafts, over its N
    ids;
  * at the end the draft is exported with `FeatureDraft.save` to
    `<model_dir>/feature_draft` (load it with `FeatureDraft.load(path,
    target)`, or in an eval config, `spec_eval_drafters.feature_draft`).

Validation reports, teacher-forced on the validation outputs (the draft
given the target's true features, so an estimate of the first draft
token's acceptance): `validation_top1`, how often the draft's argmax is the
target's (greedy acceptance), and `validation_beta`, the mean of
`sum_x min(p(x), q(x))` at temperature 1 (the acceptance probability of a
sampled token, the paper's beta).
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
from spec_decode.data import seqio_data
from spec_decode.data import tasks as tasks_lib
from spec_decode.drafters import feature as feature_lib
from spec_decode.models import t5_model
from spec_decode.t5.config import PAD_ID
from spec_decode.train import common
from spec_decode.train import greedy
from spec_decode.train import heads
from spec_decode.train import job

FEATURE_DIR = 'feature_draft'
TARGETS = ('greedy', 'references', 'both')
GREEDY_FILE = heads.GREEDY_FILE


# ------------------------------------------------------------------ loss.


def feature_loss(
  draft: feature_lib.FeatureDraft,
  inputs: jax.Array,
  features: jax.Array,
  targets: jax.Array,
  noise: jax.Array | None = None,
  feature_weight: float = 1.0,
  token_weight: float = 0.1,
):
  """EAGLE's loss of `draft` on one batch (module docstring).

  Args:
    draft: the draft (its `params` are what is differentiated).
    inputs: `[B, S]` encoder tokens.
    features: `[B, T, D]` the target's teacher-forced features of decoder
      inputs 0..T-1 (`shift_right(targets)`), or None to compute them.
    targets: `[B, T]` output tokens (0-padded).
    noise: `[B, T, D]` added to the features the draft reads, or None.
    feature_weight: weight of the smooth-L1 feature loss.
    token_weight: weight of the token cross-entropy.

  Returns:
    The loss and `{'feature', 'token', 'top1', 'beta', 'count'}` (means
    over the labelled positions, top-1 hits and beta as sums, the count).
    The losses use the full vocabulary; top-1 and beta the draft's
    vocabulary (`draft.logits`: q = 0 outside it), as it drafts.
  """
  target = draft.target
  if features is None:
    features = target.features(inputs, t5_model.shift_right(targets))
  features = jax.lax.stop_gradient(features)
  tstate = jax.lax.stop_gradient(target.init_state(inputs, 1))
  cross = draft.cross(tstate)
  read = features if noise is None else features + noise
  predicted = draft.teacher_forced_from(
    cross, t5_model.shift_right(targets), read
  )
  weights = (targets != PAD_ID).astype(jnp.float32)
  count = jnp.maximum(weights.sum(), 1.0)
  l_feat = jnp.mean(optax.huber_loss(predicted, features, delta=1.0), -1)
  teacher = jax.lax.stop_gradient(target.project(features))
  student = target.project(predicted)
  t_prob = jax.nn.softmax(teacher, -1)
  l_tok = -jnp.sum(t_prob * jax.nn.log_softmax(student, -1), -1)
  loss = (
    feature_weight * (l_feat * weights).sum()
    + token_weight * (l_tok * weights).sum()
  ) / count
  drafted = student if draft.draft_vocab is None else draft.logits(predicted)
  top1 = (jnp.argmax(drafted, -1) == jnp.argmax(teacher, -1)) * weights
  beta = jnp.sum(jnp.minimum(t_prob, jax.nn.softmax(drafted, -1)), -1)
  return loss, {
    'feature': (l_feat * weights).sum() / count,
    'token': (l_tok * weights).sum() / count,
    'top1': top1.sum(),
    'beta': (beta * weights).sum(),
    'count': weights.sum(),
  }


class DraftData(heads.FeatureData):
  """`heads.FeatureData` whose batches carry the encoder inputs too (and
  no features unless `compute` ran: the train step then computes them)."""

  features = None

  def _with_inputs(self, bucket: int, indices) -> tuple[np.ndarray, ...]:
    if self.features is None:
      batch = self.make_batch(bucket, indices)
      return batch.inputs, None, batch.targets
    feats, targets = self._with_features(bucket, indices)
    return self.make_batch(bucket, indices).inputs, feats, targets

  def draft_batch(self, step: int) -> tuple[np.ndarray, ...]:
    """`(inputs [B, S], features [B, T, D], targets [B, T])` of `step`."""
    return self._with_inputs(*self.step_indices(step))

  def all_draft_batches(self) -> list[tuple[np.ndarray, ...]]:
    return [self._with_inputs(k, idx) for k, idx in self.chunks()]


def _train_step(state, batch, draft, optimizer, weights, noise_scale):
  inputs, features, targets = batch
  key = jax.random.fold_in(jax.random.key(17), state.step)
  if features is None:
    features = draft.target.features(inputs, t5_model.shift_right(targets))
  noise = None
  if noise_scale:
    noise = jax.random.uniform(
      key, features.shape, jnp.float32, -noise_scale, noise_scale
    )

  def loss_fn(params):
    return feature_loss(
      draft.replace(params=params), inputs, features, targets, noise, *weights
    )

  return common.apply_gradients(state, optimizer, loss_fn)


def _eval_step(params, draft, inputs, features, targets):
  return feature_loss(draft.replace(params=params), inputs, features, targets)[
    1
  ]


# ------------------------------------------------------------------ run.


@dataclasses.dataclass(frozen=True)
class FeatureTrainSettings:
  """Everything a feature-draft training run takes (`run`).

  `spec-decode train` binds these as `feature.train_feature.<field>`.

  Attributes:
    model_dir: where the greedy-output cache, checkpoints, the log and the
      exported draft go.
    target_path: the frozen target (a `Model.load` path; a relative path is
      also looked up in the repository, `paths.resolve`).
    num_layers: draft decoder layers.
    mlp_dim: their MLP width (None: the target's; narrower starts from the
      target's widest units, `FeatureDraft.init`; a T5Gemma target takes
      only None).
    draft_vocab_size: N, the size of the draft vocabulary (module
      docstring; None: the full vocabulary).
    from_target: start the draft layers as copies of the target's last
      layers (`FeatureDraft.init`).
    task: a `tasks.task_names()` name or a seqio task.
    data_dir: the task's data directory (None: the default).
    targets: 'greedy' (the target's own greedy outputs), 'references'
      (the task's) or 'both'.
    train_examples: the first N training inputs (None: all).
    eval_examples: validation inputs.
    max_decode_len: greedy output length cap.
    generate_batch_size: rows per greedy decode.
    buckets: `(input_len, target_len, batch_size)` train batch shapes.
    feature_weight: weight of the smooth-L1 feature loss (EAGLE: 1).
    token_weight: weight of the token cross-entropy (EAGLE: 0.1).
    feature_noise: the features the draft reads get uniform noise in
      [-feature_noise, feature_noise] while training (EAGLE: 0.1 of
      LLaMA's feature scale).
    cache_features: compute the target's features once and keep them in
      memory (tokens x D float32); False recomputes them every step.
    train_steps, learning_rate, warmup_steps, final_lr_fraction,
      weight_decay, clip_norm: the optimizer (`common.make_optimizer`).
    eval_every, checkpoint_every, keep_checkpoints, log_every,
      max_minutes, deadline, progress: the loop (`common.LoopSettings`).
    seed: data order and draft initialization.
  """

  model_dir: str
  target_path: str
  num_layers: int = 1
  mlp_dim: int | None = None
  draft_vocab_size: int | None = None
  from_target: bool = True
  task: str = 'debian_ende'
  data_dir: str | None = None
  targets: str = 'greedy'
  train_examples: int | None = 4096
  eval_examples: int = 256
  max_decode_len: int = 64
  generate_batch_size: int = 64
  buckets: Sequence[Sequence[int]] = heads.DEFAULT_BUCKETS
  feature_weight: float = 1.0
  token_weight: float = 0.1
  feature_noise: float = 0.1
  cache_features: bool = True
  train_steps: int = 500
  learning_rate: float = 1e-3
  warmup_steps: int = 50
  final_lr_fraction: float = 0.1
  weight_decay: float = 0.0
  clip_norm: float = 1.0
  eval_every: int = 100
  checkpoint_every: int = 100
  keep_checkpoints: int = 2
  log_every: int = 10
  max_minutes: float | None = None
  deadline: float | None = None
  seed: int = 0
  progress: bool = True

  def __post_init__(self):
    if self.targets not in TARGETS:
      raise ValueError(
        f'targets must be one of {TARGETS}, got {self.targets!r}'
      )
    n = self.draft_vocab_size
    if n is not None and (isinstance(n, bool) or int(n) != n or n < 1):
      raise ValueError(f'draft_vocab_size must be an int >= 1, got {n!r}')


@dataclasses.dataclass
class FeatureTrainResult:
  """What `train_feature` returns.

  Attributes:
    step: optimizer steps taken so far.
    train_loss: mean training loss of the last logged steps (None if none).
    validation_top1: teacher-forced argmax agreement with the target.
    validation_beta: teacher-forced mean beta at temperature 1.
    stopped: `done`, `interrupted` or `time`.
    draft_path: the exported `FeatureDraft.save` directory.
  """

  step: int
  train_loss: float | None
  validation_top1: float
  validation_beta: float
  stopped: str
  draft_path: str


def train_feature(*args, **kwargs) -> FeatureTrainResult:
  """`run(FeatureTrainSettings(*args, **kwargs))`: the entry point gin
  binds (its signature is `FeatureTrainSettings`'s)."""
  return run(FeatureTrainSettings(*args, **kwargs))


train_feature.__signature__ = job.signature_of(
  FeatureTrainSettings, FeatureTrainResult
)


def _task(s, target, limits) -> tasks_lib.Task:
  """The run's task: ours, or a seqio task or mixture (`seqio_data.lookup`)
  read as text (its preprocessed inputs, prefix included) after the check
  that it tokenizes with the target's vocabulary."""
  if seqio_data.lookup(s.task) != seqio_data.SEQIO:
    return tasks_lib.get_task(s.task, s.data_dir)
  if s.data_dir is not None:
    seqio_data.set_tfds_data_dir(s.data_dir)
  task = seqio_data.SeqioTask(s.task)
  task.check_vocabulary(target.vocabulary)
  # Long enough that seqio's trimming keeps what the buckets can take.
  lengths = {
    'inputs': max(b[0] for b in s.buckets),
    'targets': max(max(b[1] for b in s.buckets), s.max_decode_len),
  }

  def reader(split):
    for ex in task.read(split, lengths, dict(limits)[split]):
      yield ex.inputs, ex.targets

  return tasks_lib.Task(s.task, reader, '', 'bleu')


def _pairs(s, target, bucket_specs):
  """`(train, validation)` example pairs of the run's `targets`."""
  limits = (('train', s.train_examples), ('validation', s.eval_examples))
  task_obj = _task(s, target, limits)
  refs = greedy_pairs = None
  if s.targets in ('references', 'both'):
    refs = [
      common.tokenize_split(task_obj, split, target.vocabulary, limit)
      for split, limit in limits
    ]
  if s.targets in ('greedy', 'both'):
    greedy_pairs = [
      greedy.greedy_dataset(
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
      for split, limit in limits
    ]
  if refs is None:
    return tuple(greedy_pairs)
  if greedy_pairs is None:
    return tuple(refs)
  # Validation on the greedy outputs (what greedy decoding drafts for).
  return refs[0] + greedy_pairs[0], greedy_pairs[1]


def draft_vocabulary(
  pairs: Sequence[tuple[np.ndarray, np.ndarray]], size: int, vocab_size: int
) -> np.ndarray:
  """The `size` most frequent target tokens of `(inputs, targets)` pairs,
  ascending: ties to the smaller id, ids never seen filling up, never the
  padding id (never an output), so `min(size, vocab_size - 1)` ids."""
  counts = np.zeros(vocab_size, np.int64)
  for _, targets in pairs:
    counts += np.bincount(np.asarray(targets), minlength=vocab_size)[
      :vocab_size
    ]
  order = np.argsort(-counts, kind='stable')
  order = order[order != PAD_ID]
  return np.sort(order[: int(size)]).astype(np.int32)


def run(settings: FeatureTrainSettings) -> FeatureTrainResult:
  """Trains (or resumes training) a feature draft; see the module doc."""
  s = settings
  os.makedirs(s.model_dir, exist_ok=True)
  bucket_specs = common.make_buckets(s.buckets)
  target_path = paths.resolve(s.target_path)
  target = t5_model.Model.load(target_path, dtype='float32')
  if target.vocabulary is None:
    raise ValueError(f'{target_path}: the target has no vocabulary')
  # Before any decoding: what a T5Gemma draft does not take.
  feature_lib.refuse_t5_only_options(
    target, mlp_dim=s.mlp_dim, draft_vocab_size=s.draft_vocab_size
  )
  t0 = time.monotonic()
  try:
    train_pairs, eval_pairs = _pairs(s, target, bucket_specs)
  except KeyboardInterrupt:
    print('\ntrain_feature: interrupted while decoding (cached so far)')
    raise
  gen_seconds = time.monotonic() - t0
  t0 = time.monotonic()
  frozen = target.unpacked()
  train_data = DraftData(train_pairs, s.buckets, s.seed)
  eval_data = DraftData(eval_pairs, s.buckets, s.seed)
  if s.cache_features:
    train_data.compute(frozen, s.progress)
    eval_data.compute(frozen, s.progress)
  eval_batches = eval_data.all_draft_batches()
  feature_seconds = time.monotonic() - t0

  vocab = None
  if s.draft_vocab_size is not None:
    vocab = draft_vocabulary(train_pairs, s.draft_vocab_size, target.vocab_size)
  init = feature_lib.FeatureDraft.init(
    frozen,
    num_layers=s.num_layers,
    mlp_dim=s.mlp_dim,
    seed=s.seed,
    from_target=s.from_target,
    draft_vocab=vocab,
  )
  optimizer, state, resumed = job.start(s, lambda: init.params)
  train_step = jax.jit(_train_step, static_argnums=(3, 4, 5), donate_argnums=0)
  weights = (s.feature_weight, s.token_weight)

  # The draft without its parameters (they are the state's, donated). The
  # train step's (static: hashed) has no draft vocabulary, which only
  # the metrics read; validation's (an argument) has it.
  frame = init.replace(params=None)
  static_frame = frame
  if frame.draft_vocab is not None:  # T5 only: T5Gemma keeps the full one.
    static_frame = frame.with_draft_vocab(None)

  def step(state, batch):
    return train_step(
      state, batch, static_frame, optimizer, weights, s.feature_noise
    )

  def export(params):
    path = os.path.join(s.model_dir, FEATURE_DIR)
    common.replace_dir(path, init.with_params(params).save)
    return path

  loop, draft_path = job.finish(
    s,
    job.Job(
      name='train_feature',
      intro=(
        f'a {s.num_layers}-layer feature draft on {target_path} '
        f'({common.num_params(state.params):,} trained parameters, '
        f'{init.draft_vocab_size} draft vocabulary ids); '
        f'{train_data.num_examples} {s.targets} train outputs '
        f'({gen_seconds:.0f} s to decode or load, {feature_seconds:.0f} s '
        f'for their features), {len(eval_pairs)} validation'
      ),
      batch=train_data.draft_batch,
      train_step=step,
      validate=_validator(frame, eval_batches),
      log_fields=_log_fields,
      postfix=_postfix,
      export=export,
      summary=_summary,
      product='feature draft',
    ),
    state,
    resumed,
  )
  return FeatureTrainResult(
    int(loop.state.step),
    loop.train_loss,
    loop.validation['validation_top1'],
    loop.validation['validation_beta'],
    loop.stopped,
    draft_path,
  )


def _validator(draft, eval_batches):
  """`params -> {validation_top1, validation_beta, validation_feature}`."""
  eval_step = jax.jit(_eval_step)

  def validate(params):
    top1 = beta = feat = count = 0.0
    for inputs, features, targets in eval_batches:
      aux = eval_step(params, draft, inputs, features, targets)
      c = float(aux['count'])
      top1 += float(aux['top1'])
      beta += float(aux['beta'])
      feat += float(aux['feature']) * c
      count += c
    count = max(count, 1.0)
    return {
      'validation_top1': top1 / count,
      'validation_beta': beta / count,
      'validation_feature': feat / count,
    }

  return validate


def _log_fields(aux):
  count = max(float(aux['count']), 1.0)
  return {
    'feature': float(aux['feature']),
    'token': float(aux['token']),
    'top1': float(aux['top1']) / count,
  }


def _postfix(record, validation):
  val = '-' if validation is None else f'{validation["validation_top1"]:.2f}'
  return {'top1': f'{record["top1"]:.2f}', 'val_top1': val}


def _summary(loop: common.LoopResult) -> str:
  v = loop.validation
  return (
    f' ({loop.seconds:.0f} s this run), validation top-1 '
    f'{v["validation_top1"]:.4f}, beta {v["validation_beta"]:.4f}; '
    f'{json.dumps({"feature": round(v["validation_feature"], 4)})}'
  )

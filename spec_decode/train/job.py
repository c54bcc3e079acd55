"""The frame LM training (`lm.py`) and heads training (`heads.py`) share.

Each job takes one frozen settings dataclass (`lm.TrainSettings`,
`heads.HeadsTrainSettings`) whose shared knobs have the same names:
`model_dir`; the optimizer's `learning_rate`, `train_steps`,
`warmup_steps`, `final_lr_fraction`, `weight_decay` and `clip_norm`; the
loop's `eval_every`, `checkpoint_every`, `keep_checkpoints`, `log_every`,
`max_minutes`, `deadline` and `progress` (`common.LoopSettings`). This
module:

* gives a job's keyword entry point (`lm.train(**kwargs)`, which gin
  binds) its settings class's signature (`signature_of`), so gin checks
  binding names when it parses and sees the defaults;
* makes the optimizer and initializes or restores the state (`start`);
* runs the tail both jobs share (`finish`): the opening line,
  `common.train_loop`, the export of the final parameters and the closing
  line.
"""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import optax

from spec_decode.train import common


def signature_of(settings_cls: type, returns: Any) -> inspect.Signature:
  """The signature of `settings_cls(...)`, returning `returns`.

  Assigned to the `__signature__` of an entry point `fn(*args, **kwargs)`
  that builds a `settings_cls`, it makes `fn` look to gin (which reads
  `inspect.getfullargspec`) and to `help` as if it spelled the fields
  out: a binding of a name that is not a field fails when gin parses it.

  Args:
    settings_cls: a dataclass.
    returns: the entry point's return annotation.
  """
  return inspect.signature(settings_cls).replace(return_annotation=returns)


def loop_settings(settings: Any) -> common.LoopSettings:
  """The `common.LoopSettings` fields of a job's settings (same names).

  A field with a default (`deadline`) may be missing from `settings`.
  """
  return common.LoopSettings(
    **{
      f.name: getattr(settings, f.name)
      for f in dataclasses.fields(common.LoopSettings)
      if f.default is dataclasses.MISSING or hasattr(settings, f.name)
    }
  )


def start(
  settings: Any, init_params: Callable[[], Any]
) -> tuple[optax.GradientTransformation, common.TrainState, bool]:
  """A job's optimizer and the state it continues from.

  Args:
    settings: the job's settings (its optimizer fields and `model_dir`).
    init_params: makes the initial parameters of a fresh run.

  Returns:
    The optimizer, the latest checkpointed state of `model_dir` (else a
    fresh one) and whether it was restored.
  """
  optimizer = common.make_optimizer(
    settings.learning_rate,
    settings.train_steps,
    settings.warmup_steps,
    settings.final_lr_fraction,
    settings.weight_decay,
    clip_norm=settings.clip_norm,
  )
  state, resumed = common.init_or_restore(
    settings.model_dir, init_params, optimizer
  )
  return optimizer, state, resumed


@dataclasses.dataclass(frozen=True)
class Job:
  """What one training run plugs into `finish`.

  Attributes:
    name: the job's name in messages (`train`, `train_heads`).
    intro: the opening line's description of the run, before `; starting
      at step ...` (or `resuming at`).
    batch: `step -> training batch` (0-based).
    train_step: `(state, batch) -> (state, aux)`.
    validate: `params -> validation log fields`.
    log_fields: `aux -> log fields` of the last step.
    postfix: `(record, validation or None) -> progress-bar fields`.
    export: writes the final parameters; returns the directory written.
    summary: `loop result -> ` what the closing line says after
      `step N`.
    product: what `export` writes, as the closing line names it
      (`model in DIR`).
    intro_tail: appended to the opening line after `of TRAIN_STEPS`.
    batch_tokens: tokens of a batch, for `tokens_per_s` (None: not
      logged).
  """

  name: str
  intro: str
  batch: Callable[[int], Any]
  train_step: Callable[[common.TrainState, Any], tuple[Any, dict[str, Any]]]
  validate: Callable[[Any], dict[str, Any]]
  log_fields: Callable[[dict[str, Any]], dict[str, Any]]
  postfix: Callable[[dict[str, Any], dict[str, Any] | None], dict[str, str]]
  export: Callable[[Any], str]
  summary: Callable[[common.LoopResult], str]
  product: str
  intro_tail: str = ''
  batch_tokens: Callable[[Any], float] | None = None


def finish(
  settings: Any, job: Job, state: common.TrainState, resumed: bool
) -> tuple[common.LoopResult, str]:
  """Announces, trains to `settings.train_steps`, exports and reports.

  Prints `NAME: INTRO; starting at step S of N[INTRO_TAIL]` (`resuming
  at` for a restored state), runs `common.train_loop` with the settings'
  loop fields in `settings.model_dir`, exports the final parameters with
  `job.export` (also after an interruption or `max_minutes`) and prints
  `NAME: step S[SUMMARY]; PRODUCT in DIR`.

  Args:
    settings: the job's settings (its loop fields and `model_dir`).
    job: the run's pieces.
    state: the state to continue from (`start`).
    resumed: whether `state` was restored from a checkpoint.

  Returns:
    The loop's result and the exported directory.
  """
  print(
    f'{job.name}: {job.intro}; '
    f'{"resuming at" if resumed else "starting at"} step {int(state.step)} '
    f'of {settings.train_steps}{job.intro_tail}',
    flush=True,
  )
  loop = common.train_loop(
    state,
    job.batch,
    job.train_step,
    job.validate,
    settings.model_dir,
    loop_settings(settings),
    log_fields=job.log_fields,
    postfix=job.postfix,
    batch_tokens=job.batch_tokens,
    name=job.name,
  )
  path = job.export(loop.state.params)
  print(
    f'{job.name}: step {int(loop.state.step)}{job.summary(loop)}; '
    f'{job.product} in {path}',
    flush=True,
  )
  return loop, path

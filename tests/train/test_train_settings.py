"""The training settings dataclasses and their gin-facing entry points.

`lm.train(**kwargs)` / `heads.train_heads(**kwargs)` build an
`lm.TrainSettings` / `heads.HeadsTrainSettings` and call `run`; gin binds
the entry points by keyword, so their signatures must be the settings'
fields with the defaults they had when they were spelled out.
"""

import dataclasses
import inspect

import pytest
from conftest import tiny_config

import gin
from spec_decode import gin_cli
from spec_decode.train import heads
from spec_decode.train import lm

# The entry points' defaults before they took settings dataclasses.
LM_DEFAULTS = dict(
  vocabulary_file=None,
  task='debian_ende',
  data_dir=None,
  train_steps=1000,
  buckets=((32, 32, 64), (64, 64, 32), (128, 128, 16)),
  learning_rate=1e-3,
  warmup_steps=200,
  final_lr_fraction=0.1,
  weight_decay=0.01,
  clip_norm=1.0,
  label_smoothing=0.0,
  z_loss=1e-4,
  teacher_path=None,
  init_from=None,
  distill_weight=1.0,
  distill_temperature=1.0,
  distill_targets='references',
  eval_every=200,
  eval_examples=256,
  checkpoint_every=200,
  keep_checkpoints=2,
  log_every=10,
  max_minutes=None,
  deadline=None,
  save_dtype='float32',
  train_examples=None,
  seed=0,
  progress=True,
)
HEADS_DEFAULTS = dict(
  num_heads=4,
  depth=1,
  share_projection=False,
  train_projection=True,
  task='debian_ende',
  data_dir=None,
  train_examples=4096,
  eval_examples=256,
  max_decode_len=64,
  generate_batch_size=64,
  buckets=heads.DEFAULT_BUCKETS,
  train_steps=500,
  learning_rate=1e-3,
  warmup_steps=50,
  final_lr_fraction=0.1,
  weight_decay=0.0,
  clip_norm=1.0,
  head_decay=0.8,
  distill_weight=0.0,
  eval_every=100,
  checkpoint_every=100,
  keep_checkpoints=2,
  log_every=10,
  max_minutes=None,
  deadline=None,
  seed=0,
  progress=True,
)
CASES = [
  (lm.train, lm.TrainSettings, ('model_dir', 'model_config'), LM_DEFAULTS),
  (
    heads.train_heads,
    heads.HeadsTrainSettings,
    ('model_dir', 'target_path'),
    HEADS_DEFAULTS,
  ),
]
IDS = ['lm', 'heads']


@pytest.fixture
def captured(monkeypatch):
  """Replaces `lm.run` and `heads.run`; collects the settings they get."""
  got = []
  for module in (lm, heads):
    monkeypatch.setattr(module, 'run', got.append)
  return got


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.parametrize('entry, cls, required, defaults', CASES, ids=IDS)
def test_settings_are_frozen_and_defaults_unchanged(
  entry, cls, required, defaults
):
  del entry
  fields = dataclasses.fields(cls)
  assert [f.name for f in fields[: len(required)]] == list(required)
  assert all(f.default is dataclasses.MISSING for f in fields[:2])
  assert {f.name: f.default for f in fields[2:]} == defaults
  settings = cls('d', 'x')
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.seed = 1  # pytype: disable=not-writable


@pytest.mark.parametrize('entry, cls, required, defaults', CASES, ids=IDS)
def test_settings_document_every_field(entry, cls, required, defaults):
  del entry, required, defaults
  doc = inspect.getdoc(cls)
  attributes = doc[doc.index('Attributes:') :]
  for f in dataclasses.fields(cls):
    assert f'\n  {f.name}: ' in attributes, f.name


@pytest.mark.parametrize('entry, cls, required, defaults', CASES, ids=IDS)
def test_unknown_names_are_rejected_before_running(
  captured, entry, cls, required, defaults
):
  del required, defaults
  with pytest.raises(TypeError, match='bogus'):
    cls('d', 'x', bogus=1)
  with pytest.raises(TypeError, match='bogus'):
    entry('d', 'x', bogus=1)
  with pytest.raises(TypeError):
    entry(seed=1)  # No model_dir.
  assert not captured


@pytest.mark.parametrize('entry, cls, required, defaults', CASES, ids=IDS)
def test_entry_point_builds_the_same_settings(
  captured, entry, cls, required, defaults
):
  del defaults
  second = 'cfg'
  entry('d', second, seed=3, train_steps=7)
  entry(**{required[0]: 'd', required[1]: second, 'seed': 3}, train_steps=7)
  entry('d', second)
  want = cls('d', second, seed=3, train_steps=7)
  assert captured == [
    want,
    want,
    cls(**{required[0]: 'd'}, **{required[1]: second}),
  ]
  assert captured[2].seed == 0 and captured[2].train_steps != 7


@pytest.mark.parametrize('entry, cls, required, defaults', CASES, ids=IDS)
def test_entry_point_signature_is_the_settings(entry, cls, required, defaults):
  """What gin reads (`getfullargspec`): the fields, in order, defaults."""
  del required
  spec = inspect.getfullargspec(entry)
  assert spec.args == [f.name for f in dataclasses.fields(cls)]
  assert spec.varkw is None and spec.varargs is None
  assert dict(zip(spec.args[2:], spec.defaults, strict=True)) == defaults


def test_gin_binds_the_entry_points_by_keyword(clean_gin, captured):
  cfg = tiny_config(vocab_size=64)
  gin_cli.parse(
    [],
    [
      'from __gin__ import dynamic_registration',
      'from spec_decode.train import lm',
      "lm.train.model_dir = 'runs/x'",
      'lm.train.seed = 1',
      'lm.train.buckets = ((8, 8, 2),)',
    ],
  )
  gin_cli.configured(lm.train)(model_config=cfg)
  assert captured == [
    lm.TrainSettings('runs/x', cfg, seed=1, buckets=((8, 8, 2),))
  ]


@pytest.mark.parametrize('name', ['lm.train', 'heads.train_heads'])
def test_gin_rejects_an_unknown_parameter_when_parsing(clean_gin, name):
  module = name.split('.')[0]
  with pytest.raises(ValueError, match='bogus'):
    gin_cli.parse(
      [],
      [
        'from __gin__ import dynamic_registration',
        f'from spec_decode.train import {module}',
        f'{name}.bogus = 1',
      ],
    )


@pytest.mark.parametrize(
  'gin_file',
  [
    'train_demo_target',
    'train_demo_draft',
    'train_demo_draft_seqkd',
    'train_demo_target_gpu',
    'train_demo_draft_gpu',
    'train_demo_target_cpu_long',
    'train_demo_heads',
  ],
)
def test_every_train_config_builds_settings(clean_gin, captured, gin_file):
  """Each config's bindings (and a flag) reach the settings unchanged."""
  entry = heads.train_heads if 'heads' in gin_file else lm.train
  name = 'heads.train_heads' if 'heads' in gin_file else 'lm.train'
  gin_cli.parse(
    [gin_file],
    ["MODEL_DIR = '/tmp/x'", f'{name}.seed = 5', f'{name}.log_every = 3'],
  )
  gin_cli.configured(entry)()
  (settings,) = captured
  assert settings.model_dir == '/tmp/x'
  assert settings.seed == 5 and settings.log_every == 3
  assert settings.train_steps == gin_cli.macro('TRAIN_STEPS')

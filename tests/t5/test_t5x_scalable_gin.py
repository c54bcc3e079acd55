"""T5X's `scalable_t5` gin files (t5_1_1, mt5, umt5), unchanged.

The files are written into a temporary directory laid out as a T5X checkout
(`t5x/examples/scalable_t5/...`, `t5x/configs/runs/...`), with the bindings
they make: `scan_layers = True`, `remat_policy = 'minimal'`, the optimizer,
partitioning (`PjitPartitioner.model_parallel_submesh`, the logical axis
rules), umT5's macro-built vocabulary size, its run files. A user's file on
top adds `param_scan_axis` and more partitioning. Each must parse to the
sizes T5X states, with a relative position table per layer.

umT5's `pretrain_*.gin` include `umt5/runs/pretraining_common.gin`, which
includes T5X's `t5x/configs/runs/pretrain_deterministic.gin` (and that
`pretrain.gin`): in a T5X checkout they are there, and are read (every
binding in them is training wiring, skipped). A copy of `scalable_t5/`
alone lacks them: the error names the missing file, the file including it
and `--gin_search_paths`.
"""

import numpy as np
import pytest

import spec_decode as sd
from spec_decode.t5 import gin_file

ROOT = 't5x/examples/scalable_t5'

BASE = """\
# {title} Base model.
from __gin__ import dynamic_registration

import seqio
from t5x import adafactor
from t5x import models
from t5x.examples.scalable_t5 import network

Z_LOSS = 0.0001
LABEL_SMOOTHING = 0.0
LOSS_NORMALIZING_FACTOR = None
DROPOUT_RATE = %gin.REQUIRED

VOCABULARY = @seqio.SentencePieceVocabulary()
seqio.SentencePieceVocabulary.sentencepiece_model_file = "{vocab}"

OPTIMIZER = @adafactor.Adafactor()
adafactor.Adafactor:
  decay_rate = 0.8
  step_offset = 0
  logical_factor_rules = @adafactor.standard_logical_factor_rules()

MODEL = @models.EncoderDecoderModel()
models.EncoderDecoderModel:
  module = @network.Transformer()
  input_vocabulary = %VOCABULARY
  output_vocabulary = %VOCABULARY
  optimizer_def = %OPTIMIZER
  z_loss = %Z_LOSS
  label_smoothing = %LABEL_SMOOTHING
  loss_normalizing_factor = %LOSS_NORMALIZING_FACTOR

network.Transformer.config = @network.T5Config()
network.T5Config:
  vocab_size = {vocab_size}  # vocab size rounded to a multiple of 128
  dtype = 'bfloat16'
  emb_dim = 768
  num_heads = 12
  num_encoder_layers = 12
  num_decoder_layers = 12
  head_dim = 64
  mlp_dim = 2048
  mlp_activations = ('gelu', 'linear')
  dropout_rate = %DROPOUT_RATE
  logits_via_embedding = False
  scan_layers = True
  remat_policy = 'minimal'
"""

SIZE = """\
# {title} {size} model.

include '{root}/{family}/base.gin'  # imports vocab, optimizer and model.

network.Transformer.config = @network.T5Config()
network.T5Config:
  emb_dim = {emb}
  num_heads = {heads}
  num_encoder_layers = {layers}
  num_decoder_layers = {layers}
  head_dim = {head_dim}
  mlp_dim = {mlp}
"""

UMT5_PRETRAIN = """\
from __gin__ import dynamic_registration

from t5x import partitioning

# Model (has to be imported first so that optimizer and vocab can be overridden)
include "{root}/mt5/{size}.gin"

# Architecture-specific configs
include "{root}/umt5/architectures/encoder_decoder.gin"

# Run mode
include "{root}/umt5/runs/pretraining_common.gin"

# Optimizer
include "{root}/umt5/optimizer/adafactor_momentum_nofactor.gin"

# Vocabulary
include "{root}/umt5/vocab.gin"

# Partitioning
partitioning.PjitPartitioner:
  model_parallel_submesh = (1, 1, 8, 1)

# Task configurations
MIXTURE_OR_TASK_NAME = %gin.REQUIRED
TRAIN_EVAL_MIXTURE_OR_TASK_NAME = %gin.REQUIRED
TASK_FEATURE_LENGTHS = {{"inputs": 1024, "targets": 229}}
USE_CACHED_TASKS = True
TRAIN_STEPS = 1_000_000

partitioning.standard_logical_axis_rules.activation_partitioning_dims = 1
partitioning.standard_logical_axis_rules.parameter_partitioning_dims = 2
"""

UMT5_FILES = {
  'umt5/architectures/encoder_decoder.gin': """\
from t5x.examples.scalable_t5 import network

# This macro should be set in the vocabulary gin file
network.T5Config.vocab_size = %VOCAB_SIZE
""",
  'umt5/vocab.gin': """\
VOCABULARY = @seqio.SentencePieceVocabulary()

seqio.SentencePieceVocabulary.sentencepiece_model_file = \
"gs://t5-data/vocabs/umt5.256000/sentencepiece.model"

seqio.SentencePieceVocabulary.extra_ids = 300

VOCAB_SIZE = 256384
""",
  'umt5/optimizer/adafactor_momentum_nofactor.gin': """\
from t5x import adafactor

OPTIMIZER = @adafactor.Adafactor()
adafactor.Adafactor:
  beta1 = 0.9
  factored = False
  global_norm_clip_threshold = 1.0
""",
  'umt5/runs/pretraining_common.gin': """\
# Common configurations for pretraining runs.
from __gin__ import dynamic_registration

import __main__ as train_script
from t5x import utils

include 't5x/configs/runs/pretrain_deterministic.gin'

TASK_FEATURE_LENGTHS = None
TRAIN_STEPS = 1_000_000
BATCH_SIZE = 1024
DROPOUT_RATE = 0.0
RANDOM_SEED = 0
LOSS_NORMALIZING_FACTOR = "NUM_REAL_TARGET_TOKENS"
USE_CACHED_TASKS_TRAIN_EVAL = False

train/utils.DatasetConfig:
  pack = False
  use_cached = True

train_eval/utils.DatasetConfig:
  mixture_or_task_name = %TRAIN_EVAL_MIXTURE_OR_TASK_NAME
  pack = False
  use_cached = %USE_CACHED_TASKS_TRAIN_EVAL

train_script.train:
  eval_period = 2000
  stats_period = 500
  eval_steps = 20
  random_seed = 0
  train_eval_get_dataset_fn = @utils.get_training_eval_datasets

utils.get_training_eval_datasets:
  deterministic = False

utils.SaveCheckpointConfig:
  period = 2000

train/utils.DatasetConfig.seed = 42
""",
}

# T5X's run files the umT5 run mode includes (their relevant content).
RUN_FILES = {
  'pretrain_deterministic.gin': """\
from __gin__ import dynamic_registration
include 't5x/configs/runs/pretrain.gin'

import __main__ as train_script
from t5x import utils

USE_HARDWARE_RNG = False
RANDOM_SEED = 0
SHUFFLE_TRAIN_EXAMPLES = False

train_script.train.get_dataset_fn = @utils.get_deterministic_dataset

utils.get_deterministic_dataset:
  model_dir = %MODEL_DIR
  start_step = 0

train/utils.DatasetConfig.pack = False
""",
  'pretrain.gin': """\
from __gin__ import dynamic_registration

import __main__ as train_script
from t5x import partitioning
from t5x import utils
from t5x import trainer

MIXTURE_OR_TASK_NAME = %gin.REQUIRED
TASK_FEATURE_LENGTHS = %gin.REQUIRED
TRAIN_STEPS = %gin.REQUIRED
MODEL_DIR = %gin.REQUIRED

train_script.train:
  model = %MODEL  # imported from separate gin file
  model_dir = %MODEL_DIR
  train_dataset_cfg = @train/utils.DatasetConfig()
  partitioner = @partitioning.ModelBasedPjitPartitioner()
  trainer_cls = @trainer.Trainer
  total_steps = %TRAIN_STEPS

partitioning.ModelBasedPjitPartitioner:
  num_partitions = 1
  model_parallel_submesh = ()

train/utils.DatasetConfig:
  mixture_or_task_name = %MIXTURE_OR_TASK_NAME
  batch_size = 128
  pack = True
""",
}

# T5X's sizes (t5_1_1 and mt5 alike): emb, heads, layers, head_dim, mlp.
SIZES = {
  'small': (512, 6, 8, 64, 1024),
  'base': (768, 12, 12, 64, 2048),
  'large': (1024, 16, 24, 64, 2816),
  'xl': (2048, 32, 24, 64, 5120),
  'xxl': (4096, 64, 24, 64, 10240),
}
FAMILIES = {  # family: (title, vocabulary, embedding rows)
  't5_1_1': ('T5.1.1', 'gs://t5-data/vocabs/cc_all.32000.100extra/'
             'sentencepiece.model', 32128),
  'mt5': ('MT5', 'gs://t5-data/vocabs/mc4.250000.100extra/'
          'sentencepiece.model', 250112),
}  # fmt: skip


def _checkout(root, run_files=True):
  """A T5X checkout under `root` with the scalable_t5 files; returns it."""
  files = {}
  for family, (title, vocab, rows) in FAMILIES.items():
    files[f'{ROOT}/{family}/base.gin'] = BASE.format(
      title=title, vocab=vocab, vocab_size=rows
    )
    for size, (emb, heads, layers, head_dim, mlp) in SIZES.items():
      if size != 'base':
        files[f'{ROOT}/{family}/{size}.gin'] = SIZE.format(
          title=title, size=size, root=ROOT, family=family, emb=emb,
          heads=heads, layers=layers, head_dim=head_dim, mlp=mlp,
        )  # fmt: skip
  for size in SIZES:
    files[f'{ROOT}/umt5/pretrain_{size}.gin'] = UMT5_PRETRAIN.format(
      root=ROOT, size=size
    )
  files.update({f'{ROOT}/{k}': v for k, v in UMT5_FILES.items()})
  if run_files:
    files.update({f't5x/configs/runs/{k}': v for k, v in RUN_FILES.items()})
  for name, text in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return root


def _file(family, size):
  if family == 'umt5':
    return f'{ROOT}/umt5/pretrain_{size}.gin'
  return f'{ROOT}/{family}/{size}.gin'


@pytest.fixture(scope='module')
def checkout(tmp_path_factory):
  return _checkout(tmp_path_factory.mktemp('t5x_checkout'))


@pytest.mark.parametrize('size', sorted(SIZES))
@pytest.mark.parametrize('family', ['t5_1_1', 'mt5', 'umt5'])
def test_scalable_t5_files_parse_to_t5x_sizes(checkout, family, size):
  cfg = sd.T5Config.from_gin(_file(family, size), search_paths=[checkout])
  emb, heads, layers, head_dim, mlp = SIZES[size]
  assert (cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (
    emb, heads, head_dim, mlp,
  )  # fmt: skip
  assert cfg.num_encoder_layers == cfg.num_decoder_layers == layers
  rows = {'t5_1_1': 32128, 'mt5': 250112, 'umt5': 256384}[family]
  assert cfg.vocab_size == rows and cfg.mlp_activations == ('gelu', 'linear')
  assert cfg.dtype == np.dtype('bfloat16') and cfg.dropout_rate == 0.0
  assert cfg.per_layer_relpos_bias and not cfg.logits_via_embedding


def test_what_is_skipped_and_the_vocabulary(checkout):
  mf = gin_file.read(
    str(checkout / _file('umt5', 'xxl')), search_paths=[str(checkout)]
  )
  assert mf.vocabulary == 'gs://t5-data/vocabs/umt5.256000/sentencepiece.model'
  assert mf.extra_ids == 300 and mf.local_vocabulary() is None
  for binding in (
    'network.T5Config.scan_layers',
    'network.T5Config.remat_policy',
    'partitioning.PjitPartitioner.model_parallel_submesh',
    'partitioning.standard_logical_axis_rules.parameter_partitioning_dims',
    'partitioning.ModelBasedPjitPartitioner.num_partitions',  # pretrain.gin
    'utils.get_deterministic_dataset.model_dir',  # pretrain_deterministic
    'adafactor.Adafactor.factored',
  ):
    assert binding in mf.skipped, binding


def test_a_users_file_on_top(checkout, tmp_path):
  """param_scan_axis and partitioning a user adds are skipped by name."""
  mine = tmp_path / 'finetune_mt5_xl.gin'
  mine.write_text(
    'from __gin__ import dynamic_registration\n'
    'from t5x import partitioning\n'
    'from t5x.examples.scalable_t5 import network\n'
    f"include '{_file('mt5', 'xl')}'\n"
    'network.T5Config.param_scan_axis = 1\n'
    "network.T5Config.remat_policy = 'full'\n"
    'network.T5Config.dropout_rate = 0.1\n'
    'partitioning.PjitPartitioner.num_partitions = 4\n'
    'partitioning.PjitPartitioner.logical_axis_rules = \\\n'
    '    @partitioning.standard_logical_axis_rules()\n'
  )
  mf = gin_file.read(str(mine), search_paths=[str(checkout)])
  assert 'network.T5Config.param_scan_axis' in mf.skipped
  assert 'partitioning.PjitPartitioner.num_partitions' in mf.skipped
  cfg = sd.T5Config.from_model_file(mf)
  assert cfg.emb_dim == 2048 and cfg.vocab_size == 250112
  assert cfg.dropout_rate == 0.1 and cfg.per_layer_relpos_bias


def test_umt5_without_t5x_run_files_names_the_missing_include(tmp_path):
  """A copy of scalable_t5/ alone: umT5's run mode includes T5X's
  pretrain_deterministic.gin, which is not there."""
  root = _checkout(tmp_path, run_files=False)
  with pytest.raises(FileNotFoundError) as e:
    sd.T5Config.from_gin(str(root / _file('umt5', 'base')))
  msg = str(e.value)
  assert 't5x/configs/runs/pretrain_deterministic.gin' in msg
  assert 'pretraining_common.gin' in msg and '--gin_search_paths' in msg
  # The mt5 size file alone (no run mode) needs none of them.
  cfg = sd.T5Config.from_gin(str(root / _file('mt5', 'base')))
  assert cfg.vocab_size == 250112

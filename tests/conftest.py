"""Shared tiny models for the CPU test suite."""

import gc
import json
import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# The suite's time is mostly XLA:CPU compiling many small programs. Without
# LLVM's expensive passes (backend optimization level 0) they compile about
# twice as fast and run slower, which the tiny test programs barely feel:
# measured, the test files take 1.3x-2x less time. The processes the tests
# start inherit it. No fast-math either way; JAX_DISABLE_MOST_OPTIMIZATIONS=0
# runs the tests fully optimized.
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import spec_decode as sd  # noqa: E402

# The repository root (tests live in subfolders mirroring the package).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

jax.config.update('jax_enable_x64', False)


@pytest.fixture(autouse=True)
def _optimized_when_marked(request):
  """Full XLA optimizations for a test marked `optimized`.

  The suite compiles unoptimized (above) because most tests mostly
  compile; a test that mostly runs (many samples at V = 32128) is several
  times slower that way (measured: the verify test at T5's vocabulary,
  18 s against 112 s).
  """
  if request.node.get_closest_marker('optimized') is None:
    yield
    return
  before = jax.config.read('jax_disable_most_optimizations')
  jax.config.update('jax_disable_most_optimizations', False)
  try:
    yield
  finally:
    jax.config.update('jax_disable_most_optimizations', before)


@pytest.fixture(autouse=True, scope='module')
def _release_compiled_programs():
  """Drops JAX's compiled executables after each test module.

  Every XLA:CPU executable holds a few hundred memory mappings; the whole
  suite in one process compiles enough of them to reach the kernel's
  `vm.max_map_count` (65530), and the next compilation then segfaults.
  """
  yield
  jax.clear_caches()
  gc.collect()


def tiny_config(vocab_size: int = 16, **overrides) -> sd.T5Config:
  base = dict(
    vocab_size=vocab_size,
    emb_dim=32,
    num_heads=2,
    head_dim=16,
    mlp_dim=64,
    num_encoder_layers=2,
    num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'),
    dropout_rate=0.0,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=20,
  )
  base.update(overrides)
  return sd.T5Config(**base)


def perturbed(model: sd.Model, scale: float, seed: int) -> sd.Model:
  """A different model near `model`: every weight gets relative noise."""
  leaves, tree = jax.tree.flatten(model.params)
  rng = np.random.default_rng(seed)
  noisy = [
    np.asarray(x)
    + scale
    * np.std(np.asarray(x))
    * rng.standard_normal(x.shape).astype(np.float32)
    for x in leaves
  ]
  return model.with_params(jax.tree.unflatten(tree, noisy))


def encoder_batch(
  batch: int, length: int, vocab_size: int, seed: int = 0
) -> np.ndarray:
  """Random inputs with ragged padding (at least 2 real tokens per row)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, vocab_size, (batch, length)).astype(np.int32)
  lengths = rng.integers(2, length + 1, batch)
  tokens[np.arange(length)[None, :] >= lengths[:, None]] = 0
  return tokens


def sharpened(
  model: sd.Model, scale: float = 3.0, eos_scale: float = 3.0
) -> sd.Model:
  """Peakier output distributions, and EOS likely enough to end rows.

  Random initializations give near-uniform next-token distributions whose
  argmax flips under any perturbation and which rarely pick EOS; scaling the
  output kernel (and its EOS column more) gives rows that stop at different
  lengths and drafts that agree often but not always.
  """
  params = jax.tree.map(np.array, model.params)
  kernel = params['decoder']['logits_dense']['kernel'] * scale
  kernel[:, sd.EOS_ID] *= eos_scale
  params['decoder']['logits_dense']['kernel'] = kernel
  return model.with_params(params)


# Drafts' training tests load their target from a path: a tiny sharpened
# network with a sentencepiece vocabulary trained on the synthetic EnDe texts.
SYNTHETIC_PIECES = 68
SYNTHETIC_EXTRA_IDS = 100


@pytest.fixture(scope='module')
def synthetic_target_dir(tmp_path_factory) -> str:
  """Saves the tiny target with the synthetic vocabulary; returns its path."""
  from spec_decode.data import spm_trainer  # pylint: disable=g-import-not-at-top
  from spec_decode.data import tasks  # pylint: disable=g-import-not-at-top

  def texts():
    for source, target in tasks.synthetic_reader('ende')('train'):
      yield tasks.TRANSLATE_EN_DE_PREFIX + source
      yield target

  vocab_size = SYNTHETIC_PIECES + SYNTHETIC_EXTRA_IDS
  vocab = sd.Vocabulary(
    spm_trainer.train_sentencepiece(
      texts(), vocab_size=vocab_size, extra_ids=SYNTHETIC_EXTRA_IDS
    ),
    extra_ids=SYNTHETIC_EXTRA_IDS,
  )
  m = sd.Model.init(tiny_config(vocab_size=vocab_size), seed=2)
  m = sharpened(m, scale=2.0, eos_scale=1.0)
  path = str(tmp_path_factory.mktemp('target') / 'target')
  sd.Model(m.config, m.params, vocab).save(path)
  return path


def training_log(model_dir: str) -> list[dict]:
  """The records a training run wrote to its JSON-lines log."""
  from spec_decode.train import common  # pylint: disable=g-import-not-at-top

  with open(os.path.join(model_dir, common.LOG_FILE)) as f:
    return [json.loads(line) for line in f]


def train_from_gin(tmp_path, entry: str, settings: dict):
  """Runs `spec-decode train` (`train.cli.main`) on a gin file binding
  `entry` (e.g. 'feature.train_feature', a module of `spec_decode.train`)
  with `settings` and `model_dir = %MODEL_DIR`; returns the model dir."""
  import gin  # pylint: disable=g-import-not-at-top
  from spec_decode.train import cli  # pylint: disable=g-import-not-at-top

  module = entry.split('.')[0]
  lines = [
    'from __gin__ import dynamic_registration',
    f'from spec_decode.train import {module}',
    'MODEL_DIR = %gin.REQUIRED',
    f'{entry}:',
    '  model_dir = %MODEL_DIR',
  ] + [f'  {k} = {v!r}' for k, v in settings.items()]
  gin_file = tmp_path / f'{module}.gin'
  gin_file.write_text('\n'.join(lines) + '\n')
  model_dir = tmp_path / 'run'
  try:
    code = cli.main(
      ['--gin_file', str(gin_file), '--model_dir', str(model_dir)]
    )
  finally:
    gin.clear_config()
  assert code == 0
  return model_dir


@pytest.fixture(scope='session')
def target():
  return sharpened(sd.Model.init(tiny_config(), seed=0))


@pytest.fixture(scope='session')
def near_draft(target):
  """A draft close to the target: acceptance is mixed (alpha ~ 0.5-0.8)."""
  return perturbed(target, 0.1, seed=1)


@pytest.fixture(scope='session')
def far_draft():
  return sd.Model.init(
    tiny_config(num_decoder_layers=1, num_encoder_layers=1), seed=7
  )

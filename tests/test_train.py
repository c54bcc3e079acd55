"""Tests of `spec-decode train` and the demo tokenizer builder (CPU, tiny)."""

import json
import os

import jax
import numpy as np
import pytest
from conftest import tiny_config

import gin
from spec_decode import checkpoints
from spec_decode.checkpoints import gin_model
from spec_decode.data import spm_trainer
from spec_decode.data import tasks
from spec_decode.models import t5_model
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.config import T5Config
from spec_decode.train import lm as train_lib

EXTRA_IDS = 100
PIECES = 68
BUCKETS = ((64, 64, 8),)


def _synthetic_texts():
  for source, target in tasks.synthetic_reader('ende')('train'):
    yield tasks.TRANSLATE_EN_DE_PREFIX + source
    yield target


@pytest.fixture(scope='module')
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp('vocab') / 'spiece.model'
  model = spm_trainer.train_sentencepiece(
    _synthetic_texts(), vocab_size=PIECES + EXTRA_IDS, extra_ids=EXTRA_IDS
  )
  path.write_bytes(model)
  return str(path)


def _config(**overrides):
  return tiny_config(vocab_size=PIECES + EXTRA_IDS, **overrides)


def _train(model_dir, vocab_file, **kwargs):
  args = dict(
    model_dir=str(model_dir),
    model_config=_config(),
    vocabulary_file=vocab_file,
    task='synthetic_tiny',
    train_steps=4,
    buckets=BUCKETS,
    learning_rate=3e-3,
    warmup_steps=2,
    eval_every=0,
    eval_examples=16,
    checkpoint_every=2,
    log_every=1,
    progress=False,
  )
  args.update(kwargs)
  return train_lib.train(**args)


def _log(model_dir):
  with open(os.path.join(model_dir, train_lib.LOG_FILE)) as f:
    return [json.loads(line) for line in f]


# ------------------------------------------------------------- tokenizer.


def test_tokenizer_is_deterministic_with_t5_ids():
  a = spm_trainer.train_sentencepiece(
    _synthetic_texts(), vocab_size=140, extra_ids=EXTRA_IDS
  )
  b = spm_trainer.train_sentencepiece(
    _synthetic_texts(), vocab_size=140, extra_ids=EXTRA_IDS
  )
  assert a == b
  vocabulary = vocab_lib.Vocabulary(a, extra_ids=EXTRA_IDS)
  assert vocabulary.vocab_size == 140
  assert vocabulary.base_vocab_size == 40
  text = 'the small cat sees a dog .'
  assert vocabulary.decode(vocabulary.encode(text)) == text
  assert vocabulary.encode_batch([text])[0, len(vocabulary.encode(text))] == 1


def test_tokenizer_build_reads_debian_train_splits(tmp_path):
  data = tmp_path / 'debian'
  header = 'id\tsource\ttarget\n'
  rows = {
    'ende': [
      ('a:s', 'the red house', 'das rote Haus'),
      ('b:s', 'a small dog', 'ein kleiner Hund'),
    ],
    'summarize': [('c', 'the old cat sees a bird today', 'the old cat')],
  }
  for kind, items in rows.items():
    (data / kind).mkdir(parents=True)
    lines = ''.join('\t'.join(r) + '\n' for r in items * 40)
    (data / kind / 'lm.tsv').write_text(header + lines)
  out = tmp_path / 'out' / 'spiece.model'
  vocabulary = spm_trainer.build(str(out), data_dir=str(data), vocab_size=125)
  assert out.is_file()
  assert vocabulary.vocab_size == 125
  assert vocabulary.decode(vocabulary.encode('das rote Haus')) == (
    'das rote Haus'
  )
  assert (
    spm_trainer.main(
      [
        '--data_dir',
        str(data),
        '--output',
        str(tmp_path / 'again.model'),
        '--vocab_size',
        '125',
      ]
    )
    == 0
  )
  assert (tmp_path / 'again.model').read_bytes() == out.read_bytes()


def test_tokenizer_missing_data_says_how_to_build(tmp_path, capsys):
  code = spm_trainer.main(
    [
      '--data_dir',
      str(tmp_path / 'none'),
      '--output',
      str(tmp_path / 'x.model'),
    ]
  )
  assert code == 1
  assert 'spec_decode.data.debian' in capsys.readouterr().err


# ------------------------------------------------------------------ data.


def test_bucketed_batches_are_fixed_shape_and_deterministic(vocab_file):
  vocabulary = vocab_lib.Vocabulary.from_file(vocab_file)
  examples = train_lib.tokenize_split('synthetic_tiny', 'train', vocabulary)
  data = train_lib.BucketedData(examples, ((40, 40, 4), (64, 64, 8)), seed=3)
  assert data.num_examples + data.dropped == len(examples)
  again = train_lib.BucketedData(examples, ((64, 64, 8), (40, 40, 4)), seed=3)
  shapes = set()
  for step in (0, 1, data.batches_per_epoch + 2):
    b = data.batch(step)
    shapes.add((b.inputs.shape, b.targets.shape))
    np.testing.assert_array_equal(b.inputs, again.batch(step).inputs)
    np.testing.assert_array_equal(b.targets, again.batch(step).targets)
    # Every non-empty row ends with EOS before its padding.
    for row in b.targets:
      n = np.count_nonzero(row)
      if n:
        assert row[n - 1] == vocabulary.eos_id
  assert shapes <= {((4, 40), (4, 40)), ((8, 64), (8, 64))}
  # Each example appears once per epoch.
  seen = sum(
    np.count_nonzero(data.batch(s).targets.any(axis=1))
    for s in range(data.batches_per_epoch)
  )
  assert seen == data.num_examples


def test_cross_entropy_masks_nothing_itself_and_smoothing_is_shifted():
  logits = jax.random.normal(jax.random.key(0), (2, 3, 7))
  targets = np.array([[1, 2, 0], [3, 4, 5]])
  ce = np.asarray(train_lib.cross_entropy(logits, targets))
  logp = np.asarray(jax.nn.log_softmax(logits))
  expected = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(ce, expected, rtol=1e-5)
  # A (near) perfect prediction has (near) zero smoothed loss.
  smooth = 0.1
  probs = np.full((1, 1, 7), smooth / 6)
  probs[0, 0, 2] = 1 - smooth
  loss = train_lib.cross_entropy(np.log(probs), np.array([[2]]), smooth)
  np.testing.assert_allclose(np.asarray(loss), 0.0, atol=1e-5)
  kl = train_lib.kl_to_teacher(logits, logits)
  np.testing.assert_allclose(np.asarray(kl), 0.0, atol=1e-6)


# ----------------------------------------------------------------- train.


def test_training_reduces_the_loss(tmp_path, vocab_file):
  result = _train(
    tmp_path, vocab_file, train_steps=30, eval_every=30, checkpoint_every=100
  )
  log = [r for r in _log(tmp_path) if 'loss' in r]
  first = np.mean([r['loss'] for r in log[:3]])
  last = np.mean([r['loss'] for r in log[-3:]])
  assert last < 0.8 * first, (first, last)
  assert result.stopped == 'done' and result.step == 30
  model = checkpoints.load(result.model_path)
  assert model.config.dropout_rate == 0.0
  assert model.vocabulary == vocab_lib.Vocabulary.from_file(vocab_file)


def test_resume_continues_at_the_right_step_with_identical_state(
  tmp_path, vocab_file, monkeypatch
):
  straight = _train(tmp_path / 'straight', vocab_file)
  assert straight.step == 4

  original = train_lib.BucketedData.batch

  def interrupt_at_2(self, step):
    if step == 2:
      raise KeyboardInterrupt
    return original(self, step)

  resumed_dir = tmp_path / 'resumed'
  monkeypatch.setattr(train_lib.BucketedData, 'batch', interrupt_at_2)
  stopped = _train(resumed_dir, vocab_file)
  assert (stopped.stopped, stopped.step) == ('interrupted', 2)
  monkeypatch.setattr(train_lib.BucketedData, 'batch', original)

  seen = []

  def record(self, step):
    seen.append(step)
    return original(self, step)

  monkeypatch.setattr(train_lib.BucketedData, 'batch', record)
  final = _train(resumed_dir, vocab_file)
  assert seen == [2, 3]
  assert (final.stopped, final.step) == ('done', 4)

  a = checkpoints.load(straight.model_path)
  b = checkpoints.load(final.model_path)
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7),
    a.params,
    b.params,
  )
  # The optimizer state was restored too (not re-initialized).
  opt = train_lib.make_optimizer(3e-3, 4, 2)
  model = checkpoints.load(straight.model_path)
  abstract = jax.eval_shape(
    lambda: train_lib.TrainState(
      step=np.int32(0), params=model.params, opt_state=opt.init(model.params)
    )
  )
  s1 = train_lib.restore_state(str(tmp_path / 'straight'), abstract)
  s2 = train_lib.restore_state(str(resumed_dir), abstract)
  assert int(s1.step) == int(s2.step) == 4
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7),
    s1.opt_state,
    s2.opt_state,
  )
  # Rerunning a finished run changes nothing.
  seen.clear()
  again = _train(resumed_dir, vocab_file)
  assert (again.stopped, again.step, seen) == ('done', 4, [])


def _random_teacher(path, vocab_file, **overrides):
  """An untrained model in `Model.save` format (a stand-in teacher)."""
  config = _config(**overrides)
  params = t5_model.Model.init(config, seed=5).params
  train_lib.export_model(
    params, config, vocab_lib.Vocabulary.from_file(vocab_file), str(path)
  )
  return str(path)


def test_distillation_from_a_teacher_and_bfloat16_export(tmp_path, vocab_file):
  teacher = _random_teacher(tmp_path / 'teacher', vocab_file)
  student = _train(
    tmp_path / 'student',
    vocab_file,
    train_steps=2,
    model_config=_config(emb_dim=16, num_decoder_layers=1),
    teacher_path=teacher,
    distill_weight=0.5,
    distill_temperature=2.0,
    save_dtype='bfloat16',
  )
  assert student.stopped == 'done'
  stored = checkpoints.load(student.model_path)
  assert stored.config.param_dtype == np.dtype('bfloat16')
  assert stored.config.dtype == np.dtype('float32')
  leaf = jax.tree.leaves(stored.params)[0]
  assert leaf.dtype == np.dtype('bfloat16')
  as_fp32 = checkpoints.load(student.model_path, dtype='float32')
  assert jax.tree.leaves(as_fp32.params)[0].dtype == np.float32


def test_distillation_rejects_another_vocabulary(tmp_path, vocab_file):
  other = tmp_path / 'other.model'
  other.write_bytes(
    spm_trainer.train_sentencepiece(
      (t.upper() for t in _synthetic_texts()),
      vocab_size=PIECES + EXTRA_IDS,
      extra_ids=EXTRA_IDS,
    )
  )
  teacher = _random_teacher(tmp_path / 'teacher', str(other))
  with pytest.raises(ValueError, match='vocabularies differ'):
    _train(
      tmp_path / 'student', vocab_file, train_steps=1, teacher_path=teacher
    )


# ------------------------------------------------------------- gin / CLI.


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.parametrize(
  'name, model_file',
  [
    ('configs/train_demo_target.gin', 'models/demo/target.gin'),
    ('configs/train_demo_draft.gin', 'models/demo/draft.gin'),
  ],
)
def test_train_configs_parse(clean_gin, name, model_file):
  train_lib.parse_gin([name], ["MODEL_DIR = '/tmp/x'"])
  assert gin.query_parameter('lm.train.task') == 'debian_ende'
  assert gin.query_parameter('%MODEL_DIR') == '/tmp/x'
  cfg = gin.get_configurable(T5Config)()
  assert cfg == gin_model.config_from_gin(model_file)
  assert cfg.mlp_activations == ('gelu', 'linear')
  assert cfg.vocab_size >= spm_trainer.DEFAULT_VOCAB_SIZE


def test_demo_draft_is_much_cheaper_per_step_than_the_target():
  from spec_decode.bench import speed  # pylint: disable=g-import-not-at-top

  target = t5_model.Model.from_gin('models/demo/target.gin')
  draft = t5_model.Model.from_gin('models/demo/draft.gin')
  ratio = speed.decoder_step_bytes(draft) / speed.decoder_step_bytes(target)
  assert ratio < 0.1


def test_split_gin_args():
  bindings, rest = train_lib.split_gin_args(
    ['--gin.TRAIN_STEPS=3', '--model_dir', 'd', '--gin.A', "'x'"]
  )
  assert bindings == ['TRAIN_STEPS = 3', "A = 'x'"]
  assert rest == ['--model_dir', 'd']


def test_main_with_gin_file_and_flags(clean_gin, tmp_path, vocab_file):
  cfg = _config()
  gin_file = tmp_path / 'run.gin'
  gin_file.write_text(
    'from __gin__ import dynamic_registration\n'
    'from spec_decode.t5 import config\n'
    'from spec_decode.train import lm\n'
    "include 'models/t5_1_1/tiny.gin'\n"
    'MODEL_DIR = %gin.REQUIRED\n'
    'config.T5Config:\n'
    f'  vocab_size = {cfg.vocab_size}\n'
    'lm.train:\n'
    '  model_dir = %MODEL_DIR\n'
    '  model_config = @config.T5Config()\n'
    f"  vocabulary_file = '{vocab_file}'\n"
    "  task = 'synthetic_tiny'\n"
    f'  buckets = {BUCKETS!r}\n'
    '  train_steps = 100\n'
    '  eval_examples = 8\n'
    '  progress = False\n'
  )
  model_dir = tmp_path / 'run'
  code = train_lib.main(
    [
      f'--gin_file={gin_file}',
      f'--model_dir={model_dir}',
      '--gin.train.train.train_steps=2',
    ]
  )
  assert code == 0
  assert (model_dir / train_lib.CONFIG_FILE).is_file()
  model = checkpoints.load(str(model_dir / train_lib.MODEL_DIR))
  assert model.config.emb_dim == 8
  assert [r['step'] for r in _log(model_dir) if 'loss' in r] == [2]

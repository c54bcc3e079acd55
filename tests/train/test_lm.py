"""Tests of `spec-decode train` and the demo tokenizer builder (CPU, tiny)."""

import json
import os
import re
import signal
import time

import jax
import numpy as np
import pytest
from conftest import tiny_config

import gin
from spec_decode import gin_cli
from spec_decode.chain import generation
from spec_decode.data import debian
from spec_decode.data import spm_trainer
from spec_decode.data import tasks
from spec_decode.models import t5_model
from spec_decode.t5 import vocab as vocab_lib
from spec_decode.t5.config import T5Config
from spec_decode.train import cli as train_cli
from spec_decode.train import common
from spec_decode.train import heads as train_heads
from spec_decode.train import lm

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
  return lm.train(**args)


def _log(model_dir):
  with open(os.path.join(model_dir, common.LOG_FILE)) as f:
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
    (data / kind / 'train.tsv').write_text(header + lines)
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
  build = debian.BUILD_COMMAND.format(out_dir=str(tmp_path / 'none'))
  assert build in capsys.readouterr().err


# ------------------------------------------------------------------ data.


def test_bucketed_batches_are_fixed_shape_and_deterministic(vocab_file):
  vocabulary = vocab_lib.Vocabulary.from_file(vocab_file)
  examples = common.tokenize_split('synthetic_tiny', 'train', vocabulary)
  data = common.BucketedData(examples, ((40, 40, 4), (64, 64, 8)), seed=3)
  assert data.num_examples + data.dropped == len(examples)
  again = common.BucketedData(examples, ((64, 64, 8), (40, 40, 4)), seed=3)
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
  ce = np.asarray(lm.cross_entropy(logits, targets))
  logp = np.asarray(jax.nn.log_softmax(logits))
  expected = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(ce, expected, rtol=1e-5)
  # A (near) perfect prediction has (near) zero smoothed loss.
  smooth = 0.1
  probs = np.full((1, 1, 7), smooth / 6)
  probs[0, 0, 2] = 1 - smooth
  loss = lm.cross_entropy(np.log(probs), np.array([[2]]), smooth)
  np.testing.assert_allclose(np.asarray(loss), 0.0, atol=1e-5)
  kl = common.kl_to_teacher(logits, logits)
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
  model = t5_model.Model.load(result.model_path)
  assert model.config.dropout_rate == 0.0
  assert model.vocabulary == vocab_lib.Vocabulary.from_file(vocab_file)


def test_resume_continues_at_the_right_step_with_identical_state(
  tmp_path, vocab_file, monkeypatch
):
  straight = _train(tmp_path / 'straight', vocab_file)
  assert straight.step == 4

  original = common.BucketedData.batch

  def interrupt_at_2(self, step):
    if step == 2:
      raise KeyboardInterrupt
    return original(self, step)

  resumed_dir = tmp_path / 'resumed'
  monkeypatch.setattr(common.BucketedData, 'batch', interrupt_at_2)
  stopped = _train(resumed_dir, vocab_file)
  assert (stopped.stopped, stopped.step) == ('interrupted', 2)
  monkeypatch.setattr(common.BucketedData, 'batch', original)

  seen = []

  def record(self, step):
    seen.append(step)
    return original(self, step)

  monkeypatch.setattr(common.BucketedData, 'batch', record)
  final = _train(resumed_dir, vocab_file)
  assert seen == [2, 3]
  assert (final.stopped, final.step) == ('done', 4)

  a = t5_model.Model.load(straight.model_path)
  b = t5_model.Model.load(final.model_path)
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7),
    a.params,
    b.params,
  )
  # The optimizer state was restored too (not re-initialized).
  opt = common.make_optimizer(3e-3, 4, 2)
  model = t5_model.Model.load(straight.model_path)
  abstract = jax.eval_shape(
    lambda: common.TrainState(
      step=np.int32(0), params=model.params, opt_state=opt.init(model.params)
    )
  )
  s1 = common.restore_state(str(tmp_path / 'straight'), abstract)
  s2 = common.restore_state(str(resumed_dir), abstract)
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


def test_train_loop_checkpoints_on_sigterm_and_on_the_time_budget(tmp_path):
  model_dir = str(tmp_path)
  optimizer = common.make_optimizer(0.1, 10, 2)

  def init():
    return common.init_or_restore(
      model_dir, lambda: {'w': np.zeros(3, np.float32)}, optimizer
    )

  terms = []

  def step(state, target):
    if target == 3 and not terms:  # Batch `step` is the number `step`.
      terms.append(target)
      os.kill(os.getpid(), signal.SIGTERM)
    return common.apply_gradients(
      state, optimizer, lambda p: (jax.numpy.sum((p['w'] - target) ** 2), {})
    )

  def run(max_minutes):
    settings = common.LoopSettings(10, 0, 100, 2, 1, max_minutes, False)
    state, _ = init()
    return common.train_loop(
      state,
      lambda s: s,
      step,
      lambda params: {'w0': float(params['w'][0])},
      model_dir,
      settings,
      log_fields=lambda aux: {},
      postfix=lambda record, validation: {},
    )

  state, resumed = init()
  assert not resumed and int(state.step) == 0
  stopped = run(None)
  assert (stopped.stopped, int(stopped.state.step)) == ('interrupted', 3)
  assert [r['step'] for r in _log(model_dir)] == [1, 2, 3, 3]
  assert _log(model_dir)[-1]['w0'] == stopped.validation['w0'] != 0.0
  state, resumed = init()  # The SIGTERM checkpoint.
  assert resumed and int(state.step) == 3
  timed = run(1e-9)
  assert (timed.stopped, int(timed.state.step)) == ('time', 4)
  assert timed.train_loss == _log(model_dir)[-2]['loss']
  assert int(init()[0].step) == 4


def test_train_loop_stops_at_the_deadline_and_checkpoints(tmp_path, capsys):
  model_dir = str(tmp_path)
  optimizer = common.make_optimizer(0.1, 10, 2)
  state, _ = common.init_or_restore(
    model_dir, lambda: {'w': np.zeros(3, np.float32)}, optimizer
  )

  def step(state, target):
    return common.apply_gradients(
      state, optimizer, lambda p: (jax.numpy.sum((p['w'] - target) ** 2), {})
    )

  # A past deadline: one step, then the loop stops as on max_minutes.
  settings = common.LoopSettings(
    10, 0, 100, 2, 1, 60.0, False, deadline=time.time() - 1.0
  )
  result = common.train_loop(
    state,
    lambda s: s,
    step,
    lambda params: {'w0': float(params['w'][0])},
    model_dir,
    settings,
    log_fields=lambda aux: {},
    postfix=lambda record, validation: {},
  )
  assert (result.stopped, int(result.state.step)) == ('time', 1)
  assert 'the deadline reached at step 1' in capsys.readouterr().out
  restored, resumed = common.init_or_restore(
    model_dir, lambda: {'w': np.zeros(3, np.float32)}, optimizer
  )
  assert resumed and int(restored.step) == 1


def _random_teacher(path, vocab_file, **overrides):
  """An untrained model in `Model.save` format (a stand-in teacher)."""
  config = _config(**overrides)
  params = t5_model.Model.init(config, seed=5).params
  lm.export_model(
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
  stored = t5_model.Model.load(student.model_path)
  assert stored.config.param_dtype == np.dtype('bfloat16')
  assert stored.config.dtype == np.dtype('float32')
  leaf = jax.tree.leaves(stored.params)[0]
  assert leaf.dtype == np.dtype('bfloat16')
  as_fp32 = t5_model.Model.load(student.model_path, dtype='float32')
  assert jax.tree.leaves(as_fp32.params)[0].dtype == np.float32


def test_init_from_starts_a_new_run_at_a_saved_models_parameters(
  tmp_path, vocab_file
):
  first = _train(tmp_path / 'first', vocab_file, train_steps=6)
  # No steps: the exported model is the starting point itself.
  warm = _train(
    tmp_path / 'warm', vocab_file, train_steps=0, init_from=first.model_path
  )
  a = t5_model.Model.load(first.model_path).params
  b = t5_model.Model.load(warm.model_path).params
  jax.tree.map(np.testing.assert_array_equal, a, b)
  # Negative control: without init_from the run starts elsewhere.
  cold = _train(tmp_path / 'cold', vocab_file, train_steps=0)
  c = t5_model.Model.load(cold.model_path).params
  assert not all(
    np.array_equal(x, y)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(c), strict=True)
  )
  # Another network is refused before anything is tokenized or compiled.
  with pytest.raises(ValueError, match='do not have the shapes'):
    _train(
      tmp_path / 'bad',
      vocab_file,
      model_config=_config(emb_dim=16),
      init_from=first.model_path,
    )


def test_sequence_distillation_trains_on_the_teacher_greedy_outputs(
  tmp_path, vocab_file
):
  teacher_dir = _random_teacher(tmp_path / 'teacher', vocab_file)
  student_dir = tmp_path / 'student'
  run = _train(
    student_dir,
    vocab_file,
    train_steps=1,
    train_examples=8,
    model_config=_config(emb_dim=16, num_decoder_layers=1),
    teacher_path=teacher_dir,
    distill_targets='teacher_greedy',
  )
  assert run.stopped == 'done'
  cached = np.load(student_dir / 'teacher_greedy.npz')
  teacher = t5_model.Model.load(teacher_dir, dtype='float32')
  vocab = teacher.vocabulary
  pairs = common.tokenize_split('synthetic_tiny', 'train', vocab, 8)
  enc = np.zeros((1, 64), np.int32)
  enc[0, : len(pairs[3][0])] = pairs[3][0]
  want = generation.generate(teacher, enc, max_decode_len=64)
  n = int(want.lengths[0])
  np.testing.assert_array_equal(
    cached['outputs'][3, :n], np.asarray(want.tokens)[0, :n]
  )
  with pytest.raises(ValueError, match='needs a teacher_path'):
    _train(tmp_path / 'x', vocab_file, distill_targets='teacher_greedy')
  with pytest.raises(ValueError, match='distill_targets must be'):
    _train(tmp_path / 'x', vocab_file, distill_targets='soft')


def test_several_tasks_train_one_model_on_both(tmp_path, vocab_file, capsys):
  run = _train(
    tmp_path / 'both',
    vocab_file,
    train_steps=1,
    train_examples=12,
    task='synthetic_tiny+synthetic_tiny_summarize',
  )
  assert run.stopped == 'done'
  # 12 examples asked for, 6 from each task (some may be over the bucket).
  kept, dropped = re.search(
    r'(\d+) train examples \((\d+) over', capsys.readouterr().out
  ).groups()
  assert int(kept) + int(dropped) == 12


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
    ('configs/train_demo_target_gpu.gin', 'models/demo/target_gpu.gin'),
    ('configs/train_demo_draft_gpu.gin', 'models/demo/draft_gpu.gin'),
    ('configs/train_demo_target_cpu_long.gin', 'models/demo/target.gin'),
  ],
)
def test_train_configs_parse(clean_gin, name, model_file):
  gin_cli.parse([name], ["MODEL_DIR = '/tmp/x'"])
  both = 'gpu' in name or 'cpu_long' in name
  assert gin.query_parameter('lm.train.task') == (
    'debian_ende+debian_summarize' if both else 'debian_ende'
  )
  assert gin_cli.macro('MODEL_DIR') == '/tmp/x'
  assert gin_cli.binds(lm.train) and not gin_cli.binds(train_heads.train_heads)
  cfg = gin.get_configurable(T5Config)()
  # The network is the model file's; a config may train it with dropout.
  assert cfg.replace(dropout_rate=0.0) == T5Config.from_gin(model_file).replace(
    dropout_rate=0.0
  )
  assert cfg.mlp_activations == ('gelu', 'linear')
  assert cfg.vocab_size >= spm_trainer.DEFAULT_VOCAB_SIZE


def test_demo_draft_is_much_cheaper_per_step_than_the_target():
  from spec_decode.bench import speed  # pylint: disable=g-import-not-at-top

  for suffix in ('', '_gpu'):
    target = t5_model.Model.from_gin(f'models/demo/target{suffix}.gin')
    draft = t5_model.Model.from_gin(f'models/demo/draft{suffix}.gin')
    ratio = speed.decoder_step_bytes(draft) / speed.decoder_step_bytes(target)
    assert ratio < 0.1


def test_heads_config_parses_and_selects_heads(clean_gin):
  gin_cli.parse(['train_demo_heads'], ['MODEL_DIR = "/tmp/x"'])
  assert gin.query_parameter('heads.train_heads.task') == 'debian_ende'
  assert gin_cli.binds(train_heads.train_heads) and not gin_cli.binds(lm.train)


def test_cli_passes_gin_flags_as_bindings(clean_gin, tmp_path, capsys):
  bindings, rest = gin_cli.split_flags(
    ['--gin.TRAIN_STEPS=3', '--model_dir', 'd', '--gin.A', "'x'"]
  )
  assert bindings == ['TRAIN_STEPS = 3', "A = 'x'"]
  assert rest == ['--model_dir', 'd']
  # Through `spec-decode train`: a config that binds no trainer stops after
  # parsing, with the flags' bindings in place (a bare word is a string).
  gin_file = tmp_path / 'macros.gin'
  gin_file.write_text('TRAIN_STEPS = 1\nA = None\nB = None\n')
  code = train_cli.main(
    [
      f'--gin_file={gin_file}',
      '--gin.TRAIN_STEPS=3',
      '--gin.A',
      "'x'",
      '--gin.B=runs/demo/target/model',
      f'--model_dir={tmp_path / "run"}',
    ]
  )
  assert code == 2
  assert 'none of lm.train, heads.train_heads' in capsys.readouterr().err
  assert gin_cli.macro('TRAIN_STEPS') == 3
  assert gin_cli.macro('A') == 'x'
  assert gin_cli.macro('B') == 'runs/demo/target/model'
  assert gin_cli.macro('MODEL_DIR') == str(tmp_path / 'run')
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize(
  'argv, message',
  [
    (['--gin_file=no_such_config'], 'gin file not found: no_such_config'),
    (['--gin_file=train_demo_target'], 'MODEL_DIR is required'),
    (['--gin_file=train_demo_heads', '--gin.MODEL_DIR'], 'expected --gin.'),
    (['--model_dir=d'], '--gin_file is required'),
  ],
)
def test_cli_errors_exit_2_with_a_message(clean_gin, capsys, argv, message):
  try:
    code = train_cli.main(argv)
  except SystemExit as e:  # argparse's own errors.
    code = e.code
  assert code == 2
  assert message in capsys.readouterr().err


def test_cli_missing_vocabulary_is_an_error_not_a_traceback(
  clean_gin, tmp_path, capsys
):
  code = train_cli.main(
    [
      '--gin_file=train_demo_draft',
      f'--model_dir={tmp_path / "run"}',
      f'--gin.VOCAB_FILE={tmp_path / "none.model"}',
    ]
  )
  assert code == 1
  err = capsys.readouterr().err
  assert 'sentencepiece model not found' in err and 'none.model' in err


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
  code = train_cli.main(
    [
      f'--gin_file={gin_file}',
      f'--model_dir={model_dir}',
      '--gin.lm.train.train_steps=2',
    ]
  )
  assert code == 0
  assert (model_dir / train_cli.CONFIG_FILE).is_file()
  assert 'train_steps = 2' in (model_dir / train_cli.CONFIG_FILE).read_text()
  model = t5_model.Model.load(str(model_dir / lm.MODEL_DIR))
  assert model.config.emb_dim == 8
  assert [r['step'] for r in _log(model_dir) if 'loss' in r] == [2]

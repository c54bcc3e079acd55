"""seqio as the data path of eval runs, end to end and offline.

A task module, written to a temporary directory and imported through
`MIXTURE_OR_TASK_MODULE` as a T5X user's own module would be, registers
seqio tasks over a `FunctionDataSource` with the demo pair's sentencepiece
model (a local file). `spec-decode eval` (`cli.main`) evaluates one on the
demo pair with a T5X-style command line plus the draft.

Nothing here imports seqio (and TensorFlow) before its tests run, so the
other test modules run without it, and spec_decode's own seqio tasks are
removed from seqio's registry after each test.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from spec_decode import paths
from spec_decode.data import seqio_data
from spec_decode.data import tasks
from spec_decode.eval import cli
from spec_decode.eval import decoding
from spec_decode.eval import records
from spec_decode.eval import run as eval_lib
from spec_decode.eval.load import task_data
from spec_decode.t5 import vocab as vocab_lib

pytestmark = pytest.mark.skipif(
  not seqio_data.installed(),
  reason="seqio is not installed (pip install -e '.[seqio]')",
)

TARGET = 'checkpoints/demo/target'
DRAFT = 'checkpoints/demo/draft'


SPM = os.path.join(paths.REPO_DIR, TARGET, 'spiece.model')
MODULE = 'spec_decode_test_user_tasks'
TASK = 'spec_decode_test_ende'
MISMATCHED = 'spec_decode_test_ende_0extra'
SCORED = 'spec_decode_test_ende_scored'
MIXTURE = 'spec_decode_test_mixture'
PREFIX = 'translate English to German: '
# Debian-like descriptions, the demo pair's domain.
PAIRS = {
  'validation': [
    ('Documentation for the GNU C library', 'Dokumentation'),
    ('Python 3 bindings for the library', 'Python-3-Anbindungen'),
    ('transitional dummy package', 'Übergangspaket'),
    ('development files for the library', 'Entwicklungsdateien'),
  ],
  'test': [('command-line tools', 'Befehlszeilenwerkzeuge')],
}
# What a user's task module looks like (T5X's MIXTURE_OR_TASK_MODULE).
USER_MODULE = """
import numpy as np
import seqio
import tensorflow as tf

PAIRS = {pairs!r}


def dataset(split, shuffle_files, seed=None):
  del shuffle_files, seed
  rows = PAIRS[split]
  return tf.data.Dataset.from_tensor_slices(
      {{'source': [s for s, _ in rows], 'target': [t for _, t in rows]}})


def translate(ds):
  return ds.map(lambda ex: {{
      'inputs': tf.strings.join([{prefix!r}, ex['source']]),
      'targets': ex['target']}})


def postprocess(text, example=None, is_target=False):
  del example, is_target
  return text.strip().upper()


def scores(targets, predictions):
  return {{
      'exact_match': 100.0 * np.mean(
          [t == p for t, p in zip(targets, predictions)]),
      'prediction_chars': float(np.mean([len(p) for p in predictions])),
  }}


def log_likelihood(targets, scores):
  return {{'log_likelihood': float(np.mean(scores))}}


def add(name, extra_ids, metric_fns):
  vocab = seqio.SentencePieceVocabulary({spm!r}, extra_ids=extra_ids)
  seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(dataset, splits=list(PAIRS)),
      preprocessors=[
          translate,
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features={{
          'inputs': seqio.Feature(vocab),
          'targets': seqio.Feature(vocab),
      }},
      postprocess_fn=postprocess,
      metric_fns=metric_fns)


add({task!r}, 100, [scores])
add({mismatched!r}, 0, [scores])
add({scored!r}, 100, [scores, log_likelihood])
seqio.MixtureRegistry.add({mixture!r}, [{task!r}, {scored!r}], default_rate=1)
"""
T5X_FLAGS = [
  '--gin_file=t5x/configs/runs/eval.gin',
  f'--gin.MIXTURE_OR_TASK_MODULE={MODULE}',
  f'--gin.CHECKPOINT_PATH={TARGET}',
  "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 16}",
  '--gin.utils.DatasetConfig.split=validation',
  '--gin.utils.DatasetConfig.batch_size=2',
]
# What a T5X command gains: the draft.
DRAFT_FLAGS = [
  f'--gin.DRAFT_CHECKPOINT={DRAFT}',
  '--gin.GAMMA=3',
  '--gin.TIMING_REPEATS=1',
  '--gin.TIMING_ROUNDS=1',
  '--no_progress',
]


@pytest.fixture(autouse=True)
def no_leftover_registrations():
  """Tests that register spec_decode's own seqio tasks leave none behind
  (importing `data/seqio_tasks.py` registers them)."""
  yield
  ours = sys.modules.get('spec_decode.data.seqio_tasks')
  if ours is not None:
    ours.unregister()


@pytest.fixture(scope='module')
def seqio():
  import seqio  # pylint: disable=g-import-not-at-top

  return seqio


@pytest.fixture(scope='module')
def seqio_tasks():
  from spec_decode.data import seqio_tasks  # pylint: disable=g-import-not-at-top

  seqio_tasks.unregister()  # Its import registered them.
  return seqio_tasks


@pytest.fixture(scope='module', autouse=True)
def user_module(seqio, tmp_path_factory):
  """The user's task module on sys.path; its tasks are removed after."""
  directory = tmp_path_factory.mktemp('user_module')
  (directory / f'{MODULE}.py').write_text(
    textwrap.dedent(USER_MODULE).format(
      pairs=PAIRS,
      prefix=PREFIX,
      spm=SPM,
      task=TASK,
      mismatched=MISMATCHED,
      scored=SCORED,
      mixture=MIXTURE,
    )
  )
  sys.path.insert(0, str(directory))
  yield MODULE
  sys.path.remove(str(directory))
  sys.modules.pop(MODULE, None)
  for name in (TASK, MISMATCHED, SCORED):
    seqio.TaskRegistry.remove(name)
  seqio.MixtureRegistry.remove(MIXTURE)


def _lines(path):
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def test_importing_spec_decode_imports_no_tensorflow():
  code = (
    'import sys\n'
    'import spec_decode\n'
    'from spec_decode.data import tasks\n'
    'from spec_decode.eval import cli, run\n'
    "run.EvalSettings(task='synthetic_tiny')\n"
    "print(sorted(m for m in ('tensorflow', 'seqio') if m in sys.modules))\n"
  )
  out = subprocess.run(
    [sys.executable, '-c', code],
    capture_output=True,
    text=True,
    check=True,
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
  )
  assert out.stdout.strip().splitlines()[-1] == '[]'


def test_a_seqio_task_evaluates_end_to_end(tmp_path, capsys):
  out = str(tmp_path / 'out')
  argv = [
    *T5X_FLAGS,
    f'--gin.MIXTURE_OR_TASK_NAME={TASK}',
    f'--gin.EVAL_OUTPUT_DIR={out}',
    *DRAFT_FLAGS,
  ]
  assert cli.main(argv) == 0, capsys.readouterr().err
  with open(os.path.join(out, eval_lib.RESULTS_FILE)) as f:
    r = json.load(f)
  assert r['task'] == TASK and r['task_source'] == 'seqio'
  assert r['split'] == 'validation' and r['batch_size'] == 2
  assert (r['max_input_len'], r['max_decode_len']) == (32, 16)
  # T5X's default: the whole split; greedy, so both decodes agree.
  assert r['num_examples'] == len(PAIRS['validation'])
  assert r['temperature'] == 0.0 and r['exact_match_fraction'] == 1.0
  assert r['metric'] == 'scores'
  assert set(r['quality']) == {'exact_match', 'prediction_chars'}
  for values in r['quality'].values():
    assert values['plain'] == values['speculative']

  # T5X's infer file: inputs (pretokenized), prediction, targets.
  rows = _lines(os.path.join(out, records.predictions_file(TASK)))
  assert [row['inputs'] for row in rows] == [
    {'inputs_pretokenized': PREFIX + s, 'targets_pretokenized': t}
    for s, t in PAIRS['validation']
  ]
  assert [row['targets'] for row in rows] == [t for _, t in PAIRS['validation']]
  assert all(row['prediction'] == row['plain_prediction'] for row in rows)
  # The metric saw the task's postprocess_fn applied to the predictions.
  chars = np.mean([len(row['prediction'].strip().upper()) for row in rows])
  assert r['quality']['prediction_chars']['plain'] == pytest.approx(chars)
  targets = [t.upper() for _, t in PAIRS['validation']]
  matches = [row['prediction'].strip().upper() == t for row, t in
             zip(rows, targets, strict=True)]  # fmt: skip
  assert r['quality']['exact_match']['plain'] == 100.0 * np.mean(matches)
  examples = _lines(os.path.join(out, eval_lib.EXAMPLES_FILE))
  assert [e['input'] for e in examples] == [
    PREFIX + s for s, _ in PAIRS['validation']
  ]

  # The same command again resumes: nothing is decoded twice.
  assert cli.main(argv) == 0
  with open(os.path.join(out, eval_lib.RESULTS_FILE)) as f:
    again = json.load(f)
  assert eval_lib.strip_timings(again) == eval_lib.strip_timings(r)
  assert len(_lines(os.path.join(out, eval_lib.EXAMPLES_FILE))) == 4


def test_a_task_with_another_vocabulary_is_refused_naming_both(
  tmp_path, capsys
):
  argv = [
    *T5X_FLAGS,
    f'--gin.MIXTURE_OR_TASK_NAME={MISMATCHED}',
    f'--output_dir={tmp_path}',
    *DRAFT_FLAGS,
  ]
  assert cli.main(argv) == 1
  err = capsys.readouterr().err
  assert f"seqio task '{MISMATCHED}'" in err
  assert f'SentencePieceVocabulary(file={SPM}, extra_ids=0)' in err
  assert "not the model's Vocabulary(" in err
  assert '0 extra ids for the task, 100 for the model' in err


def test_vocabularies_compare_by_contents_and_extra_ids(seqio, tmp_path):
  model = vocab_lib.Vocabulary.from_file(SPM)
  copy = str(tmp_path / 'copy.model')
  shutil.copy(SPM, copy)
  same = seqio.SentencePieceVocabulary(copy, extra_ids=100)
  assert seqio_data.vocabulary_differences(same, model) == []
  other = tasks_vocabulary_file(tmp_path)
  problems = seqio_data.vocabulary_differences(
    seqio.SentencePieceVocabulary(other, extra_ids=100), model
  )
  assert len(problems) == 1 and 'different sentencepiece models' in problems[0]
  upwards = seqio.SentencePieceVocabulary(
    copy, extra_ids=100, reverse_extra_ids=False
  )
  assert seqio_data.vocabulary_differences(upwards, model) == [
    'the task numbers its extra ids upwards'
  ]


def tasks_vocabulary_file(directory) -> str:
  """Another sentencepiece model (trained on the synthetic task)."""
  vocab = eval_lib.task_vocabulary('synthetic_tiny', vocab_size=64)
  path = os.path.join(directory, 'other.model')
  with open(path, 'wb') as f:
    f.write(vocab.serialized)
  return path


def test_an_unknown_task_is_refused_before_any_model_loads(tmp_path, capsys):
  out = tmp_path / 'out'
  argv = [
    '--gin_file=t5x/configs/runs/eval.gin',
    f'--gin.MIXTURE_OR_TASK_MODULE={MODULE}',
    '--gin.MIXTURE_OR_TASK_NAME=spec_decode_test_endee',
    '--gin.CHECKPOINT_PATH=/nonexistent/target',
    '--gin.DRAFT_CHECKPOINT=/nonexistent/draft',
    '--gin.GAMMA=3',
    f'--output_dir={out}',
  ]
  assert cli.main(argv) == 1
  err = capsys.readouterr().err
  assert "EvalSettings.task must be a task name: unknown task 'spec_dec" in err
  assert 'spec_decode tasks: cnn_dailymail_v002, debian_ende' in err
  assert 'seqio TaskRegistry and MixtureRegistry:' in err
  assert TASK in err and MIXTURE in err
  assert f'Did you mean: {TASK}' in err
  assert 'checkpoint not found' not in err
  assert not out.exists()


def test_a_module_that_does_not_import_is_refused_naming_it():
  with pytest.raises(ValueError, match='mixture_or_task_module.*no_such_mod'):
    eval_lib.EvalSettings(task=TASK, mixture_or_task_module='no_such_mod')


def test_a_gs_vocabulary_without_access_says_how_to_use_a_local_file(
  seqio_tasks, monkeypatch
):
  # A bucket that does not exist fails with or without network access.
  monkeypatch.setenv(
    seqio_tasks.VOCABULARY_ENV, 'gs://spec-decode-no-such-bucket/spiece.model'
  )
  seqio_tasks.register()
  with pytest.raises(ValueError) as e:
    eval_lib.EvalSettings(task='debian_ende', num_examples=2)
  message = str(e.value)
  assert message.startswith("EvalSettings.task 'debian_ende': cannot read")
  assert 'gs://spec-decode-no-such-bucket/spiece.model' in message
  assert f'{seqio_tasks.VOCABULARY_ENV}=/local/spiece.model' in message
  assert '--gin.SEQIO_VOCABULARY=' in message


def test_our_seqio_tasks_take_a_local_vocabulary_and_match_our_readers(
  seqio_tasks, tmp_path, monkeypatch
):
  rows = [('a:s', 'Documentation for the GNU C library', 'Dokumentation')]
  (tmp_path / 'ende').mkdir()
  (tmp_path / 'ende' / 'test.tsv').write_text(
    'id\tsource\ttarget\n' + ''.join('\t'.join(r) + '\n' for r in rows)
  )
  monkeypatch.setenv('SPEC_DECODE_DEBIAN_DIR', str(tmp_path))
  settings = eval_lib.EvalSettings(
    task='debian_ende', seqio_vocabulary=SPM, max_input_len=8
  )
  vocab = vocab_lib.Vocabulary.from_file(SPM)
  data = task_data.load(settings, vocab)
  assert data.source == 'seqio'
  builtin = list(tasks.examples(tasks.get_task('debian_ende'), 'test'))
  assert data.examples == builtin
  # T5's pipeline in seqio cuts as our reader does: 7 ids, then EOS.
  assert data.token_lists == decoding.tokenize(vocab, builtin, 8)
  assert len(data.token_lists[0]) == 8


def test_a_mixture_is_read_and_scored_per_subtask():
  mixture = seqio_data.SeqioTask(MIXTURE)
  assert [t.name for t in mixture.tasks] == [TASK, SCORED]
  exs = mixture.read('validation', {'inputs': 32, 'targets': 16}, limit=2)
  assert [e.task for e in exs] == [TASK, TASK, SCORED, SCORED]
  vocab = vocab_lib.Vocabulary.from_file(SPM)
  # Each target's own ids as the prediction: every metric at its best.
  predictions = [vocab.encode(e.targets) + [1] for e in exs]
  values, notes = mixture.score(exs, predictions)
  assert values[f'{TASK}/exact_match'] == 100.0
  assert values[f'{SCORED}/exact_match'] == 100.0
  metrics = ('exact_match', 'prediction_chars')
  assert set(values) == {f'{t}/{k}' for t in (TASK, SCORED) for k in metrics}
  assert notes == [
    f'{SCORED}/log_likelihood: not computed, it needs SCORE model outputs'
  ]
  with pytest.raises(ValueError, match="no split 'train'"):
    mixture.read('train', {'inputs': 32, 'targets': 16}, limit=1)

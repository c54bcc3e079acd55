"""A seqio task with `seqio.ByteVocabulary()` evaluated on a ByT5 model.

T5X's ByT5 tasks tokenize with `seqio.ByteVocabulary()` (no extra ids); a
ByT5 model from an HF directory carries transformers' byte vocabulary (125
sentinels numbered up from 259). They tokenize every text alike, so the
vocabulary check passes, and a tiny random ByT5-sized pair (384 rows) runs
`spec-decode eval` end to end with a T5X-style command line. A model whose
extra ids are not the task's, or a sentencepiece model, is refused.
"""

import json
import os
import sys
import textwrap

import pytest

import spec_decode as sd
from spec_decode.checkpoints import huggingface
from spec_decode.data import seqio_data
from spec_decode.eval import cli
from spec_decode.eval import run as eval_lib
from spec_decode.t5.byte_vocab import ByteVocabulary

pytestmark = pytest.mark.skipif(
  not seqio_data.installed(),
  reason="seqio is not installed (pip install -e '.[seqio]')",
)

MODULE = 'spec_decode_test_byte_tasks'
TASK = 'spec_decode_test_byt5_echo'
ROWS = [('Grüße aus Köln', 'Köln'), ('a <extra_id_0> b', 'b'), ('ok', 'ok')]
USER_MODULE = """
import seqio
import tensorflow as tf

ROWS = {rows!r}


def dataset(split, shuffle_files, seed=None):
  del split, shuffle_files, seed
  return tf.data.Dataset.from_tensor_slices(
      {{'inputs': [s for s, _ in ROWS], 'targets': [t for _, t in ROWS]}})


vocab = seqio.ByteVocabulary()
seqio.TaskRegistry.add(
    {task!r},
    source=seqio.FunctionDataSource(dataset, splits=['validation']),
    preprocessors=[
        seqio.preprocessors.tokenize,
        seqio.preprocessors.append_eos_after_trim,
    ],
    output_features={{
        'inputs': seqio.Feature(vocab),
        'targets': seqio.Feature(vocab),
    }},
    metric_fns=[])
"""
BYT5 = sd.T5Config(
  vocab_size=384, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=24,
  num_encoder_layers=2, num_decoder_layers=2,
  mlp_activations=('gelu', 'linear'), dropout_rate=0.0,
)  # fmt: skip


@pytest.fixture(scope='module')
def seqio(tmp_path_factory):
  import seqio  # pylint: disable=g-import-not-at-top

  directory = tmp_path_factory.mktemp('byte_module')
  (directory / f'{MODULE}.py').write_text(
    textwrap.dedent(USER_MODULE).format(rows=ROWS, task=TASK)
  )
  sys.path.insert(0, str(directory))
  yield seqio
  sys.path.remove(str(directory))
  sys.modules.pop(MODULE, None)
  seqio.TaskRegistry.remove(TASK)


def test_byte_vocabularies_compare(seqio, tmp_path):
  task = seqio.ByteVocabulary()
  hf = ByteVocabulary(125, sentinels='hf')
  assert seqio_data.vocabulary_differences(task, hf) == []
  assert seqio_data.vocabulary_differences(task, ByteVocabulary(0)) == []
  assert seqio_data.vocabulary_differences(
    seqio.ByteVocabulary(extra_ids=100), ByteVocabulary(100)
  ) == []  # fmt: skip
  assert seqio_data.vocabulary_differences(task, ByteVocabulary(100)) == [
    '0 extra ids for the task, 100 for the model'
  ]
  assert 'counting up' in seqio_data.vocabulary_differences(
    seqio.ByteVocabulary(extra_ids=125), hf
  )[0]  # fmt: skip
  import _vocab_util  # pylint: disable=g-import-not-at-top

  spm = _vocab_util.vocabulary(tmp_path)
  assert seqio_data.vocabulary_differences(task, spm) == [
    "the task's is bytes, the model's sentencepiece"
  ]
  # seqio's ids are ours, sentinel text included (bytes, in seqio).
  ours = ByteVocabulary(0)
  for text, _ in ROWS:
    assert list(task.encode(text)) == ours.encode(text)
    assert task.decode(ours.encode(text)) == ours.decode(ours.encode(text))


def test_byt5_eval_with_a_byte_vocabulary_task(seqio, tmp_path, capsys):
  target = str(tmp_path / 'byt5_hf')
  model = sd.Model.init(BYT5, seed=0, vocabulary=ByteVocabulary(125, 'hf'))
  huggingface.save_safetensors(model, target)
  draft = str(tmp_path / 'draft')
  cfg = BYT5.replace(num_encoder_layers=1, num_decoder_layers=1)
  sd.Model.init(cfg, seed=1, vocabulary=ByteVocabulary(125, 'hf')).save(draft)
  out = str(tmp_path / 'out')
  argv = [
    '--gin_file=t5x/configs/runs/eval.gin',
    f'--gin.MIXTURE_OR_TASK_MODULE={MODULE}',
    f'--gin.MIXTURE_OR_TASK_NAME={TASK}',
    f'--gin.CHECKPOINT_PATH={target}',
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 8}",
    '--gin.utils.DatasetConfig.split=validation',
    '--gin.utils.DatasetConfig.batch_size=3',
    f'--gin.EVAL_OUTPUT_DIR={out}',
    f'--gin.DRAFT_CHECKPOINT={draft}',
    '--gin.GAMMA=3',
    '--gin.TIMING_REPEATS=1',
    '--gin.TIMING_ROUNDS=1',
    '--no_progress',
  ]
  assert cli.main(argv) == 0, capsys.readouterr().err
  with open(os.path.join(out, eval_lib.RESULTS_FILE)) as f:
    r = json.load(f)
  assert r['task'] == TASK and r['task_source'] == 'seqio'
  assert r['num_examples'] == len(ROWS)
  assert r['temperature'] == 0.0 and r['exact_match_fraction'] == 1.0
  with open(os.path.join(out, eval_lib.EXAMPLES_FILE)) as f:
    examples = [json.loads(line) for line in f]
  assert [e['input'] for e in examples] == [s for s, _ in ROWS]

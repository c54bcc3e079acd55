"""A feature draft trained from a gin file on a seqio task, offline.

A tiny seqio task (a `FunctionDataSource` of the synthetic EnDe pairs,
tokenized with the target's own sentencepiece file) is registered in this
process, and `spec-decode train` (`cli.main`) runs a gin file binding
`feature.train_feature` with `task` set to its name: the loss falls, and the
checkpoint and the exported draft are written and load next to the target.
"""

import os

import numpy as np
import pytest
from conftest import SYNTHETIC_EXTRA_IDS
from conftest import train_from_gin
from conftest import training_log

import spec_decode as sd
from spec_decode.checkpoints import VOCAB_FILE
from spec_decode.data import seqio_data
from spec_decode.data import tasks
from spec_decode.drafters.feature import FeatureDraft

pytestmark = pytest.mark.skipif(
  not seqio_data.installed(),
  reason="seqio is not installed (pip install -e '.[seqio]')",
)

TASK = 'spec_decode_test_feature_ende'
EXTRA_IDS = SYNTHETIC_EXTRA_IDS
SIZES = {'train': 48, 'validation': 16}


@pytest.fixture(scope='module')
def seqio_task(synthetic_target_dir):
  """The task, registered over the synthetic pairs; removed after."""
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  reader = tasks.synthetic_reader('ende', SIZES)

  def dataset(split, shuffle_files, seed=None):
    del shuffle_files, seed
    rows = list(reader(split))
    return tf.data.Dataset.from_tensor_slices(
      {
        'inputs': [tasks.TRANSLATE_EN_DE_PREFIX + s for s, _ in rows],
        'targets': [t for _, t in rows],
      }
    )

  vocab = seqio.SentencePieceVocabulary(
    os.path.join(synthetic_target_dir, VOCAB_FILE), extra_ids=EXTRA_IDS
  )
  seqio.TaskRegistry.add(
    TASK,
    source=seqio.FunctionDataSource(dataset, splits=list(SIZES)),
    preprocessors=[
      seqio.preprocessors.tokenize,
      seqio.preprocessors.append_eos_after_trim,
    ],
    output_features={
      'inputs': seqio.Feature(vocab),
      'targets': seqio.Feature(vocab),
    },
    metric_fns=[],
  )
  yield TASK
  seqio.TaskRegistry.remove(TASK)


def test_spec_decode_train_trains_a_feature_draft_on_a_seqio_task(
  tmp_path, synthetic_target_dir, seqio_task
):
  settings = dict(
    task=seqio_task,
    targets='both',
    train_examples=SIZES['train'],
    eval_examples=SIZES['validation'],
    max_decode_len=12,
    generate_batch_size=16,
    buckets=((64, 16, 8),),
    train_steps=12,
    learning_rate=1e-2,
    warmup_steps=2,
    eval_every=0,
    checkpoint_every=6,
    log_every=1,
    progress=False,
  )
  model_dir = train_from_gin(
    tmp_path,
    'feature.train_feature',
    dict(target_path=synthetic_target_dir, **settings),
  )
  log = [r for r in training_log(str(model_dir)) if 'loss' in r]
  assert [r['step'] for r in log][-1] == 12
  first = np.mean([r['loss'] for r in log[:2]])
  last = np.mean([r['loss'] for r in log[-2:]])
  assert last < 0.8 * first, (first, last)
  assert os.listdir(model_dir / 'checkpoints')
  target = sd.Model.load(synthetic_target_dir)
  draft = FeatureDraft.load(str(model_dir / 'feature_draft'), target)
  assert draft.vocabulary == target.vocabulary

"""Training an EAGLE-style feature draft (`train.feature`) on a toy task."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from conftest import SYNTHETIC_PIECES
from conftest import encoder_batch
from conftest import train_from_gin
from conftest import training_log

import spec_decode as sd
from spec_decode.drafters.feature import FeatureDraft
from spec_decode.models.t5_model import shift_right
from spec_decode.train import feature as train_feature

PIECES = SYNTHETIC_PIECES


_TINY = dict(
  task='synthetic_tiny',
  train_examples=48,
  eval_examples=16,
  max_decode_len=12,
  generate_batch_size=16,
  buckets=((64, 12, 8),),
  learning_rate=1e-2,
  warmup_steps=2,
  eval_every=0,
  checkpoint_every=5,
  log_every=1,
  progress=False,
)


def test_training_lowers_the_loss_and_resumes(tmp_path, synthetic_target_dir):
  model_dir = str(tmp_path / 'run')
  result = train_feature.train_feature(
    model_dir, synthetic_target_dir, train_steps=12, **_TINY
  )
  assert result.stopped == 'done' and result.step == 12
  log = [r for r in training_log(model_dir) if 'loss' in r]
  first = np.mean([r['loss'] for r in log[:2]])
  last = np.mean([r['loss'] for r in log[-2:]])
  assert last < 0.8 * first, (first, last)
  assert 0.0 <= result.validation_top1 <= 1.0
  assert 0.0 < result.validation_beta <= 1.0
  target = sd.Model.load(synthetic_target_dir)
  draft = FeatureDraft.load(result.draft_path, target)
  assert draft.vocabulary == target.vocabulary
  cache = os.path.join(model_dir, 'greedy_train.npz')
  mtime = os.path.getmtime(cache)
  # A rerun with more steps resumes (and reuses the decoded outputs).
  again = train_feature.train_feature(
    model_dir, synthetic_target_dir, train_steps=14, **_TINY
  )
  assert again.step == 14
  assert os.path.getmtime(cache) == mtime
  steps = [r['step'] for r in training_log(model_dir) if 'loss' in r]
  assert steps[-2:] == [13, 14]
  # The exported draft decodes exactly (greedy identity).
  enc = encoder_batch(4, 9, PIECES, seed=1)
  plain = sd.generate(target, enc, max_decode_len=10)
  spec = sd.generate(target, enc, draft=draft, gamma=3, max_decode_len=10)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_loss_is_eagles_feature_and_token_losses(synthetic_target_dir):
  """The loss at weights (1, 0) is the smooth-L1 feature loss alone, at
  (0, 1) the cross-entropy from the target's to the draft's distribution,
  both over the labelled positions."""
  target = sd.Model.load(synthetic_target_dir)
  draft = FeatureDraft.init(target)
  enc = jnp.asarray(encoder_batch(2, 6, PIECES, seed=2))
  targets = np.asarray([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0]], np.int32)
  feats = target.features(enc, shift_right(targets))
  f_only, aux = train_feature.feature_loss(
    draft, enc, feats, jnp.asarray(targets), None, 1.0, 0.0
  )
  t_only, _ = train_feature.feature_loss(
    draft, enc, feats, jnp.asarray(targets), None, 0.0, 1.0
  )
  pred = draft.teacher_forced(enc, shift_right(targets), feats)
  mask = targets != 0
  diff = np.abs(np.asarray(pred - feats))
  huber = np.where(diff < 1.0, 0.5 * diff**2, diff - 0.5).mean(-1)
  np.testing.assert_allclose(float(f_only), huber[mask].mean(), rtol=1e-5)
  p = jax.nn.softmax(target.project(feats))
  logq = jax.nn.log_softmax(target.project(pred))
  ce = -np.sum(np.asarray(p * logq), -1)
  np.testing.assert_allclose(float(t_only), ce[mask].mean(), rtol=1e-5)
  assert float(aux['count']) == mask.sum()


def test_spec_decode_train_dispatches_on_a_feature_config(
  tmp_path, synthetic_target_dir
):
  settings = dict(_TINY, train_examples=16, checkpoint_every=100)
  settings.pop('progress')
  settings['targets'] = 'references'
  settings['buckets'] = ((64, 64, 8),)
  settings['cache_features'] = False  # Features computed in the step.
  model_dir = train_from_gin(
    tmp_path,
    'feature.train_feature',
    dict(
      target_path=synthetic_target_dir,
      train_steps=2,
      progress=False,
      mlp_dim=24,
      draft_vocab_size=6,
      **settings,
    ),
  )
  info_file = model_dir / 'feature_draft' / 'feature_draft.json'
  info = json.loads(info_file.read_text())
  assert info['mlp_dim'] == 24 and len(info['draft_vocab']) == 6
  assert not (model_dir / 'greedy_train.npz').exists()


def test_draft_vocabulary_is_the_most_frequent_outputs():
  """Counted over the targets (padding never), ties to the smaller id,
  unseen ids filling up; ascending."""
  pairs = [
    (np.zeros(3, np.int32), np.asarray([7, 7, 3, 1, 0, 0], np.int32)),
    (np.zeros(3, np.int32), np.asarray([5, 3, 7, 1], np.int32)),
  ]
  vocab = train_feature.draft_vocabulary(pairs, 3, 10)
  np.testing.assert_array_equal(vocab, [1, 3, 7])
  np.testing.assert_array_equal(
    train_feature.draft_vocabulary(pairs, 5, 10), [1, 2, 3, 5, 7]
  )
  # Never the padding id: at most V - 1 ids.
  np.testing.assert_array_equal(
    train_feature.draft_vocabulary(pairs, 10, 10), np.arange(1, 10)
  )

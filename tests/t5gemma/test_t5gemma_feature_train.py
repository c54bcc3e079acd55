"""Training, saving and loading an EAGLE-style feature draft on a T5Gemma
target (`train.feature` through `spec-decode train`, T5's recipe and gin
shape; `drafters.feature_t5gemma`'s checkpoint).

The targets are tiny random T5Gemma and T5Gemma 2 models saved by
transformers (`_t5gemma_util.py`) with a Gemma-ids sentencepiece
vocabulary trained on the synthetic task's text, so the run reads the task
as it reads Debian EnDe with a real target.
"""

import jax
import numpy as np
import pytest
from _t5gemma_util import ENCODER
from _t5gemma_util import gemma_tokenizer
from _t5gemma_util import hf_model
from _t5gemma_util import save
from _t5gemma_util import tiny_config
from conftest import tiny_config as t5_tiny_config
from conftest import train_from_gin
from conftest import training_log

import spec_decode as sd
from spec_decode.data import tasks
from spec_decode.drafters import on_target
from spec_decode.drafters.feature import FeatureDraft
from spec_decode.drafters.feature_t5gemma import T5GemmaFeatureDraft

pytest.importorskip('transformers')

SETTINGS = dict(
  task='synthetic_tiny',
  targets='greedy',
  train_examples=32,
  eval_examples=8,
  max_decode_len=10,
  generate_batch_size=16,
  buckets=((64, 10, 8),),
  train_steps=10,
  learning_rate=1e-2,
  warmup_steps=2,
  eval_every=0,
  checkpoint_every=100,
  log_every=1,
  progress=False,
)


def _task_texts():
  for source, target in tasks.synthetic_reader('ende')('train'):
    yield tasks.TRANSLATE_EN_DE_PREFIX + source
    yield target


@pytest.fixture(scope='module', params=[1, 2], ids=['t5gemma', 't5gemma2'])
def trained(request, tmp_path_factory):
  """`(target path, model dir)`: a target saved by transformers with a
  vocabulary, and a 10-step `spec-decode train` run on it (2 layers)."""
  v = request.param
  tmp = tmp_path_factory.mktemp(f'v{v}')
  path = save(hf_model(v, decoder_layers=2), tmp / 'target')
  gemma_tokenizer(path, tmp, 0, 100, texts=list(_task_texts()))
  model_dir = train_from_gin(
    tmp,
    'feature.train_feature',
    dict(target_path=path, num_layers=1, **SETTINGS),
  )
  return path, str(model_dir)


def test_spec_decode_train_lowers_the_draft_loss(trained):
  """The same gin shape as T5's (`feature.train_feature`): ten steps lower
  EAGLE's loss, and the run exports a T5Gemma feature draft."""
  _, model_dir = trained
  log = [r for r in training_log(model_dir) if 'loss' in r]
  assert [r['step'] for r in log] == list(range(1, 11))
  first = np.mean([r['loss'] for r in log[:2]])
  last = np.mean([r['loss'] for r in log[-2:]])
  assert last < 0.8 * first, (first, last)


def test_trained_draft_loads_round_trips_and_decodes_exactly(trained, tmp_path):
  path, model_dir = trained
  target = sd.Model.load(path)
  draft = FeatureDraft.load(f'{model_dir}/feature_draft', target)
  assert isinstance(draft, T5GemmaFeatureDraft)
  assert draft.vocabulary == target.vocabulary
  # Trained: not the draft it started from.
  fresh = FeatureDraft.init(target, num_layers=1)
  assert not np.allclose(
    np.asarray(draft.params['fc']['kernel']),
    np.asarray(fresh.params['fc']['kernel']),
  )
  # save -> load gives the same weights, bit for bit, and the same sample.
  draft.save(tmp_path / 'again')
  again = FeatureDraft.load(tmp_path / 'again', target)
  assert again.cross_layers == draft.cross_layers == (1,)
  a, b = jax.tree.leaves(draft.params), jax.tree.leaves(again.params)
  assert len(a) == len(b) > 0
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  sampled = [
    sd.generate(
      target,
      ENCODER,
      draft=d,
      gamma=3,
      temperature=1.0,
      max_decode_len=12,
      seed=np.arange(3) + 5,
    )
    for d in (draft, again)
  ]
  np.testing.assert_array_equal(sampled[0].tokens, sampled[1].tokens)
  np.testing.assert_array_equal(
    sampled[0].stats.row_accepted_histogram,
    sampled[1].stats.row_accepted_histogram,
  )
  # Greedy with the trained draft is plain greedy, chains and trees.
  plain = sd.generate(target, ENCODER, max_decode_len=12)
  for kwargs in (dict(gamma=3), dict(tree=(2, 1))):
    out = sd.generate(target, ENCODER, draft=again, max_decode_len=12, **kwargs)
    np.testing.assert_array_equal(out.tokens, plain.tokens)


def _no_weights_read(monkeypatch):
  """Fails a load that gets as far as tracing or reading weights."""

  def boom(*args, **kwargs):
    raise AssertionError('weights read before the checks')

  monkeypatch.setattr(on_target, 'restore_params', boom)
  monkeypatch.setattr(jax, 'eval_shape', boom)


def test_other_family_drafts_are_refused_before_reading(tmp_path, monkeypatch):
  """A T5 draft on a T5Gemma target and a T5Gemma draft on a T5 target:
  a clear error before any weights are read or traced."""
  gemma = sd.T5GemmaModel.init(tiny_config(1, 2), seed=0)
  t5 = sd.Model.init(t5_tiny_config(), seed=0)
  FeatureDraft.init(t5).save(tmp_path / 't5')
  FeatureDraft.init(gemma).save(tmp_path / 'gemma')
  _no_weights_read(monkeypatch)
  with pytest.raises(ValueError, match='trained for a T5 target cannot draft'
                     ' for a T5Gemma target'):  # fmt: skip
    FeatureDraft.load(tmp_path / 't5', gemma)
  with pytest.raises(ValueError, match='trained for a T5Gemma target cannot '
                     'draft for a T5 target'):  # fmt: skip
    FeatureDraft.load(tmp_path / 'gemma', t5)
  with pytest.raises(FileNotFoundError, match='not a feature draft'):
    FeatureDraft.load(tmp_path, gemma)


@pytest.mark.parametrize(
  'other,message',
  [
    (dict(emb=24), 'decoder.emb_dim 16 != 24'),
    (dict(layers=3), r'decoder.num_layers 2 != 3'),
    (dict(version=2), 'version 1 != 2'),
  ],
  ids=['width', 'layers', 'version'],
)
def test_a_draft_for_another_shape_is_refused(
  tmp_path, monkeypatch, other, message
):
  """A T5Gemma draft loaded against a T5Gemma target of another width,
  depth or version: the mismatch named, before any weights are read."""
  FeatureDraft.init(sd.T5GemmaModel.init(tiny_config(1, 2))).save(tmp_path)
  cfg = tiny_config(other.get('version', 1), other.get('layers', 2))
  if 'emb' in other:
    stack = type(cfg.decoder)(**{**vars(cfg.decoder), 'emb_dim': other['emb']})
    cfg = cfg.replace(encoder=stack, decoder=stack)
  target = sd.T5GemmaModel(cfg, None)
  _no_weights_read(monkeypatch)
  with pytest.raises(ValueError, match=message):
    FeatureDraft.load(tmp_path, target)


@pytest.mark.parametrize('name', ['mlp_dim', 'draft_vocab_size'])
def test_t5_only_settings_are_refused_before_decoding(
  tmp_path, monkeypatch, name
):
  """`mlp_dim` and `draft_vocab_size` (a T5 draft's) on a T5Gemma target:
  a clear error naming the setting, before any training output is
  decoded."""
  from spec_decode.train import feature as train_feature  # pylint: disable=g-import-not-at-top

  path = save(hf_model(1, decoder_layers=2), tmp_path / 'target')
  gemma_tokenizer(path, tmp_path, 0, 100, texts=list(_task_texts()))

  def no_decoding(*args, **kwargs):
    raise AssertionError('decoded before refusing')

  monkeypatch.setattr(train_feature, '_pairs', no_decoding)
  settings = train_feature.FeatureTrainSettings(
    model_dir=str(tmp_path / 'run'),
    target_path=path,
    num_layers=1,
    **{name: 8},
    **SETTINGS,
  )
  with pytest.raises(ValueError, match=f'{name} is for T5 targets'):
    train_feature.run(settings)

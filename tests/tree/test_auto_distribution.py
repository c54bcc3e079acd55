"""tree='auto' samples the target's distribution (whole sequences).

Method: `_distribution_util`'s G-test against the exact probabilities of
every output, here of a target with V = 4 (EOS = 1) and sequences of at
most M = 2 tokens (13 outputs), one input, temperature 1, and a bad draft
(another random model, which the target often rejects). The shape is
chosen per call, so the test calls `generate(tree='auto')` once per
sample batch: at batch 1 with seeds 0..3999 (N = 4,000 samples, 4,000
calls) and at batch 2 with seeds 0..2999 (N = 3,000 samples, 1,500 calls).
The seeds were fixed before looking at a p-value; N was set from the
negative control's p-values at 500..2,000 calls (batch 1 at 2,000 calls:
p = 3e-12; batch 2 at 1,500: p = 4e-9). The nested draw (issue 42: a new
map from uniforms to ids) left the batch-1 control at p = 1.0e-3 at 2,000
calls, so batch 1 was re-set to 4,000 calls (control p = 5e-13 there).
False-alarm rate 1e-3 per test. The costs are fixed (t = 2 + 0.5 n +
0.25 D: a timed choice would vary from run to run) and `tree.auto.choose`
is memoized (the same answers, once per distinct calibration).

Negative control: tree='auto' as it was before issue 28 (a whole
calibration decode with the decode's own keys, then the chosen tree
decoded again with the same keys: the shape depends on the draws the
decode reuses). The same test at the same N must reject it.
"""

import functools

import numpy as np
import pytest
from _distribution_util import FALSE_ALARM
from _distribution_util import exact_probs
from _distribution_util import g_test
from conftest import tiny_config

import spec_decode as sd
from spec_decode.core import tree_shape as tree_lib
from spec_decode.tree import auto as tree_auto
from spec_decode.tree import generation as tree_generation

V, M = 4, 2
ENC = np.array([[3, 2, 3, 2, 0]], np.int32)
CALLS = {1: 4_000, 2: 1_500}


@functools.cache
def _linear_costs(shapes: tuple) -> dict:
  out = {}
  for branching in shapes:
    shape = tree_lib.from_branching(branching)
    out[branching] = 2.0 + 0.5 * shape.num_nodes + 0.25 * shape.depth
  return out


def _linear_seconds(target, draft, enc, settings, shapes=tree_auto.TIMED):
  """Fixed costs t = 2 + 0.5 n + 0.25 D per iteration (nothing timed)."""
  del target, draft, enc, settings
  return dict(_linear_costs(tuple(shapes)))


@functools.cache
def _choose_cached(acceptance: bytes, rows: int, cost: tuple) -> dict:
  acc = np.frombuffer(acceptance).reshape(rows, -1)
  return tree_auto.CHOOSE(acc, cost)


def _memoized_choose(rank_acceptance, cost, max_nodes=tree_auto.MAX_NODES):
  assert max_nodes == tree_auto.MAX_NODES
  acc = np.asarray(rank_acceptance, np.float64)
  return _choose_cached(acc.tobytes(), acc.shape[0], tuple(cost))


def _reused_keys(model, draft, enc, keys, settings, batch):
  """tree='auto' before issue 28: calibrate and decode with the same keys."""
  calibration = tree_lib.from_branching(tree_auto.CALIBRATION)
  cal = tree_generation.decode(
    model, draft, enc, keys, settings, calibration, batch
  )[3]
  choice = tree_auto.decide(
    model, draft, enc, settings, cal['rank_acceptance']
  )[0]
  shape = tree_lib.from_paths(choice['paths'])
  return tree_generation.decode(model, draft, enc, keys, settings, shape, batch)


@pytest.fixture(scope='module')
def models():
  target = sd.Model.init(tiny_config(vocab_size=V), seed=3)
  draft = sd.Model.init(tiny_config(vocab_size=V, num_decoder_layers=1), seed=4)
  return target, draft


@pytest.fixture(autouse=True)
def _fixed_costs(monkeypatch):
  monkeypatch.setattr(tree_auto, 'iteration_seconds', _linear_seconds)
  monkeypatch.setattr(tree_auto, 'CHOOSE', tree_auto.choose, raising=False)
  monkeypatch.setattr(tree_auto, 'choose', _memoized_choose)


def _p_value(models, batch: int) -> tuple[float, dict]:
  """The G-test's p-value of `CALLS[batch]` calls, and the shapes used."""
  target, draft = models
  seqs, p = exact_probs(target, ENC, sd.Sampler(1.0), V, M)
  samples, shapes = [], {}
  for start in range(0, CALLS[batch] * batch, batch):
    out = sd.generate(
      target,
      np.repeat(ENC, batch, 0),
      draft=draft,
      tree='auto',
      temperature=1.0,
      max_decode_len=M,
      seed=np.arange(start, start + batch),
    )
    samples.append(out.tokens)
    paths = str(out.tree.get('auto', out.tree)['paths'])
    shapes[paths] = shapes.get(paths, 0) + 1
  return g_test(np.concatenate(samples), seqs, p), shapes


@pytest.mark.parametrize('batch', [1, 2])
def test_auto_tree_samples_the_target_distribution(models, batch):
  p_value, shapes = _p_value(models, batch)
  assert len(shapes) > 1  # The choice depends on the calibration.
  assert p_value > FALSE_ALARM


@pytest.mark.parametrize('batch', [1, 2])
def test_negative_control_calibration_keys_reused_is_detected(
  models, batch, monkeypatch
):
  monkeypatch.setattr(tree_generation, 'decode_auto', _reused_keys)
  p_value, shapes = _p_value(models, batch)
  assert len(shapes) > 1
  assert p_value < FALSE_ALARM

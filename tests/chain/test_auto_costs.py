"""gamma='auto''s cost model on the chain loop (`chain.auto_costs`).

Gamma 0's candidacy, and the seconds measured once on the loop and then
read back from the cost cache (`policy.cost_cache`) on disk.
"""

import numpy as np
import pytest
from _distribution_util import target_model
from conftest import encoder_batch
from conftest import perturbed
from conftest import tiny_config

import spec_decode as sd
from spec_decode.chain import auto_costs
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.policy import cost_cache


@pytest.fixture(scope='module')
def pair():
  target = sd.Model.init(tiny_config(vocab_size=32), seed=0)
  return target, perturbed(target, 0.3, seed=1)


def test_stateful_drafter_never_gets_gamma_zero():
  class Stateful:
    def init_draft(self, encoder_tokens, length):
      return np.zeros(1)

    def propose(self, *a):
      raise AssertionError

  class Stateless(Stateful):
    def init_draft(self, encoder_tokens, length):
      return None

  assert not auto_costs.zero_allowed(Stateful())
  assert auto_costs.zero_allowed(Stateless())
  assert auto_costs.zero_allowed(target_model())


def test_costs_are_measured_once_and_cached_on_disk(
  pair, tmp_path, monkeypatch
):
  target, draft = pair
  monkeypatch.setenv('SPEC_DECODE_CACHE_DIR', str(tmp_path))
  monkeypatch.setattr(cost_cache, '_memory', {})
  enc = encoder_batch(2, 7, 32, seed=6)
  settings = DecodeSettings(max_decode_len=8, gamma=1, gamma_policy=True)
  seconds, info = auto_costs.iteration_seconds(target, draft, enc, settings)
  assert info['measured'] and len(seconds) == 2
  assert all(s > 0 and np.isfinite(s) for s in seconds)
  # Another process (empty memory) reads the file; nothing is measured.
  monkeypatch.setattr(cost_cache, '_memory', {})
  monkeypatch.setattr(auto_costs, 'measure', lambda *a, **k: 1 / 0)
  again, info2 = auto_costs.iteration_seconds(target, draft, enc, settings)
  assert again == seconds and not info2['measured']
  assert info2['path'] == info['path'] and info['path'].startswith(
    str(tmp_path)
  )
  # Other shapes, another key: batch size and the draft's size count.
  other = cost_cache.describe(target, draft, settings, batch=4)
  assert cost_cache.cache_key(other) != info['key']
  small = sd.Model.init(tiny_config(vocab_size=32, emb_dim=16), seed=2)
  assert (
    cost_cache.cache_key(cost_cache.describe(target, small, settings, 2))
    != info['key']
  )

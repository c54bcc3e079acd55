"""Measured seconds cached in memory and on disk (`policy.cost_cache`).

`cached_seconds` with a counting fake measurement; the cache through the
chain's real measurement is `tests/chain/test_auto_costs.py`.
"""

import json
import math
import os

import numpy as np
import pytest

from spec_decode.policy import cost_cache

DESC = {'target': ['T', 1, [[[4], 'float32']]], 'batch': 2, 'measure': 2}


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
  monkeypatch.setenv('SPEC_DECODE_CACHE_DIR', str(tmp_path))
  monkeypatch.setattr(cost_cache, '_memory', {})
  return tmp_path


def _counting(seconds):
  calls = []

  def measure():
    calls.append(1)
    return list(seconds)

  return measure, calls


def test_cached_seconds_measures_once_and_keeps_inf(fresh_cache):
  measure, calls = _counting([math.inf, 1.0, np.float32(2.5)])
  seconds, info = cost_cache.cached_seconds(DESC, measure)
  assert seconds == [math.inf, 1.0, 2.5] and info['measured']
  assert info['key'] == cost_cache.cache_key(DESC)
  assert info['path'] == os.path.join(str(fresh_cache), info['key'] + '.json')
  # The file holds the description, and inf as null (JSON has no inf).
  with open(info['path']) as f:
    stored = json.load(f)
  assert stored == {'description': DESC, 'seconds': [None, 1.0, 2.5]}
  # In memory: not measured again, the same seconds (a copy).
  seconds[1] = 99.0
  again, info2 = cost_cache.cached_seconds(DESC, measure)
  assert again == [math.inf, 1.0, 2.5] and not info2['measured']
  # On disk: another process (empty memory) reads it back, inf included.
  cost_cache._memory.clear()
  again, info3 = cost_cache.cached_seconds(DESC, measure)
  assert again == [math.inf, 1.0, 2.5] and not info3['measured']
  assert len(calls) == 1


def test_a_stale_or_broken_entry_is_measured_again(fresh_cache):
  measure, calls = _counting([1.0, 2.0])
  _, info = cost_cache.cached_seconds(DESC, measure)
  # A file under the key whose description is another's, then one that is
  # no JSON: each is measured again and rewritten.
  for text in (
    json.dumps({'description': {'other': 1}, 'seconds': [5.0, 6.0]}),
    '{not json',
  ):
    with open(info['path'], 'w') as f:
      f.write(text)
    cost_cache._memory.clear()
    seconds, again = cost_cache.cached_seconds(DESC, measure)
    assert seconds == [1.0, 2.0] and again['measured']
    with open(info['path']) as f:
      assert json.load(f)['description'] == DESC
  assert len(calls) == 3
  # Negative control: the intact entry is read, not measured.
  cost_cache._memory.clear()
  assert not cost_cache.cached_seconds(DESC, measure)[1]['measured']
  assert len(calls) == 3


def test_without_disk_nothing_is_written(fresh_cache):
  measure, calls = _counting([1.0])
  seconds, info = cost_cache.cached_seconds(DESC, measure, use_disk=False)
  assert seconds == [1.0] and info['path'] is None and info['measured']
  assert os.listdir(fresh_cache) == []
  # Nor read back: with the memory gone it is measured again.
  cost_cache._memory.clear()
  _, info = cost_cache.cached_seconds(DESC, measure, use_disk=False)
  assert info['measured']
  assert len(calls) == 2


def test_cache_key_is_the_description_in_any_key_order():
  key = cost_cache.cache_key(DESC)
  assert len(key) == 24
  assert cost_cache.cache_key(dict(reversed(list(DESC.items())))) == key
  assert cost_cache.cache_key({**DESC, 'batch': 4}) != key

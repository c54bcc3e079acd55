"""Seconds per loop iteration, timed and cleaned up (`policy.loop_costs`).

The clean-up (`non_decreasing`, `suspects`) on hand-made and measured
figures, and `measure`'s retry of a spike on a fake clock (through the
chain's `auto_costs.measure`, whose runs are faked).
"""

import types

import numpy as np
from _distribution_util import target_model

from spec_decode.chain import auto_costs
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.policy import loop_costs


def test_measured_seconds_are_made_non_decreasing():
  iso = loop_costs.non_decreasing
  assert iso([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
  # A noisy dip is pooled with its neighbour: (3 + 2) / 2 for both.
  np.testing.assert_allclose(iso([1.0, 3.0, 2.0, 4.0]), [1.0, 2.5, 2.5, 4.0])
  # A chain of violators pools into one block (the least-squares fit).
  np.testing.assert_allclose(iso([4.0, 3.0, 2.0]), [3.0, 3.0, 3.0])
  # A gamma that is not a candidate stays inf and is skipped.
  out = iso([np.inf, 2.0, 1.0, 5.0])
  assert out[0] == np.inf and out[1:] == [1.5, 1.5, 5.0]


def test_suspects_are_off_the_line_through_the_others():
  # The batch-8 costs (ms) of a full-grid run: gamma 4 timed at 101.6, 1.5x
  # gamma 3, where a later side-by-side timing put the two 1.2x apart.
  ms = [25.4, 36.7, 51.0, 68.1, 101.6, 108.4, 115.1, 130.4, 153.8]
  assert loop_costs.suspects(ms) == [4]
  # The same run's batch-32 costs and a rerun's batch-8 costs: none.
  assert (
    loop_costs.suspects(
      [69.8, 163.4, 223.4, 299.4, 363.0, 412.9, 462.3, 552.1, 624.0]
    )
    == []
  )
  assert (
    loop_costs.suspects(
      [25.5, 36.3, 52.9, 66.0, 81.1, 105.4, 118.1, 127.6, 140.0]
    )
    == []
  )
  # Not candidates (inf) and gamma 0 are not fitted; too few points: none.
  assert loop_costs.suspects([np.inf, 2.0, 3.0, 9.0, 5.0, 6.0]) == [3]
  assert loop_costs.suspects([1.0, 2.0, 3.0, 9.0]) == []


def _fake_timing(monkeypatch, per_iteration, spiky_calls):
  """`measure` on a clock that a fake loop advances: `per_iteration[g]`
  seconds an iteration plus 1 s of setup a call; gamma 4's calls whose
  ordinal (from 0) is in `spiky_calls` take 50% longer."""
  clock = {'now': 0.0, 4: 0}

  def run(target, draft, enc, keys, settings, policy):
    g, limit = int(policy.forced_gamma[0]), int(policy.max_iterations)
    its = min(limit, 16)
    cost = per_iteration[g] * its
    if g == 4 and limit > 1:
      cost *= 1.5 if clock[4] in spiky_calls else 1.0
      clock[4] += 1
    clock['now'] += 1.0 + cost
    return None, None, type('Stats', (), {'iterations': np.array([its])})

  monkeypatch.setattr(auto_costs, '_run', run)
  # The module's clock only (pytest's own timing keeps the real one).
  monkeypatch.setattr(
    loop_costs, 'time', types.SimpleNamespace(perf_counter=lambda: clock['now'])
  )


def test_measure_times_a_spike_again(monkeypatch):
  truth = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]
  settings = DecodeSettings(max_decode_len=64, gamma=8, gamma_policy=True)
  enc = np.zeros((2, 3), np.int32)
  # Gamma 4 slow in two of its three rounds (calls 1 and 2; call 0 is the
  # warm-up): its median is the spike until four more rounds outvote it.
  _fake_timing(monkeypatch, truth, spiky_calls={1, 2})
  got = auto_costs.measure(None, target_model(), enc, settings)
  np.testing.assert_allclose(got, truth, rtol=1e-6)
  # Negative control: without the retry the spike stays (pooled with its
  # neighbour by the isotonic fit, still above the truth).
  _fake_timing(monkeypatch, truth, spiky_calls={1, 2})
  got = auto_costs.measure(None, target_model(), enc, settings, retry_rounds=0)
  assert got[4] > 1.1 * truth[4]

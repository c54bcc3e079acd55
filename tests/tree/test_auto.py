"""tree='auto': the best tree per budget (vs brute force), the choice follows
the costs, and an auto decode is exact and reports what it chose.

The auto decode runs with fixed costs in `make test` (timing compiles one
loop per timed shape: two shapes are timed on their own); with all seven
shapes measured it is `slow` (`make test-slow`)."""

import itertools

import numpy as np
import pytest
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.core import tree_shape as tree_lib
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.tree import auto as tree_auto


def _expected(paths, acc):
  """Expected accepted tokens of a tree under the positional model."""
  prob = {(): 1.0}
  total = 0.0
  for p in sorted(paths, key=lambda p: (len(p), p)):
    d, r = len(p) - 1, p[-1]
    prob[p] = prob[p[:-1]] * np.prod(1.0 - acc[d, :r]) * acc[d, r]
    total += prob[p]
  return total


def _all_trees(n, depth, width):
  """Every valid tree of n nodes within depth x width (brute force)."""
  nodes = [
    p
    for d in range(1, depth + 1)
    for p in itertools.product(range(width), repeat=d)
  ]
  for combo in itertools.combinations(nodes, n):
    try:
      tree_lib.from_paths(combo)
    except ValueError:
      continue
    yield combo


def test_best_trees_are_optimal_for_every_budget():
  rng = np.random.default_rng(0)
  for _ in range(5):
    acc = rng.uniform(0.1, 0.9, (3, 2))
    trees = tree_auto.best_trees(acc, 6)
    for n in range(1, 7):
      paths, value = trees[n - 1]
      assert len(paths) <= n
      tree_lib.from_paths(paths)  # A valid tree.
      best = max(
        _expected(t, acc) for m in range(1, n + 1) for t in _all_trees(m, 3, 2)
      )
      np.testing.assert_allclose(_expected(paths, acc), best, rtol=1e-9)
      np.testing.assert_allclose(value, best, rtol=1e-9)


def test_choice_follows_the_verification_cost():
  acc = np.full((4, 4), 0.6)
  wide = tree_auto.choose(acc, (1.0, 0.0, 0.0))  # Nodes are free.
  narrow = tree_auto.choose(acc, (0.0, 1.0, 0.0))  # Time per node only.
  deep = tree_auto.choose(acc, (1.0, 0.0, 10.0))  # Depth is dear.
  assert wide['num_nodes'] == 32
  assert narrow['num_nodes'] == 1
  assert max(len(p) for p in deep['paths']) == 1 < deep['num_nodes']
  assert wide['expected_tokens_per_call'] > narrow['expected_tokens_per_call']


def test_cost_fit_recovers_a_linear_cost():
  timed = {}
  for branching in tree_auto.TIMED:
    shape = tree_lib.from_branching(branching)
    timed[branching] = 2.0 + 0.5 * shape.num_nodes + 0.25 * shape.depth
  np.testing.assert_allclose(tree_auto.fit_costs(timed), (2.0, 0.5, 0.25))


def _linear_seconds(target, draft, enc, settings, shapes=tree_auto.TIMED):
  """Fixed costs t = 2 + 0.5 n + 0.25 D per iteration (nothing timed)."""
  del target, draft, enc, settings
  out = {}
  for branching in shapes:
    shape = tree_lib.from_branching(branching)
    out[branching] = 2.0 + 0.5 * shape.num_nodes + 0.25 * shape.depth
  return out


def _check_auto_decode(target, draft, cost_fit=None):
  """tree='auto' decodes greedy-exactly and reports what it chose."""
  enc = encoder_batch(8, 7, 16, seed=3)
  plain = sd.generate(target, enc, max_decode_len=12)
  out = sd.generate(target, enc, draft=draft, tree='auto', max_decode_len=12)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  auto = out.tree['auto']
  assert auto['num_nodes'] == out.tree['num_nodes'] >= 1
  assert auto['expected_tokens_per_call'] >= 1.0
  assert auto['measured_tokens_per_call'] == out.tree['tokens_per_call']
  # One decode: the calibration's first iteration, then the chosen tree;
  # out.stats counts both (the calibration's depths included).
  cal = auto['calibration']
  calibration = tree_lib.from_branching(tree_auto.CALIBRATION)
  assert cal['paths'] == [list(p) for p in calibration.paths]
  assert cal['iterations'] == tree_auto.calibration_iterations(12) == 1
  depth = max(len(p) for p in auto['paths'])
  assert out.stats.gamma == max(calibration.depth, depth)
  # The provenance covers both phases: an iteration start per target call.
  for r in range(8):
    assert len(out.provenance.kinds(r)) == out.lengths[r]
    assert len(out.provenance.iterations(r)) == out.stats.row_iterations[r]
  if cost_fit is not None:
    np.testing.assert_allclose(auto['cost_fit'], cost_fit)


def test_auto_decodes_exactly_and_reports(target, near_draft, monkeypatch):
  """Calibration, choice and decode with fixed costs: the seven timing
  loops (one compile each) are the slow test's below."""
  monkeypatch.setattr(tree_auto, 'iteration_seconds', _linear_seconds)
  _check_auto_decode(target, near_draft, cost_fit=(2.0, 0.5, 0.25))


def test_iteration_seconds_times_compiled_tree_loops(target, near_draft):
  enc = encoder_batch(8, 7, 16, seed=3)
  settings = DecodeSettings(max_decode_len=12)
  seconds = tree_auto.iteration_seconds(
    target, near_draft, enc, settings, shapes=((1,), (2,))
  )
  assert sorted(seconds) == [(1,), (2,)]
  assert all(np.isfinite(t) and t > 0 for t in seconds.values())


@pytest.mark.slow
def test_auto_with_measured_costs_decodes_exactly_and_reports(
  target, near_draft
):
  _check_auto_decode(target, near_draft)

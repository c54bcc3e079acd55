"""tree='auto': the best tree per budget (vs brute force), the choice follows
the costs, and an auto decode is exact and reports what it chose."""

import itertools

import numpy as np
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.core import tree as tree_lib
from spec_decode.core import tree_auto


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
  cheap = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0, 32: 1.0}
  dear = {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0, 16: 16.0, 32: 32.0}
  wide = tree_auto.choose(acc, cheap, 0.0, 0.0)
  narrow = tree_auto.choose(acc, dear, 0.0, 0.0)
  assert wide['num_nodes'] == 32
  assert narrow['num_nodes'] == 1
  assert wide['expected_tokens_per_call'] > narrow['expected_tokens_per_call']


def test_auto_decodes_exactly_and_reports(target, near_draft):
  enc = encoder_batch(8, 7, 16, seed=3)
  plain = sd.generate(target, enc, max_decode_len=12)
  out = sd.generate(
    target, enc, draft=near_draft, tree='auto', max_decode_len=12
  )
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  auto = out.tree['auto']
  assert auto['num_nodes'] == out.tree['num_nodes'] >= 1
  assert auto['expected_tokens_per_call'] >= 1.0
  assert auto['measured_tokens_per_call'] == out.tree['tokens_per_call']
  assert sorted(auto['verify_seconds']) == [1, 2, 4, 8, 16, 32]

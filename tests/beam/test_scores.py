"""`beam.scores`: the tolerance speculative beam scores are held to."""

import numpy as np

from spec_decode.beam import scores


def test_the_measured_demo_difference_agrees_and_an_absolute_rule_would_not():
  # The largest difference measured on the demo pair (docs/guarantees.md):
  # 3.8e-5 absolute at a score of -122.70062 (64 tokens), 3 ulp relative.
  plain = np.float32([-122.70062, -11.952])
  spec = plain + np.float32([3.8146973e-05, 0.0])
  assert scores.agree(plain, spec)
  # The negative control: the absolute 1e-5 the docs used to state fails.
  assert not np.allclose(plain, spec, rtol=0.0, atol=1e-5)


def test_a_difference_beyond_rounding_is_refused():
  plain = np.float32([-122.70062])
  assert not scores.agree(plain, plain * np.float32(1 + 2e-5))
  assert not scores.agree(np.float32([0.0]), np.float32([2e-5]))

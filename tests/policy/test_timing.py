"""costs: c, v(k) and in-context iteration times run and are well formed.

Values are `make bench`'s business; these check shapes and invariants only.
"""

import math

import jax.numpy as jnp

from spec_decode.policy import timing


def test_measure_reports_c_and_v(target, near_draft):
  out = timing.measure(target, near_draft, ks=(2, 4), batch=2, repeats=1)
  assert set(out['v_of_k']) == {1, 2, 4}
  assert all(v > 0 and math.isfinite(v) for v in out['v_of_k'].values())
  assert out['c'] > 0 and math.isfinite(out['c'])
  assert out['target_step_seconds'] > 0 and out['draft_step_seconds'] > 0


def test_iteration_time_runs_target_then_draft_steps(target, near_draft):
  for gamma in (1, 3):
    t = timing.iteration_time(target, near_draft, gamma, repeats=1, batch=2)
    assert t > 0 and math.isfinite(t)
  # The carried token is computed from each call's logits: always id 0.
  states = tuple(
    m.score(
      m.init_state(jnp.full((2, 4), 5, jnp.int32), 12),
      jnp.zeros((2, 3), jnp.int32),
    )[1]
    for m in (target, near_draft)
  )
  last = timing._repeated_iterations(target, near_draft, states, 2, 2)
  assert last.shape == (2, 1) and int(last.sum()) == 0

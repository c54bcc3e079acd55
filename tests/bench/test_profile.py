"""profile_step: the trace of a speculative decode maps back to its HLO.

Structure only (scopes, kinds, HLO counts); timings are `make bench`'s.
"""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import encoder_batch

from spec_decode.bench import profile


def test_profile_splits_an_iteration_by_scope(target, near_draft):
  enc = encoder_batch(1, 6, target.vocab_size)
  out = profile.profile_iteration(
    target, near_draft, enc, gamma=3, max_decode_len=8, repeats=2
  )
  assert out['iterations'] >= 1
  assert set(out['split_ms']) == set(profile.SCOPES)
  assert all(v >= 0 for v in out['split_ms'].values())
  # Both models' calls and the loop's own work ran inside the loop.
  for scope in ('target', 'draft model', 'loop'):
    assert out['split_ms'][scope] > 0, scope
    assert set(out['kinds_ms'][scope]) <= set(profile.KINDS)
  busy = sum(v for k, v in out['split_ms'].items() if k != 'idle')
  assert out['loop_ms_per_iteration'] > 0 and busy > 0
  assert len(out['loop_ms_all']) == 2
  assert out['setup_ms'] > 0
  assert out['top'] and out['top'][0]['scope'] in profile.SCOPES
  hlo = out['hlo']
  assert hlo['thunks_per_iteration'] > 0
  assert hlo['cache_writes_per_iteration'] > 0


def test_hlo_instructions_attribute_scopes():
  def f(x, n):
    def body(c):
      i, y = c
      with jax.named_scope('target'):
        y = jnp.sin(y) @ y
      return i + 1, y.T

    return jax.lax.while_loop(lambda c: c[0] < n, body, (0, x))[1]

  text = jax.jit(f).lower(jnp.ones((4, 4)), 3).compile().as_text()
  instrs = profile.hlo_instructions(text)
  loops = [i for i in instrs.values() if i['kind'] == 'main loop']
  assert len(loops) == 1
  body = [i for i in instrs.values() if i['in_loop']]
  assert any(i['scope'] == 'target' for i in body)
  assert any(i['kind'] == 'dot' for i in body)
  assert not any(i['scope'] == 'setup' for i in body)
  np.testing.assert_array_equal(profile._bytes('f32[2,3]{1,0}'), 24)

"""Sharded beam search on 8 host CPU devices gives the unsharded beams.

Plain and speculative beam search with partitioned models (the rows on the
`data` axis, heads, mlp and vocabulary on `model`) must return exactly what
the unsharded models return: every beam's tokens, length and score, and the
steps and target calls of every row. As `tests/parallel/test_sharding.py`: XLA
fixes the
CPU device count at start-up, so `test_in_subprocess` reruns this file in a
fresh interpreter with `--xla_force_host_platform_device_count=8`, where
the mesh test runs.
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO

import spec_decode as sd
from spec_decode.parallel.partitioning import Partitioner

_DEVICES = 8
_INNER = 'SPEC_DECODE_BEAM_SHARDING_SUBPROCESS'
_VOCAB = 32
_KW = dict(num_beams=2, alpha=0.6, max_decode_len=8)


def _models():
  """A target with peaked outputs and a likely EOS (rows stop at different
  steps) and a draft near it (the draft's beams cover some steps, not all)."""
  config = sd.T5Config(
    vocab_size=_VOCAB,
    emb_dim=32,
    num_heads=4,
    head_dim=8,
    mlp_dim=64,
    num_encoder_layers=1,
    num_decoder_layers=2,
    mlp_activations=('gelu', 'linear'),
    dropout_rate=0.0,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=20,
  )
  target = sd.Model.init(config, seed=0)
  params = jax.tree.map(np.array, target.params)
  kernel = params['decoder']['logits_dense']['kernel'] * 3.0
  kernel[:, sd.EOS_ID] *= 3.0
  params['decoder']['logits_dense']['kernel'] = kernel
  target = target.with_params(params)
  noise = np.random.default_rng(1)
  draft = target.with_params(
    jax.tree.map(
      lambda x: (
        np.asarray(x)
        + 0.2 * np.std(x) * noise.standard_normal(x.shape).astype(np.float32)
      ),
      target.params,
    )
  )
  return target, draft


def _inputs(batch: int) -> np.ndarray:
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, _VOCAB, (batch, 7)).astype(np.int32)
  tokens[np.arange(7)[None] >= rng.integers(2, 8, batch)[:, None]] = 0
  return tokens


def _assert_same(out: sd.BeamSearchOutput, ref: sd.BeamSearchOutput) -> None:
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  np.testing.assert_array_equal(out.steps, ref.steps)
  np.testing.assert_array_equal(out.calls, ref.calls)
  # Sharded matmuls may sum in another order: scores to float32 rounding.
  np.testing.assert_allclose(out.scores, ref.scores, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
  jax.device_count() < _DEVICES,
  reason='runs in the 8-device subprocess of test_in_subprocess',
)
def test_sharded_beam_search_matches_unsharded():
  target, draft = _models()
  p = Partitioner(data=2, model=4)
  sharded_target = p.shard_params(target)
  sharded_draft = p.shard_params(draft)
  # 8 rows split over data = 2; 5 rows are padded to 6 and cut back.
  for batch in (8, 5):
    enc = _inputs(8)[:batch]
    ref = sd.beam_search(target, enc, **_KW)
    if batch == 8:  # (The padding is the same code for both searches.)
      _assert_same(sd.beam_search(sharded_target, enc, **_KW), ref)
    spec_kw = dict(_KW, draft=draft, gamma=2)
    spec_ref = sd.beam_search(target, enc, **spec_kw)
    spec_kw['draft'] = sharded_draft
    spec = sd.beam_search(sharded_target, enc, **spec_kw)
    _assert_same(spec, spec_ref)
    np.testing.assert_array_equal(spec.histogram, spec_ref.histogram)
    # Speculative beam search is plain beam search (tokens, steps).
    np.testing.assert_array_equal(spec.tokens, ref.tokens)
    np.testing.assert_array_equal(spec.steps, ref.steps)
    if batch == 8:
      # The case is not trivial: rows stop at different steps, and the
      # draft's beams cover some steps (the replay runs past one step).
      assert len(set(ref.steps.tolist())) > 1
      assert spec_ref.steps_per_call > 1.0


def test_in_subprocess():
  if jax.device_count() >= _DEVICES or os.environ.get(_INNER):
    pytest.skip('already running with the device mesh')
  env = dict(os.environ, JAX_PLATFORMS='cpu', **{_INNER: '1'})
  env['XLA_FLAGS'] = (
    env.get('XLA_FLAGS', '')
    + f' --xla_force_host_platform_device_count={_DEVICES}'
  )
  result = subprocess.run(
    [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-x',
     __file__],
    env=env,
    capture_output=True,
    text=True,
    timeout=1200,
    cwd=REPO,
  )  # fmt: skip
  report = result.stdout[-3000:] + result.stderr[-3000:]
  assert result.returncode == 0, report
  assert '1 passed' in result.stdout and 'failed' not in result.stdout, report

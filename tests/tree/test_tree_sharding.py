"""Sharded tree decoding on 8 host CPU devices gives the unsharded tokens.

As `tests/parallel/test_sharding.py`: XLA fixes the CPU device count at
start-up, so
`test_in_subprocess` reruns this file in a fresh interpreter with
`--xla_force_host_platform_device_count=8`, where the mesh test runs.
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
_INNER = 'SPEC_DECODE_TREE_SHARDING_SUBPROCESS'
TREE = (2, 2, 1)


def _models():
  config = sd.T5Config(
    vocab_size=32,
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


def _inputs() -> np.ndarray:
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, 32, (8, 7)).astype(np.int32)
  tokens[np.arange(7)[None] >= rng.integers(2, 8, 8)[:, None]] = 0
  return tokens


@pytest.mark.skipif(
  jax.device_count() < _DEVICES,
  reason='runs in the 8-device subprocess of test_in_subprocess',
)
def test_sharded_tree_matches_unsharded():
  # t = 1: the sharded program must also draw what the unsharded one does
  # (greedy is the same program without the draws).
  temperature = 1.0
  target, draft = _models()
  kw = dict(
    tree=TREE,
    temperature=temperature,
    max_decode_len=10,
    seed=np.arange(8) + 5,
  )
  ref = sd.generate(target, _inputs(), draft=draft, **kw)
  p = Partitioner(data=2, model=4)
  out = sd.generate(
    p.shard_params(target), _inputs(), draft=p.shard_params(draft), **kw
  )
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  np.testing.assert_array_equal(
    out.stats.row_accepted_histogram, ref.stats.row_accepted_histogram
  )
  assert len(set(ref.lengths.tolist())) > 1


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

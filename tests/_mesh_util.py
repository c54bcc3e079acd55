"""The 8-device CPU mesh of the sharding tests, and a tiny pair to shard.

XLA fixes the CPU device count when JAX starts, and the suite's conftest
starts JAX with one device. So each sharding test file reruns itself in a
fresh interpreter with `--xla_force_host_platform_device_count=8`
(`rerun_on_mesh`, from the file's `test_in_subprocess`), where its mesh
tests, skipped in the parent process (`needs_mesh`), run.
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO
from conftest import perturbed
from conftest import sharpened
from conftest import tiny_config

import spec_decode as sd

DEVICES = 8

needs_mesh = pytest.mark.skipif(
  jax.device_count() < DEVICES,
  reason='runs in the 8-device subprocess of test_in_subprocess',
)


def config(**overrides) -> sd.T5Config:
  """Heads, mlp, vocabulary and joined_kv all divide by 4: every rule of the
  partitioner applies on a (2, 4) mesh."""
  base = dict(vocab_size=32, num_heads=4, head_dim=8, num_encoder_layers=1)
  return tiny_config(**{**base, **overrides})


def pair(eos_scale: float = 3.0) -> tuple[sd.Model, sd.Model]:
  """A target with peaked outputs and a likely EOS (rows stop at different
  steps) and a draft near it (it agrees often, not always)."""
  target = sharpened(sd.Model.init(config(), seed=0), 3.0, eos_scale)
  return target, perturbed(target, 0.2, seed=1)


def inputs(batch: int = 8) -> np.ndarray:
  """`[batch, 7]` inputs of 2-7 tokens, padded."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, 32, (batch, 7)).astype(np.int32)
  tokens[np.arange(7)[None] >= rng.integers(2, 8, batch)[:, None]] = 0
  return tokens


def rerun_on_mesh(test_file: str, inner_flag: str) -> str:
  """Runs `test_file` in pytest on 8 host devices; returns its stdout.

  Skips when already on the mesh (`inner_flag` is the environment variable
  the child runs with). Fails with the child's report when it fails.
  """
  if jax.device_count() >= DEVICES or os.environ.get(inner_flag):
    pytest.skip('already running with the device mesh')
  env = dict(os.environ, JAX_PLATFORMS='cpu', **{inner_flag: '1'})
  env['XLA_FLAGS'] = (
    env.get('XLA_FLAGS', '')
    + f' --xla_force_host_platform_device_count={DEVICES}'
  )
  result = subprocess.run(
    [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-x',
     test_file],
    env=env,
    capture_output=True,
    text=True,
    timeout=1200,
    cwd=REPO,
  )  # fmt: skip
  report = result.stdout[-3000:] + result.stderr[-3000:]
  assert result.returncode == 0, report
  assert ' passed' in result.stdout and 'failed' not in result.stdout, report
  return result.stdout

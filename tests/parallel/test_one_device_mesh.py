"""Sharded decoding on a one-device mesh gives the unsharded tokens.

The 8-device tests (`test_sharding.py`) need host CPU devices; this one runs
on whatever one device there is, so the accelerator subset (`-m accel`)
checks the partitioned path on a GPU or TPU too.
"""

import jax
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.parallel.partitioning import Partitioner

_CONFIG = sd.T5Config(
  vocab_size=64,
  emb_dim=32,
  num_heads=2,
  head_dim=16,
  mlp_dim=64,
  num_encoder_layers=1,
  num_decoder_layers=2,
  mlp_activations=('gelu', 'linear'),
  dropout_rate=0.0,
)


@pytest.mark.accel
def test_one_device_mesh_equals_unsharded():
  enc = np.random.default_rng(0).integers(2, 64, (3, 7)).astype(np.int32)
  target = sd.Model.init(_CONFIG, seed=0)
  draft = sd.Model.init(_CONFIG.replace(num_decoder_layers=1), seed=1)
  mesh = Partitioner(data=1, model=1, devices=jax.devices()[:1])
  st = sd.Model.init(_CONFIG, seed=0, partitioner=mesh)
  sdr = sd.Model.init(
    _CONFIG.replace(num_decoder_layers=1), seed=1, partitioner=mesh
  )
  plain = sd.generate(target, enc, max_decode_len=10)
  for model, drafts in ((target, (None, draft)), (st, (None, sdr))):
    for d in drafts:
      out = sd.generate(model, enc, draft=d, gamma=3, max_decode_len=10)
      np.testing.assert_array_equal(out.tokens, plain.tokens)
      np.testing.assert_array_equal(out.lengths, plain.lengths)

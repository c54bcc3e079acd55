"""`spec-decode bench provenance`: the loop with and without provenance,
paired decode by decode (timings are reported, never asserted)."""

import numpy as np
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.bench import provenance


def test_measure_pairs_every_decode(target, near_draft):
  encs = [encoder_batch(1, 7, 16, seed=s) for s in (0, 1)]
  settings = sd.DecodeSettings(max_decode_len=8, gamma=2)
  out = provenance.measure(target, near_draft, encs, settings, rounds=2)
  assert out['pairs'] == 4
  assert out['seconds_on'] > 0 and out['seconds_off'] > 0
  lo, hi = out['ratio_ci95']
  assert lo <= out['ratio'] <= hi
  lo, hi = out['median_pair_ratio_ci95']
  assert lo <= out['median_pair_ratio'] <= hi
  assert np.isfinite(out['ratio'])

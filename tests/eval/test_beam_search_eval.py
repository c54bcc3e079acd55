"""Beam search in eval runs: `decode_method` settings and the Decoder."""

import dataclasses

import numpy as np
import pytest
from conftest import encoder_batch
from conftest import sharpened
from conftest import tiny_config

import spec_decode as sd
from spec_decode.eval import decoding
from spec_decode.eval import settings as settings_lib


def _settings(**kw):
  return settings_lib.EvalSettings(
    task='synthetic_tiny', max_decode_len=6, batch_size=3, **kw
  )


def test_decode_method_follows_temperature_by_default():
  assert _settings().method == 'greedy'
  assert _settings(temperature=1.0).method == 'sample'
  # The field keeps what was given, so changing the temperature of a run
  # that named no method keeps it valid (and resolves anew).
  sampled = dataclasses.replace(_settings(), temperature=1.0)
  assert sampled.decode_method is None and sampled.method == 'sample'
  assert sampled.reported()['decode_method'] == 'sample'
  beam = _settings(decode_method='beam', num_beams=2, beam_alpha=1)
  assert beam.beam and (beam.num_beams, beam.beam_alpha) == (2, 1.0)
  assert beam.reported()['decode_method'] == 'beam'
  assert beam.reported()['num_beams'] == 2
  assert 'num_beams' not in _settings().reported()


@pytest.mark.parametrize(
  'kw,match',
  [
    (dict(decode_method='beams'), 'decode_method must be one of'),
    (dict(decode_method='greedy', temperature=0.7), 'temperature 0'),
    (dict(decode_method='beam', temperature=0.7), 'temperature 0'),
    (dict(decode_method='sample'), 'temperature > 0'),
    (dict(decode_method='beam', top_k=5), 'top_k'),
    (dict(decode_method='beam', num_beams=0), 'num_beams must be'),
    (dict(decode_method='beam', beam_alpha=-1.0), 'beam_alpha must be'),
  ],
)
def test_bad_decode_settings_are_named(kw, match):
  with pytest.raises(ValueError, match=match):
    _settings(**kw)


def test_decoder_beam_mode_returns_the_best_beam():
  target = sharpened(sd.Model.init(tiny_config(), seed=0))
  enc = encoder_batch(3, 7, target.vocab_size, seed=4)
  s = _settings(decode_method='beam', num_beams=3, beam_alpha=0.6)
  out, seconds = decoding.Decoder(target, None, s)(enc, np.arange(3))
  ref = sd.beam_search(target, enc, num_beams=3, alpha=0.6, max_decode_len=6)
  np.testing.assert_array_equal(out.tokens, ref.tokens[:, 0])
  np.testing.assert_array_equal(out.lengths, ref.lengths[:, 0])
  np.testing.assert_array_equal(out.beams.scores, ref.scores)
  assert out.stats is None and seconds > 0

"""`DecodeSettings`: its width (the loop's sizes) apart from its gamma (what
the current call drafts), their defaults and their checks."""

import dataclasses

import numpy as np
import pytest

from spec_decode.core.decode_settings import DEFAULT_GAMMA
from spec_decode.core.decode_settings import DecodeSettings


@pytest.mark.parametrize(
  'given, width, gamma',
  [
    ({}, DEFAULT_GAMMA, DEFAULT_GAMMA),
    ({'gamma': 3}, 3, 3),
    ({'width': 6}, 6, 6),
    ({'width': 6, 'gamma': 2}, 6, 2),
    ({'width': np.int64(5), 'gamma': np.int32(5)}, 5, 5),
  ],
)
def test_either_defaults_to_the_other(given, width, gamma):
  s = DecodeSettings(max_decode_len=10, **given)
  assert (s.width, s.gamma) == (width, gamma)
  assert type(s.width) is int and type(s.gamma) is int
  # The buffer is sized by the width, never by the gamma.
  assert s.buffer_len == 10 + width + 2


def test_same_sizes_make_the_same_cache_key():
  a = DecodeSettings(max_decode_len=8, gamma=3)
  b = DecodeSettings(max_decode_len=8, width=3)
  assert a == b and hash(a) == hash(b)
  assert a != DecodeSettings(max_decode_len=8, width=4, gamma=3)


def test_a_smaller_gamma_keeps_the_width():
  # What the chain loop hands a drafter under gamma='auto'.
  s = DecodeSettings(max_decode_len=8, width=5, gamma_policy=True)
  g = dataclasses.replace(s, gamma=2)
  assert (g.width, g.gamma, g.buffer_len) == (5, 2, s.buffer_len)


@pytest.mark.parametrize(
  'given, message',
  [
    ({'width': 2, 'gamma': 3}, r'gamma \(3\) exceeds its width \(2\)'),
    ({'width': 0}, r'DecodeSettings\.width must be an int >= 1, got 0'),
    ({'gamma': 0}, r'DecodeSettings\.gamma must be an int >= 1, got 0'),
    ({'width': 4, 'gamma': -1}, r'DecodeSettings\.gamma must be an int >= 1'),
    ({'width': True}, r'DecodeSettings\.width must be an int >= 1, got True'),
    ({'gamma': 2.0}, r'DecodeSettings\.gamma must be an int >= 1, got 2\.0'),
    ({'gamma': 'auto'}, r"DecodeSettings\.gamma must be an int >= 1, got 'a"),
  ],
)
def test_bad_sizes_are_refused(given, message):
  with pytest.raises(ValueError, match=message):
    DecodeSettings(max_decode_len=8, **given)


def test_widening_alone_cannot_leave_gamma_above_width():
  s = DecodeSettings(max_decode_len=8, gamma=4)
  with pytest.raises(ValueError, match='exceeds its width'):
    dataclasses.replace(s, width=2)

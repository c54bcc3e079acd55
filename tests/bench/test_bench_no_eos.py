"""The bench counts the outputs it times that ran out without EOS."""

import numpy as np

import spec_decode as sd
from spec_decode.bench import report
from spec_decode.bench import speed


def test_no_eos_rows_counts_full_length_rows_without_eos():
  tokens = np.array([[5, 6, 7, 8], [5, 6, sd.EOS_ID, 0], [5, 6, 7, sd.EOS_ID]])
  out = sd.GenerateOutput(tokens, np.array([4, 3, 4]), None)
  assert speed.no_eos_rows(out, 4) == 1  # Row 0 only.
  assert speed.no_eos_rows(out, 5) == 0  # None reached 5.


def test_the_controlled_section_names_them():
  r = {'plain_no_eos': 1, 'plain_rows': 1, 'batch': {'4': {'no_eos': 3}}}
  line = report._no_eos_line(r)
  assert line.startswith('Outputs without EOS (ran to max_decode_len): 4 of 5')
  assert 'not counted' in report._no_eos_line({})

"""examples.html: Figure 1 colouring from the records' provenance, and the
page as a browser draws it (headless Chromium, Debian's `chromium`).

The Chromium test skips, saying why, where no Chromium is installed; CI
installs it (`.ci/run`) and sets SPEC_DECODE_REQUIRE_CHROMIUM=1, which turns
the skip into a failure.
"""

import os
import shutil
import subprocess

import numpy as np
import pytest

from spec_decode.core import provenance as prov
from spec_decode.eval.report import pages

A, R, B, T, S = prov.ACCEPTED, prov.REPLACED, prov.BONUS, prov.TARGET, 8
WORDS = ['<pad>', '</s>'] + [f'w{i}' for i in range(2, 40)]


def _decode(ids):
  """A toy vocabulary: id i is the word `w<i>`, EOS ends the text."""
  out = []
  for i in ids:
    if i == 1:
      break
    out.append(WORDS[i])
  return ' '.join(out)


def _record(index, tokens, codes, rejected, exact=True):
  starts = sum(1 for c in codes if c & S)
  return {
    'index': index,
    'input': f'translate English to German: input {index} <&>',
    'reference': 'ref',
    'plain': _decode(tokens),
    'speculative': {
      '4': {
        'text': _decode(tokens),
        'tokens': tokens,
        'exact': exact,
        'iterations': starts,
        'alpha': 0.75,
        'accepted_histogram': [0, 1, 0, 0, 1],
        'provenance': codes,
        'rejected': rejected,
      }
    },
  }


RESULTS = {
  'task': 'debian_ende',
  'split': 'test',
  'gammas': [4],
  'gamma': 4,
  'target': 'demo target',
  'draft': 'demo draft',
  'alpha': 0.75,
  'tokens_per_call': 2.5,
  'speedup_measured': 1.6,
  'speedup_predicted': 1.5,
  'per_position_acceptance': [0.9, 0.8, 0.7, 0.6],
  'sweep': [],
}
RECORDS = [
  # Iteration 1: four accepted and the bonus; 2: one accepted, then the
  # target replaces draft token 9 with 5; 3: a plain step, then EOS.
  _record(
    0,
    [2, 3, 4, 5, 6, 7, 5, 8, 1],
    [A | S, A, A, A, B, A | S, R, T | S, R | S],
    [[6, 9], [8, 3]],
  ),
  _record(1, [10, 11, 12, 1], [A | S, A, R, B | S], [[2, 30]], exact=False),
]


def test_token_texts_are_what_each_token_adds():
  assert pages.token_texts(_decode, [2, 3, 1]) == ['w2', ' w3', '</s>']


def test_coloured_output_marks_iterations_and_kinds():
  html = pages.coloured(_decode, [2, 3, 4, 5], [A | S, R, B | S, T | S], {1: 9})
  assert html == (
    '<span class="it"><span class="acc">w2</span>'
    '<span class="rej"> w9</span><span class="rep"> w3</span></span>'
    '<span class="it"><span class="bon"> w4</span></span>'
    '<span class="it"><span class="tgt"> w5</span></span>'
  )


def test_page_has_every_example_its_figures_and_escapes_text():
  page = pages.page(RESULTS, RECORDS, _decode)
  assert page.count('class="ex"') == 2
  assert 'input 0 &lt;&amp;&gt;' in page and '<&>' not in page
  assert 'α 0.75' in page and '2.25 tokens per target call' in page
  assert 'differs from plain decoding' in page  # Example 1.
  assert 'src="accepted_histogram.png"' in page
  assert 'src="position_acceptance.png"' in page
  assert 'timed apart: E[tok]/(γc+v) 1.50x' in page
  assert 'NO EOS' not in page  # Neither record ran out.


def test_page_names_outputs_without_eos_and_the_speedup_on_the_rest():
  ran_out = _record(2, [10] * 6, [A | S] + [A] * 5, [])
  ran_out['plain_ran_out'] = True
  ran_out['speculative']['4']['ran_out'] = True
  by_ending = {
    'no_eos': {
      'max_decode_len': 6,
      'plain': 1,
      'plain_token_share': 0.3,
      'speculative': 1,
      'speculative_token_share': 0.3,
    },
    'ends': {
      'examples': 2,
      'alpha': 0.6,
      'tokens_per_call': 2.0,
      'speedup_measured': 1.1,
      'speedup_spread': [1.0, 1.2],
    },
    'runs_out': {'examples': 1},
  }
  r = dict(RESULTS, num_examples=3, by_ending=by_ending)
  page = pages.page(r, [*RECORDS, ran_out], _decode)
  # One marker, on the example that ran out; the head names the count,
  # the token share and the figures on the outputs that end.
  assert page.count('NO EOS: plain and speculative output ran') == 1
  assert page.index('NO EOS: plain') > page.index('#1 ·')
  assert 'plain 1 of 3, 30% of plain output tokens' in page
  assert 'On the 2 outputs that end: speedup 1.10x (rounds 1.00-1.20x)' in page
  # The figure on the outputs that end leads; the run's overall figure
  # follows, labelled as all examples.
  assert page.index('outputs that end') < page.index('All 3: α 0.75')


def test_beam_page_shows_steps_per_call():
  beam = dict(RESULTS, decode_method='beam', num_beams=4, steps_per_call=2.0)
  rec = _record(0, [2, 3, 1], [], [])
  rec['plain_steps'] = 6
  spec = rec['speculative']['4']
  spec.update(steps=6, iterations=3, accepted_histogram=[1, 1, 1])
  del spec['provenance']
  page = pages.page(beam, [rec], _decode)
  assert '6 beam steps in 3 target calls (2.00 steps per call' in page
  assert 'class="acc"' not in page


def _chromium():
  for name in ('chromium', 'chromium-browser', 'google-chrome', 'chrome'):
    path = shutil.which(name)
    if path:
      return path
  if os.environ.get('SPEC_DECODE_REQUIRE_CHROMIUM'):
    pytest.fail('SPEC_DECODE_REQUIRE_CHROMIUM is set but no chromium found')
  pytest.skip(
    'no Chromium on PATH (Debian: apt-get install chromium); CI installs it'
  )


def screenshot(html_path: str, png_path: str, width=1000, height=700):
  """A headless Chromium screenshot of `html_path` (a PNG)."""
  subprocess.run(
    [
      _chromium(),
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--hide-scrollbars',
      f'--window-size={width},{height}',
      f'--screenshot={png_path}',
      'file://' + os.path.abspath(html_path),
    ],
    check=True,
    capture_output=True,
    timeout=120,
  )


def _share_of(image: np.ndarray, hex_color: str) -> float:
  """Fraction of the pixels within a few levels of `hex_color`."""
  rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])
  near = np.abs(image[..., :3].astype(int) - rgb).max(-1) <= 6
  return float(near.mean())


def test_chromium_draws_the_figure_1_colours(tmp_path):
  from matplotlib import image as mpimg  # pylint: disable=g-import-not-at-top

  path = pages.write(str(tmp_path), RESULTS, RECORDS, _decode)
  png = str(tmp_path / 'shot.png')
  screenshot(path, png)
  shot = (mpimg.imread(png) * 255).round().astype(np.uint8)
  assert shot.shape[0] >= 600 and shot.shape[1] >= 900
  for kind in ('accepted', 'rejected', 'replaced', 'bonus', 'target'):
    assert _share_of(shot, pages.COLORS[kind]) > 1e-4, kind
  # Negative control: a colour the page does not use is absent.
  assert _share_of(shot, '#ff00ff') == 0.0

"""The README and docs/: every relative link resolves (file and anchor), the
README stays short, and its first screen holds the picture, the quickstart
and the status."""

import glob
import os
import re
import unicodedata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, 'README.md')
PAGES = [README] + sorted(
  glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True)
)
_LINK = re.compile(r'\]\(([^)\s]+)\)')
_FENCE = re.compile(r'^```.*?^```', re.S | re.M)


def _anchor(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  text = heading.strip().lower()
  text = re.sub(r'`', '', text)
  kept = []
  for ch in text:
    if ch in ' -_' or unicodedata.category(ch)[0] in 'LN':
      kept.append(ch)
  return ''.join(kept).replace(' ', '-')


def _anchors(path: str) -> set[str]:
  with open(path, encoding='utf-8') as f:
    text = _FENCE.sub('', f.read())
  seen: dict[str, int] = {}
  out = set()
  for line in text.splitlines():
    m = re.match(r'#{1,6} (.*)', line)
    if not m:
      continue
    a = _anchor(m.group(1))
    n = seen.get(a, 0)
    seen[a] = n + 1
    out.add(a if n == 0 else f'{a}-{n}')
  return out


@pytest.mark.parametrize('page', PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(page):
  with open(page, encoding='utf-8') as f:
    text = _FENCE.sub('', f.read())
  broken = []
  for target in _LINK.findall(text):
    if re.match(r'[a-z]+:', target):
      continue  # http(s), mailto
    path, _, anchor = target.partition('#')
    full = (
      os.path.normpath(os.path.join(os.path.dirname(page), path))
      if path
      else page
    )
    if not os.path.exists(full):
      broken.append(target)
    elif anchor and full.endswith('.md') and anchor not in _anchors(full):
      broken.append(target)
  assert broken == []


def test_readme_is_short_and_its_first_screen_has_what_a_newcomer_needs():
  with open(README, encoding='utf-8') as f:
    text = f.read()
  assert len(text.encode()) < 15_000
  first = '\n'.join(text.splitlines()[:40])
  assert '](docs/figure1_demo.png)' in first
  assert 'make demo' in first and 'make test' in first
  assert '2-core CPU' in first and 'spec-decode bench accel' in first
  png = os.path.join(ROOT, 'docs', 'figure1_demo.png')
  assert 0 < os.path.getsize(png) < 200_000

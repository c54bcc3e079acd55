"""The measured speedup of an eval run: the median of its timing rounds'
ratios (`eval/rounds.py` runs the rounds), with their spread."""

from collections.abc import Sequence
from typing import Any

import numpy as np


def round_seconds(entry: dict[str, Any], key: str) -> list[float]:
  """A record's (or speculative entry's) seconds per round for `key`
  (`plain_seconds`, `seconds`, `draft_alone_seconds`); a record of a run
  from before the rounds has one."""
  return list(entry.get(f'{key}_rounds') or [entry[key]])


def speedups(records: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
  """The measured speedup of γ `key` over `records`, round by round.

  Each round's ratio is the records' plain seconds over their speculative
  seconds in that round; a run resumed with another number of rounds uses
  the rounds every record has.

  Returns:
    `{'speedup_measured'` (the median of the rounds' ratios),
    `'speedup_rounds'` (each round's), `'speedup_spread': [min, max]}`.
  """
  plain = [round_seconds(rec, 'plain_seconds') for rec in records]
  spec = [round_seconds(rec['speculative'][key], 'seconds') for rec in records]
  n = min(len(x) for x in plain + spec)
  ratios = [
    sum(p[r] for p in plain) / max(sum(s[r] for s in spec), 1e-12)
    for r in range(n)
  ]
  return {
    'speedup_measured': float(np.median(ratios)),
    'speedup_rounds': ratios,
    'speedup_spread': [min(ratios), max(ratios)],
  }

"""`spec-decode bench beam`: speculative against plain beam search.

The bench and what it builds its controlled pairs from:

  search.py      the bench: walltimes, calls and coverage per setting
  coverage.py    how many of the target's beams a draft tree covers
  controlled.py  a target/draft pair of controlled beam coverage
"""

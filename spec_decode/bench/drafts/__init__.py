"""Benches of drafts: their dtype, every drafter side by side, trees.

Each is a `spec-decode bench` subcommand (`bench/cli.py`):

  dtype.py         the draft's weights in float32 vs bfloat16 (c and alpha)
  table.py         every drafter on one task: alpha, c, speedup
  hierarchical.py  the hierarchical drafter against its parts
  trees.py         token trees against chains at equal target positions
  on_target.py     feature draft, early exit and Medusa heads against the
                   two-model drafts (alpha, tokens per call, c, speedup)
  interleaved.py   configurations timed interleaved, fastest round each
"""

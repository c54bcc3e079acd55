"""Sharding: `Partitioner` (a data x model mesh with T5X's logical axis
rules) and multi-host start-up, input slicing and gathering.

  partitioning.py  `Partitioner`: the mesh and T5X's logical-axis rules
  multihost.py     multi-host start-up, per-host input slices, gathering
  memory.py        bytes per device of a decode (parameters, state) as placed
"""

"""Sharding: `Partitioner` (a data x model mesh with T5X's logical axis
rules) and multi-host start-up, input slicing and gathering."""

"""Pieces every network family needs (T5 and T5Gemma), below both.

dot.py       float32 products summed in blocks on the CPU (torch's precision)
layout.py    where a decoder call's new tokens sit: positions and
             visibility of cache slots (causal, tree scratch slots), for
             caches whose slot of a buffer entry is given per row (a
             plain cache or a ring buffer)
params.py    parameters with their partitioning axes in the config's
             parameter dtype (every weight), the token embedding table
"""

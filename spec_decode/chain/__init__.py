"""Chains: plain, fixed-gamma and gamma='auto' decoding, and `generate`.

Their carries (PlainState, SpecState, AutoState) are `core.loop_state`'s.

plain.py       plain decoding: one target step per token
steps.py       one speculative iteration; a plain step inside one
fixed.py       the fixed-gamma loop
auto.py        the gamma='auto' loop (the in-loop policy, draft catch-up)
loops.py       the loops' compiled entry points
auto_costs.py  gamma='auto''s cost model: this loop's seconds per gamma
generation.py  `generate`: checks, keys, placement, plain/chain/tree, stats
"""

"""Beam search, plain and exactly speculative.

rules.py        the beam rules (T5X beam search's step, length penalty)
search.py       `beam_search`: checks, plain or speculative, outputs
draft_trees.py  the draft's token tree per live beam
speculative.py  exact speculative beam search (trees verified per beam)
scores.py       how close its scores are to plain's (the tolerance, why)
policy.py       its gamma='auto': speculate or take a plain step
costs.py        that policy's two costs, measured once and cached
"""

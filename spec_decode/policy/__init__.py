"""Cost measurement and the gamma policy (read by the loops, never reading
their draws).

  finish_time.py  gamma='auto': the per-iteration finish-time choice
  carried.py      the acceptance estimate carried from decode to decode
  loop_costs.py   seconds per loop iteration at each gamma, timed on forced runs
  cost_cache.py   measured seconds cached by shapes, settings and device
  timing.py       timing c and v(k) (draft step / target call costs)
"""

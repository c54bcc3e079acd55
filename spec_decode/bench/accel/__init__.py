"""`spec-decode bench accel`: the paper's pair measured on an accelerator.

One command in a time budget (`run.py` says what it measures); `--tiny` is
its CPU rehearsal.

  run.py       the command line and the sections in order
  plan.py      the sizes, the order and the time boxes (`Deadline`)
  record.py    results written after every measurement (JSON, Markdown)
  report.py    the Markdown tables
  sizes.py     one target size: step time, v(k), c, speedups vs Theorem 3.8
  identity.py  greedy identity of speculative and plain output in a dtype
  pair.py      XXL/small: batching, trees vs chains, beam search
"""

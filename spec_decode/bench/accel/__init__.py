"""`spec-decode bench accel`: the paper's pair measured on an accelerator.

One command in a time budget (`run.py` says what it measures, in what
order); `--tiny` is its CPU rehearsal; `launch_gpu.sh accel` runs it and
the accel tests on a lent GPU.

  run.py        the command line, the models and the items in order
  runner.py     items run in order, each only where its prediction fits
  plan.py       the sizes (T5, the T5Gemma pair), the core, the time
                shares (`Deadline`)
  cost.py       predicted item seconds; a step's memory-bandwidth bound
  record.py     results written after every measurement (JSON, Markdown)
  report.py     the Markdown tables
  smoke.py      the first seconds: versions, APIs, bandwidth, toy decodes
  api_check.py  every JAX API the decode, bench and tests use, called once
  shapes.py     the real sizes' programs traced abstractly (the rehearsal)
  weights.py    random weights by one small program per shape (fast compile)
  sizes.py      one target (a T5 size or the T5Gemma pair's): step time,
                v(k), c, speedups vs Theorem 3.8
  identity.py   greedy identity of speculative and plain output in a dtype
  pair.py       XXL/small: batching, trees vs chains, beam search
"""

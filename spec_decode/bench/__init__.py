"""Benchmarks: `spec-decode bench` (`make bench`) and its sub-benchmarks.

Each prints Markdown tables and writes JSON; performance is measured here,
never asserted by a unit test.

  cli.py              `spec-decode bench`: the speed run, or one BENCHMARK
  speed.py            the speed run's sections, side by side in one process
  report.py           the Markdown tables printed from the JSON results
  controlled.py       a draft with a set acceptance rate (ControlledDraft)
  batch_policy.py     gamma='auto' against plain and every fixed gamma
  kernel.py           XLA's dot against the small-K kernel, inside jit
  kernel_sections.py  section 7: the decode sections with the kernel on/off
  profile.py          where a speculative iteration's time goes (a trace)
  peer.py             our decoding against Hugging Face transformers
  load.py             load time and peak memory of each checkpoint format
  memory.py           bytes per device, measured against the capacity plan
  provenance.py       the loop with and without tokens' provenance (its cost)
  infer.py            the infer job, plain against speculative (predictions/s)
  sum_blocks.py       float32 sums in blocks against XLA's (cost, precision)
  accel/              the accelerator bench (`bench accel`), in a budget
  beam/               speculative against plain beam search
  drafts/             drafts: their dtype, every drafter, hierarchical, trees
"""

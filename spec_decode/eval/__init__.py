"""Eval runs: a task split decoded plainly and speculatively, side by side.

settings.py   EvalSettings: what a run decodes and how, checked when built
loading.py    load_model, task_vocabulary; how a run names its models
decoding.py   batches decoded and timed; the step costs c and v
records.py    the run's files, written crash-safely; resume
report.py     results.json's numbers, summary.md, the plots
run.py        evaluate (and the names gin files use as `spec_eval`)
compare.py    several runs side by side (drafters, t, lenience, dyn. γ)
drafters.py   drafters built from gin (n-gram, copy, heads, hierarchical)
cli.py        `spec-decode eval` (the only module here that uses gin)
"""

"""Eval runs: a task split decoded plainly and speculatively, side by side.

settings.py   EvalSettings: what a run decodes and how, checked when built
load/         what a run loads: its models (load_model, task_vocabulary),
              the drafters gin builds, the task split (our readers or seqio)
decoding.py   batches decoded and timed; the step costs c and v
rounds.py     each batch's decodes and cost probes in rotating rounds
records.py    the run's files, written crash-safely; resume
report/       results.json's numbers, summary.md, the plots and examples.html
               (outputs that end vs run out, the rounds' speedup)
run.py        evaluate (and the names gin files use as `spec_eval`)
compare.py    several runs side by side (drafters, t, lenience, dyn. γ)
hosts.py      several processes: who feeds which rows, who writes
cli.py        `spec-decode eval` (with t5x_run_cli.py, the only modules here
              that use gin)
t5x_run_cli.py  T5X's run files, macros and flags; the aliases
verify_cli.py `spec-decode verify`: is a target/draft pair exact?
infer/        `spec-decode infer`: inputs decoded speculatively only, T5X
              infer.py's files (task reading, hosts, records shared)
"""

"""What an eval or infer run loads before it decodes.

models.py     load_model, partitioner, task_vocabulary; how a run names its
              models (`describe`, `fingerprint`)
drafters.py   drafters built from gin (n-gram, copy, heads, hierarchical;
              gin files import it as `spec_eval_drafters`)
task_data.py  a task split as a run uses it: our readers or seqio's tasks
"""

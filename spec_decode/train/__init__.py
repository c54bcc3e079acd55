"""Training: T5 models, and Medusa heads and feature drafts on a frozen
target.

lm.py        T5 training (`TrainSettings`, `run`; `train` is what gin
             binds)
heads.py     Medusa heads (`HeadsTrainSettings`, `run`; gin binds
             `train_heads`)
feature.py   EAGLE-style feature drafts (`FeatureTrainSettings`, `run`;
             gin binds `train_feature`)
greedy.py    the target's greedy outputs (the heads' data), cached
common.py    what both share: data buckets, optimizer, checkpoints, log
             and the loop
job.py       the frame both runs share: the entry points' signature, the
             optimizer and state, the tail (loop, export, closing line)
pair_job.py  `spec-decode train pair`: the demo pair trained on a GPU in
             one go (both stages as `spec-decode train` children, one
             budget)
parts.py     models as tar parts of bounded size and back (`spec-decode
             train pair-unpack`)
cli.py       `spec-decode train`, the only module that deals with gin
"""

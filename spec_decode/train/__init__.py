"""Training: `lm` (T5 models), `heads` (Medusa heads on a frozen target),
`greedy` (the target's greedy outputs, the heads' data), `common` (data
buckets, optimizer, checkpoints, log and the loop both share) and `cli`
(`spec-decode train`, the only module that deals with gin)."""

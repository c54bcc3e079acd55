"""Infer runs: inputs decoded speculatively only, T5X infer.py's files.

settings.py   InferSettings: EvalSettings plus an input file, trees, T5X's
              infer mode and chunk size; checked when built
inputs.py     a text or JSONL file of inputs (no seqio); bad lines
decode.py     a batch decoded with the draft; T5X's prediction lines
chunks.py     chunks written whole, resumed, merged into T5X's files
page.py       examples.html: the first predictions as the paper's Figure 1
run.py        infer (and the names gin files use as `spec_infer`)
cli.py        `spec-decode infer` (the only module here that uses gin)
"""

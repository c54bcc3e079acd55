"""The engine's primitives: what every decode (chain, tree, beam) uses.

No gin, no T5 specifics, no files. The loops above talk to models only
through `protocol.LanguageModel` and to drafters only through
`drafter.Drafter`.

  protocol.py        the language-model protocol (init_state, score, rollback)
  drafter.py         the drafter protocol (propose) and its data
  model_drafter.py   any language model as a drafter (G autoregressive steps)
  sampling.py        logits -> distribution (argmax, temperature, top-k/p)
  rejection.py       Algorithm 1: accept/reject, residual, bonus token
  verified_block.py  one proposed block verified, with the per-row draw keys
  loop_state.py      the loops' carry and token buffer; committing a block
  counters.py        what a speculative decode counts (loop and host)
  provenance.py      where each output token came from (Figure 1)
  decode_settings.py the static settings of a decode
  ids.py             the pad, EOS and unk ids the loops rely on (T5's)
  inputs.py          checks of the caller's inputs; per-row keys from a seed
  tree_shape.py      token-tree shapes and their static tables
  tree_draft.py      children of every tree node drawn from draft logits
  placement.py       the mesh interface the decodes need; host arrays
"""

"""The engine: speculative decoding for any pair of language models.

No gin, no T5 specifics, no files but auto_gamma's cost cache. The loops
talk to models only through `protocol.LanguageModel` and to drafters only
through `drafter.Drafter`.

  protocol.py        the language-model protocol (init_state, score, rollback)
  drafter.py         the drafter protocol (propose) and its data
  model_drafter.py   any language model as a drafter (G autoregressive steps)
  sampling.py        logits -> distribution (argmax, temperature, top-k/p)
  verify.py          Algorithm 1: accept/reject, residual, bonus token
  verify_block.py    one proposed block verified, with the per-row draw keys
  decode_settings.py the static settings of a decode
  loops.py           plain and speculative `lax.while_loop`s
  generation.py      `generate`: checks, keys, placement, stats
  tree.py            token-tree shapes and their static tables
  tree_draft.py      children of every node drawn from a drafter's logits
  tree_verify.py     exact tree verification (greedy, recursive rejection)
  tree_loop.py       the tree `lax.while_loop` (one target call per tree)
  tree_generate.py   `generate(tree=...)`: checks, the loop, its report
  tree_auto.py       tree='auto': shape from measured acceptance and cost
  placement.py       the mesh interface generate needs; host arrays
  costs.py           timing c and v(k)
  gamma_policy.py    gamma='auto': the per-iteration finish-time policy
  auto_gamma.py      its cost model: loop seconds per gamma, cached on disk
  pair_check.py      is a target/draft pair exact? (`sd.verify`)
  ids.py             pad/start, EOS and unk ids
"""

"""Token trees: drafted trees verified in one target call each.

  verification.py  exact tree verification (greedy, recursive rejection)
  loop.py          the tree `lax.while_loop` (one target call per tree)
  auto.py          tree='auto': a shape from measured acceptance and cost
  generation.py    `generate(tree=...)`: checks, the loop, its report

Tree shapes and the drafting of a tree's nodes are primitives (`core`).
"""

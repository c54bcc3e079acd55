"""Parameters as both network families declare them.

A parameter carries its logical partitioning axes (names a mesh's rules map
to devices, `parallel/`) and is stored in the module config's
`param_dtype`; T5's and T5Gemma's modules declare every weight this way,
and both embedding tables alike.
"""

from typing import Callable

import flax.linen as nn


def param(module: nn.Module, name: str, init: Callable, shape, axes):
  """`module`'s parameter `name` of `shape`, partitioned along `axes`."""
  return module.param(
    name,
    nn.with_logical_partitioning(init, axes),
    shape,
    module.config.param_dtype,
  )


def embedding(module: nn.Module, vocab_size: int, emb_dim: int):
  """The token embedding table `[vocab_size, emb_dim]` (unit-normal at
  init, `vocab` by `embed` axes), `module`'s parameter `embedding`."""
  return param(
    module,
    'embedding',
    nn.initializers.normal(1.0),
    (vocab_size, emb_dim),
    ('vocab', 'embed'),
  )

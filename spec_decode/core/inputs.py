"""What every decode checks of its caller's inputs, before anything compiles.

`generate` (chains and trees) and `beam_search` share these, so a bad
input gets the same error whichever decode it reaches: encoder tokens, a
draft's vocabulary against the target's, integer settings, and the
per-row keys made from a seed. `parse_gamma` is the one reading of a γ,
`gamma_flag` the same for the command lines' flags.
"""

import argparse
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

INTS = (int, np.integer)


def check_int(name: str, value: Any, low: int) -> int:
  """`value` as an int, or ValueError unless it is an int >= `low`."""
  if isinstance(value, bool) or not isinstance(value, INTS) or value < low:
    raise ValueError(f'{name} must be an int >= {low}, got {value!r}')
  return int(value)


AUTO = 'auto'


def is_auto(value: Any) -> bool:
  """Whether `value` spells 'auto' (any case, surrounding whitespace)."""
  return isinstance(value, str) and value.strip().lower() == AUTO


def parse_gamma(
  value: Any, name: str = 'gamma', auto: bool = True
) -> int | str:
  """The one reading of a γ for every entry point (`generate`,
  `beam_search`, `verify`, the eval settings and the command lines):
  `'auto'` in any case with surrounding whitespace, or an int >= 1, given
  as an int (numpy's too) or as its decimal text. Anything else is a
  ValueError with one text: `{name} must be an int >= 1 or 'auto', got
  {value!r}`. With `auto=False` (a command that times fixed γs) 'auto' is
  refused too, and the text is `{name} must be an int >= 1, got
  {value!r}`."""
  if auto and is_auto(value):
    return AUTO
  number = value
  if isinstance(value, str):
    try:
      number = int(value.strip())
    except ValueError:
      number = None
  if isinstance(number, bool) or not isinstance(number, INTS) or number < 1:
    what = "an int >= 1 or 'auto'" if auto else 'an int >= 1'
    raise ValueError(f'{name} must be {what}, got {value!r}')
  return int(number)


def parse_gammas(
  text: str, name: str = 'gammas', auto: bool = True
) -> tuple[int | str, ...]:
  """A command line's list of γs: `parse_gamma` of each comma-separated
  item of `text` (an empty item is refused like any bad γ)."""
  return tuple(parse_gamma(g, name, auto) for g in text.split(','))


def gamma_flag(
  name: str = 'gamma', auto: bool = True, many: bool = False
) -> Callable[[str], Any]:
  """`parse_gamma` as an argparse `type=`: the flag's text read as one γ
  (`many`: a tuple of its comma-separated γs), its ValueError text the
  usage error (`argument --gamma: gamma must be an int >= 1 or 'auto',
  got 'fast'`)."""

  def read(text: str) -> Any:
    try:
      if many:
        return parse_gammas(text, name, auto)
      return parse_gamma(text, name, auto)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e)) from None

  return read


def check_tokens(encoder_tokens: Any, vocab_size: int) -> np.ndarray:
  """`encoder_tokens` as a `[B, S] int32` host array, or ValueError.

  It must be a non-empty 2-D integer array with every id in
  `[0, vocab_size)`.
  """
  tokens = np.asarray(encoder_tokens)
  if tokens.ndim != 2 or 0 in tokens.shape:
    raise ValueError(
      'encoder_tokens must be a non-empty 2-D [batch, length] array, got '
      f'shape {tokens.shape}'
    )
  if not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f'encoder_tokens must be integers, got {tokens.dtype}')
  if tokens.min() < 0 or tokens.max() >= vocab_size:
    raise ValueError(
      f'encoder_tokens ids must be in [0, {vocab_size}), got '
      f'[{tokens.min()}, {tokens.max()}]'
    )
  return tokens.astype(np.int32)


def check_model_tokens(model: Any, encoder_tokens: Any) -> np.ndarray:
  """`check_tokens` against `model`'s vocabulary, then the model's own
  input check when it has one (`protocol.InputCheck`: e.g. T5Gemma 2
  refuses image placeholders)."""
  tokens = check_tokens(encoder_tokens, model.vocab_size)
  check = getattr(model, 'check_encoder_tokens', None)
  if check is not None:
    check(tokens)
  return tokens


def check_pair(target: Any, draft: Any) -> None:
  """Raises ValueError unless draft and target share a vocabulary.

  Same number of ids, and where both carry a vocabulary (a sentencepiece
  model), the same one: two models of one size with different
  sentencepiece files would verify ids that mean different words.
  """
  if draft.vocab_size != target.vocab_size:
    raise ValueError(
      f'draft and target vocabularies differ: draft vocabulary size '
      f'{draft.vocab_size}, target vocabulary size {target.vocab_size}'
    )
  tv = getattr(target, 'vocabulary', None)
  dv = getattr(draft, 'vocabulary', None)
  if tv is not None and dv is not None and tv != dv:
    raise ValueError(
      'draft and target vocabularies differ (same size, '
      'different sentencepiece models)'
    )


@functools.partial(jax.jit, static_argnames='batch')
def _folded_keys(base: jax.Array, batch: int) -> jax.Array:
  # One compiled program: run eagerly, the vmap of fold_in dispatched op
  # by op and took about 3 ms per call, a tenth of a batch-1 demo decode.
  return jax.vmap(lambda r: jax.random.fold_in(base, r))(
    jnp.arange(batch, dtype=jnp.uint32)
  )


def row_keys(seed: Any, batch: int) -> jax.Array:
  """One key per row: `key(seed[r])` for an array, else fold_in(key(seed), r).

  Created outside jit and passed in, as the design requires.
  """
  if isinstance(seed, INTS) and not isinstance(seed, bool):
    return _folded_keys(jax.random.key(int(seed)), batch)
  seeds = np.asarray(seed)
  if seeds.shape != (batch,) or not np.issubdtype(seeds.dtype, np.integer):
    raise ValueError(
      f'seed must be an int or an int array of shape [{batch}], got {seed!r}'
    )
  return jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))

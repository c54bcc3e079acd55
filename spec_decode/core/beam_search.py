"""`beam_search`: T5X's beam search, one jitted `lax.while_loop`.

Each loop iteration scores the newest token of every live beam (the batch
flattened to `B * K` model rows, beams of a row adjacent), applies
`beam_rules.step` to the log-probabilities, and reorders the model's
decode state by parent beam, so that row `b * K + j` holds the cache of
new beam j. Every row has its own step counter, and so its own cache index:
a row that stops keeps its beams (and its cache index) while the others go
on, and the loop ends when every row has stopped.

Shapes: `B` rows, `K` beams, `V` vocabulary, `M` = max_decode_len.
"""

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spec_decode.core import beam_rules
from spec_decode.core import placement
from spec_decode.core.ids import EOS_ID
from spec_decode.core.protocol import DecodeState
from spec_decode.core.protocol import LanguageModel

_INTS = (int, np.integer)


@dataclasses.dataclass(frozen=True)
class BeamSettings:
  """Static settings of a beam search (part of the jit cache key).

  Attributes:
    num_beams: K, beams kept per row (and sequences returned).
    alpha: brevity-penalty exponent (>= 0).
    max_decode_len: M, output tokens per sequence at most (EOS included).
    eos_id: end-of-sequence id.
  """

  num_beams: int
  alpha: float
  max_decode_len: int
  eos_id: int = EOS_ID

  @property
  def buffer_len(self) -> int:
    # Inputs 0..M-1 are fed; a stopped row rewrites slot `step` <= M.
    return self.max_decode_len + 1


@flax.struct.dataclass(kw_only=True)
class BeamLoopState:
  """Carry of the beam-search loop.

  Attributes:
    beams: `beam_rules.Beams` of every row.
    done: `[B] bool` rows that have stopped (`beam_rules.stopped`).
    model: the model's decode state of `B * K` rows (row `b * K + j` is live
      beam j of row b), index `[B * K]` = that row's step.
  """

  beams: beam_rules.Beams
  done: jax.Array
  model: DecodeState


@dataclasses.dataclass(frozen=True)
class BeamSearchOutput:
  """Result of `beam_search` (numpy, on the host).

  Attributes:
    tokens: `[B, K, M] int32` sequences, best first; pad (0) after EOS.
    scores: `[B, K] float32` log-probability over the brevity penalty
      `((5 + length) / 6) ** alpha` for finished sequences; for a row where
      none finished, the live beams' log-probabilities (T5X's rule).
    lengths: `[B, K] int32` output tokens including EOS (0 for an empty
      finished slot: fewer than K sequences finished).
    steps: `[B] int32` beam-search steps each row took (= target calls).
  """

  tokens: np.ndarray
  scores: np.ndarray
  lengths: np.ndarray
  steps: np.ndarray


def reorder_rows(lm: Any, state: DecodeState, rows: jax.Array) -> DecodeState:
  """Row i of the result is row `rows[i]` of `state` (`rows [N] int32`).

  Uses the model's `reorder_beams` when it has one (`protocol.BeamReorder`:
  e.g. a T5 `Model` moves only its self-attention cache), else gathers
  every leaf of the state (the protocol gives each a leading batch axis).
  """
  reorder = getattr(lm, 'reorder_beams', None)
  if reorder is not None:
    return reorder(state, rows)
  return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), state)


def beam_decode(
  model: LanguageModel, encoder_tokens: jax.Array, settings: BeamSettings
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Beam search over `encoder_tokens [B, S]`.

  Returns:
    tokens `[B, K, M]`, scores `[B, K]`, lengths `[B, K]` (best first) and
    steps `[B]`.
  """
  batch = encoder_tokens.shape[0]
  k = settings.num_beams
  alpha = settings.alpha
  state = model.init_state(encoder_tokens, settings.buffer_len)
  # The encoder runs once per row; its outputs are copied to the K beams.
  state = jax.tree.map(lambda x: jnp.repeat(x, k, axis=0), state)
  beams = beam_rules.Beams.init(batch, k, settings.max_decode_len)
  group = jnp.arange(batch, dtype=jnp.int32)[:, None] * k

  def body(s: BeamLoopState) -> BeamLoopState:
    b = s.beams
    lm_state = model.rollback(s.model, jnp.repeat(b.step, k))
    logits, lm_state = model.score(
      lm_state, b.last_tokens().reshape(batch * k, 1)
    )
    log_probs = jax.nn.log_softmax(logits[:, 0], axis=-1)
    new, parents = beam_rules.step(
      b,
      log_probs.reshape(batch, k, -1),
      alpha,
      settings.eos_id,
      ~s.done,
    )
    lm_state = reorder_rows(model, lm_state, (group + parents).reshape(-1))
    done = s.done | beam_rules.stopped(new, alpha)
    return BeamLoopState(beams=new, done=done, model=lm_state)

  s = BeamLoopState(
    beams=beams, done=beam_rules.stopped(beams, alpha), model=state
  )
  s = lax.while_loop(lambda s: jnp.any(~s.done), body, s)
  tokens, scores, lengths = beam_rules.outputs(s.beams, settings.eos_id)
  return tokens, scores, lengths, s.beams.step


beam_decode_jit = jax.jit(beam_decode, static_argnames=('settings',))


def _check_int(name: str, value: Any, low: int) -> int:
  if isinstance(value, bool) or not isinstance(value, _INTS) or value < low:
    raise ValueError(f'{name} must be an int >= {low}, got {value!r}')
  return int(value)


def _check_tokens(encoder_tokens: Any, vocab_size: int) -> np.ndarray:
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


def beam_search(
  model: LanguageModel,
  encoder_tokens: Any,
  num_beams: int = 4,
  alpha: float = 0.6,
  max_decode_len: int = 64,
  draft: Any = None,
  gamma: int = 4,
  eos_id: int = EOS_ID,
) -> BeamSearchOutput:
  """Beam search with T5X's rules (`t5x.decoding.beam_search`).

  Per step, the 2K best one-token extensions of the live beams are taken;
  those ending in EOS compete for the K finished slots with the score
  log p / ((5 + length) / 6) ** alpha, the K best others are the new live
  beams. A row stops after M steps or once no live beam can still enter
  its full finished set. `docs/decoding.md` states the rules in full.

  Args:
    model: the language model (a T5 `Model`, a `TableLM`, ...).
    encoder_tokens: `[B, S]` ints in [0, V), 0 = padding.
    num_beams: K >= 1.
    alpha: brevity-penalty exponent >= 0 (T5X's default 0.6; 0 ranks
      finished sequences by log-probability alone).
    max_decode_len: M >= 1, output tokens per sequence at most.
    draft: must be None: speculative beam search needs the token trees of
      issue 14 and is not built yet.
    gamma: draft steps per target call, for speculative beam search (an
      int >= 1; unused while `draft` is None).
    eos_id: end-of-sequence id.

  Sharded models (`partitioner=`) decode sharded, as in `generate`: the
  rows go on the `data` axis (padded with copies of the last row).

  Returns:
    `BeamSearchOutput`: tokens `[B, K, M]`, scores `[B, K]`, lengths
    `[B, K]` (best first) and the steps each row took.

  Raises:
    ValueError: a bad argument (before anything compiles).
    NotImplementedError: a `draft` was given.
  """
  num_beams = _check_int('num_beams', num_beams, 1)
  max_decode_len = _check_int('max_decode_len', max_decode_len, 1)
  _check_int('gamma', gamma, 1)
  if (
    isinstance(alpha, bool)
    or not isinstance(alpha, (int, float, np.integer, np.floating))
    or not np.isfinite(alpha)
    or alpha < 0
  ):
    # The stop rule bounds a live beam's best score with the penalty at
    # length M + 1, the largest only when alpha >= 0.
    raise ValueError(f'alpha must be a finite number >= 0, got {alpha!r}')
  if model.vocab_size < 2:
    raise ValueError(
      f'beam search needs a vocabulary of 2 ids or more, got {model.vocab_size}'
    )
  if draft is not None:
    raise NotImplementedError(
      'speculative beam search (draft=...) needs the token-tree machinery '
      'of issue 14 and is not implemented yet; call beam_search with '
      'draft=None for plain beam search'
    )
  if placement.is_global(encoder_tokens):
    raise ValueError(
      'beam_search takes host arrays; a batch spanning hosts is not supported'
    )
  tokens = _check_tokens(encoder_tokens, model.vocab_size)
  batch = tokens.shape[0]
  settings = BeamSettings(
    num_beams=num_beams,
    alpha=float(alpha),
    max_decode_len=max_decode_len,
    eos_id=int(eos_id),
  )
  mesh = placement.placement_of(model)
  if mesh is not None:
    model = mesh.place(model)
    keys = jax.random.split(jax.random.key(0), batch)
    enc, _ = placement.sharded_inputs(mesh, tokens, keys)
  else:
    enc = jnp.asarray(tokens)
  out = placement.to_host(beam_decode_jit(model, enc, settings=settings))
  tokens, scores, lengths, steps = (x[:batch] for x in out)
  return BeamSearchOutput(tokens, scores, lengths, steps)

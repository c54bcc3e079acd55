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

from spec_decode.beam import costs as beam_costs
from spec_decode.beam import draft_trees
from spec_decode.beam import policy as beam_policy
from spec_decode.beam import rules as beam_rules
from spec_decode.beam import speculative as spec_beam
from spec_decode.core import inputs
from spec_decode.core import model_drafter
from spec_decode.core import placement
from spec_decode.core import tree_shape
from spec_decode.core.ids import EOS_ID
from spec_decode.core.protocol import DecodeState
from spec_decode.core.protocol import LanguageModel

# Default draft tree per live beam (`draft_beams`, `draft_children`).
# Measured on the demo pair (Debian EnDe, batch 1; docs/decoding.md): one
# kept node with 2 children per level was fastest or near it at K = 1, 2, 4.
DRAFT_BEAMS = 1
DRAFT_CHILDREN = 2
# Tree depth of `gamma='auto'`'s speculative calls (`max_auto_gamma`).
AUTO_GAMMA = 2


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
    steps: `[B] int32` beam-search steps each row took.
    calls: `[B] int32` target calls each row took (= steps in plain beam
      search; speculative beam search commits 1 .. gamma + 1 steps per
      call; with gamma='auto' the plain steps are calls too, and the
      speculative calls are `histogram.sum(1)`).
    histogram: speculative beam search: `[B, gamma + 1] int32` target
      calls that committed 1 + a steps, a = 0..gamma (a: the draft depths
      covered); None for plain beam search.
    depth_tries: speculative beam search: `[B, gamma] int32` target calls
      that checked draft depth d + 1 (a call that stops its row checks no
      further); `histogram[:, d + 1:].sum(1)` of them covered it. None for
      plain beam search.
    tree_nodes: speculative beam search: draft nodes per beam's tree (a
      target call scores K * (1 + tree_nodes) tokens per row); None for
      plain beam search.
    iteration_seconds: gamma='auto': the measured seconds of a plain step
      and of a speculative call that the policy compared; else None.
    cost_cache: gamma='auto': where those seconds came from, `{'key',
      'path', 'measured'}` (`policy.cost_cache.cached_seconds`); else None.
  """

  tokens: np.ndarray
  scores: np.ndarray
  lengths: np.ndarray
  steps: np.ndarray
  calls: np.ndarray
  histogram: np.ndarray | None = None
  depth_tries: np.ndarray | None = None
  tree_nodes: int | None = None
  iteration_seconds: list[float] | None = None
  cost_cache: dict[str, Any] | None = None

  @property
  def steps_per_call(self) -> float:
    """Steps committed per target call over the batch (plain: 1)."""
    return float(self.steps.sum()) / max(int(self.calls.sum()), 1)


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

  def body(s: BeamLoopState) -> BeamLoopState:
    new, done, lm_state, _ = spec_beam.plain_step(
      model, s.model, s.beams, s.done, settings
    )
    return BeamLoopState(beams=new, done=done, model=lm_state)

  s = BeamLoopState(
    beams=beams, done=beam_rules.stopped(beams, alpha), model=state
  )
  s = lax.while_loop(lambda s: jnp.any(~s.done), body, s)
  tokens, scores, lengths = beam_rules.outputs(s.beams, settings.eos_id)
  return tokens, scores, lengths, s.beams.step


beam_decode_jit = jax.jit(beam_decode, static_argnames=('settings',))


def beam_search(
  model: LanguageModel,
  encoder_tokens: Any,
  *,
  num_beams: int = 4,
  alpha: float = 0.6,
  max_decode_len: int = 64,
  draft: Any = None,
  gamma: int | str = 4,
  eos_id: int = EOS_ID,
  draft_beams: int | None = None,
  draft_children: int | None = None,
  max_auto_gamma: int = AUTO_GAMMA,
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
    draft: None for plain beam search; a language model with the
      target's vocabulary for exact speculative beam search
      (`beam/speculative.py`): each live beam gets a token tree grown by the
      draft's own beam search from it (`beam/draft_trees.py`), the target
      scores every tree in one call, and plain beam search's steps are
      replayed on the target's log-probs while every new live beam is a
      node. The result is plain beam search's (up to floating-point
      near-ties). Both models must score token trees
      (`protocol.TreeLanguageModel`).
    gamma: draft tree depth, at most gamma + 1 steps per target call (an
      int >= 1; unused without a draft), or 'auto': each iteration is
      either one plain step or a speculative call with trees of depth
      `max_auto_gamma`, whichever is expected to take more steps per
      second, from the running steps per call and the two kinds' measured
      costs (`beam/policy.py`; measured once per shape and cached,
      `beam/costs.py`). Where speculation does not pay it decodes
      plainly, probing now and then; the beams are the same either way.
    eos_id: end-of-sequence id.
    draft_beams: W >= 1, nodes of each level of a beam's tree that get
      children (the draft's W best paths; None: `DRAFT_BEAMS`).
    draft_children: c >= 1, children of each such node (the draft's c best
      non-EOS next tokens; None: `DRAFT_CHILDREN`). A beam's tree has
      c + (gamma - 1) * W * c nodes (fewer where a level has fewer than W);
      W >= K and c >= K cover every step when the draft agrees with the
      target.
    max_auto_gamma: the tree depth of `gamma='auto'`'s speculative calls
      (an int >= 1).

  Sharded models (`partitioner=`) decode sharded, as in `generate`: the
  rows go on the `data` axis (padded with copies of the last row).

  Returns:
    `BeamSearchOutput`: tokens `[B, K, M]`, scores `[B, K]`, lengths
    `[B, K]` (best first), the steps and target calls each row took.

  Raises:
    ValueError: a bad argument (before anything compiles).
  """
  num_beams = inputs.check_int('num_beams', num_beams, 1)
  max_decode_len = inputs.check_int('max_decode_len', max_decode_len, 1)
  auto, layout = _layout(gamma, max_auto_gamma, draft_beams, draft_children)
  _check_alpha(alpha)
  if model.vocab_size < 2:
    raise ValueError(
      f'beam search needs a vocabulary of 2 ids or more, got {model.vocab_size}'
    )
  if draft is not None:
    _check_draft(model, draft, layout)
    draft = model_drafter.drafting_copy(draft, model)
  if placement.is_global(encoder_tokens):
    raise ValueError(
      'beam_search takes host arrays; a batch spanning hosts is not supported'
    )
  tokens = inputs.check_model_tokens(model, encoder_tokens)
  batch = tokens.shape[0]
  settings = BeamSettings(
    num_beams=num_beams,
    alpha=float(alpha),
    max_decode_len=max_decode_len,
    eos_id=int(eos_id),
  )
  lms = (model,) if draft is None else (model, draft)
  mesh = placement.placement_of(*lms)
  if mesh is not None:
    model = mesh.place(model)
    draft = None if draft is None else mesh.place(draft)
    keys = jax.random.split(jax.random.key(0), batch)
    enc, _ = placement.sharded_inputs(mesh, tokens, keys)
  else:
    enc = jnp.asarray(tokens)
  seconds = cost_cache = None
  if draft is None:
    out = beam_decode_jit(model, enc, settings=settings)
    out = out + (out[3], None, None)
  else:
    policy = None
    if auto:
      seconds, cost_cache = beam_costs.iteration_seconds(
        model, draft, enc, settings, layout
      )
      policy = beam_policy.BeamPolicyInputs.create(seconds)
    out = spec_beam.spec_beam_decode_jit(
      model,
      draft,
      enc,
      settings=settings,
      layout=layout,
      policy=policy,
    )
  out = [None if x is None else x[:batch] for x in placement.to_host(out)]
  tree_nodes = None if draft is None else layout.num_nodes
  return BeamSearchOutput(
    *out,
    tree_nodes=tree_nodes,
    iteration_seconds=seconds,
    cost_cache=cost_cache,
  )


def _layout(gamma, max_auto_gamma, draft_beams, draft_children):
  """Whether gamma is 'auto', and the draft trees' `TreeLayout`."""
  gamma = inputs.parse_gamma(gamma)
  auto = gamma == inputs.AUTO
  if auto:
    gamma = inputs.check_int('max_auto_gamma', max_auto_gamma, 1)
  layout = draft_trees.TreeLayout(
    gamma=int(gamma),
    width=inputs.check_int(
      'draft_beams', DRAFT_BEAMS if draft_beams is None else draft_beams, 1
    ),
    children=inputs.check_int(
      'draft_children',
      DRAFT_CHILDREN if draft_children is None else draft_children,
      1,
    ),
  )
  return auto, layout


def _check_alpha(alpha: Any) -> None:
  """ValueError unless `alpha` is a finite number >= 0."""
  if (
    isinstance(alpha, bool)
    or not isinstance(alpha, (int, float, np.integer, np.floating))
    or not np.isfinite(alpha)
    or alpha < 0
  ):
    # The stop rule bounds a live beam's best score with the penalty at
    # length M + 1, the largest only when alpha >= 0.
    raise ValueError(f'alpha must be a finite number >= 0, got {alpha!r}')


def _check_draft(model: Any, draft: Any, layout: Any) -> None:
  """Speculative beam search's requirements, before anything compiles."""
  for name in ('score_tree', 'commit_tree'):
    if not callable(getattr(model, name, None)):
      raise ValueError(
        'speculative beam search needs a target that scores token trees '
        f'(protocol.TreeLanguageModel); {type(model).__name__} has no {name}'
      )
  for name in ('init_state', 'score', 'score_tree', 'rollback', 'vocab_size'):
    if not hasattr(draft, name):
      raise ValueError(
        'beam_search(draft=...) takes a language model (a T5 Model, a '
        f'TableLM, ...); {type(draft).__name__} has no {name}'
      )
  inputs.check_pair(model, draft)
  if layout.children >= model.vocab_size:
    raise ValueError(
      f'draft_children must be below the vocabulary size '
      f'{model.vocab_size} (EOS is never a child), got {layout.children}'
    )
  if layout.num_nodes + 1 > tree_shape.MAX_NODES:
    raise ValueError(
      f'a draft tree of gamma={layout.gamma}, draft_beams={layout.width}, '
      f'draft_children={layout.children} has {layout.num_nodes} nodes; '
      f'at most {tree_shape.MAX_NODES - 1}'
    )

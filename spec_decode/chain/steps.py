"""One speculative iteration, and one plain step inside a speculative loop.

Both the fixed-gamma and the gamma='auto' loop are built from these. An
iteration at gamma g (Algorithm 1 once per row): the drafter proposes g
tokens, the target scores the newest input and the g proposals in ONE call,
`core.verified_block` accepts a prefix per row and draws the next token,
and `core.loop_state.SpecState.commit` appends and records them (the tree
loop ends its iterations the same way). Shapes: `B` rows, `G` the largest
gamma (the counters' width), `V` vocabulary.

Randomness: every row has its own key; the draws for output token `k` use
`fold_in(fold_in(row_key, k), purpose)` (`core.verified_block`), so a row's
tokens depend only on its seed, never on its batch mates, and a draft equal
to the target draws exactly the tokens plain sampling draws.
"""

import dataclasses

import jax.numpy as jnp

from spec_decode.chain import plain
from spec_decode.core import drafter
from spec_decode.core import loop_state
from spec_decode.core import provenance
from spec_decode.core import verified_block
from spec_decode.core.counters import SpecCounters


@dataclasses.dataclass(frozen=True)
class Iteration(loop_state.Loop):
  """What every iteration of one chain decode closes over
  (`core.loop_state.Loop`; `settings.width` is G, the largest gamma; an
  iteration drafts the g it is given, handing the drafter the settings with
  `gamma` = g)."""

  def init(
    self,
    with_gammas: bool = False,
    state_type: type[loop_state.SpecState] = loop_state.SpecState,
    **more,
  ) -> loop_state.SpecState:
    """The loop's first state (`with_gammas`: count gammas; `state_type`
    and its own fields `more`: gamma='auto''s `AutoState`)."""
    settings = self.settings
    counters = SpecCounters.zeros(
      self.encoder_tokens.shape[0], settings.width, with_gammas
    )
    # The window of the inputs one iteration can commit (G + 1).
    return self.first_state(state_type, counters, settings.width + 1, **more)

  def _score(self, tgt, tokens):
    """Target logits `[B, T, V]`, features `[B, T, D]` (or None), state."""
    if self.with_features:
      return self.target.score_with_features(tgt, tokens)
    logits, tgt = self.target.score(tgt, tokens)
    return logits, None, tgt

  def draft(self, state: loop_state.SpecState, g: int) -> loop_state.SpecState:
    """One iteration at gamma `g` (1 <= g <= G): Algorithm 1 per row."""
    settings = self.settings
    gmax = settings.width
    n = state.length
    # Under gamma='auto' the previous iteration may have drafted (and
    # accepted) up to G tokens, more than this one drafts.
    context = self.context(state, g, max_accepted=gmax if g < gmax else None)
    proposal, ds = self.proposer.propose(
      state.draft, context, dataclasses.replace(settings, gamma=g)
    )
    drafter.check_proposal(self.proposer, proposal, context, g, state.draft, ds)
    draft_tokens = proposal.tokens
    newest = loop_state.gather(state.inputs, n[:, None])
    tgt = self.target.rollback(state.target, n)
    logits, features, tgt = self._score(
      tgt, jnp.concatenate([newest, draft_tokens], axis=1)
    )
    result, _ = verified_block.verify_block(
      settings.verifier,
      settings.sampler,
      logits,
      proposal,
      self.row_keys,
      n[:, None] + 1 + jnp.arange(g + 1)[None],
    )
    a = result.accepted
    num = proposal.num
    if num is None:
      num = jnp.full(n.shape, g, jnp.int32)
    offsets = jnp.arange(g)[None]
    path = loop_state.VerifiedPath(
      tokens=draft_tokens,
      accepted=a,
      next_token=result.next_token,
      # Position i was tested when it was proposed and its prefix was
      # accepted (`SpecCounters.counted` keeps what the row output).
      tested=(offsets <= a[:, None]) & (offsets < num[:, None]),
      beta=result.beta,
      proposed=num,
      features=features,
    )
    new, _ = state.commit(
      settings,
      path,
      target=tgt,
      draft=ds,
      codes=lambda: provenance.chain_block(a, num, draft_tokens),
    )
    return new

  def plain(self, state: loop_state.SpecState) -> loop_state.SpecState:
    """Gamma 0: one target step (the draft is left as it is)."""
    new, features = plain.target_step(
      self.target, state, self.row_keys, self.settings, self.with_features
    )
    if features is not None:
      features = drafter.slide_features(
        state.features, features[:, None], new.length - state.length
      )
    c = state.counters
    record = state.provenance
    if record is not None:
      record = record.write(
        state.length,
        new.length - state.length,
        provenance.target_block(state.length.shape[0]),
      )
    return new.replace(
      counters=c.replace(iterations=c.iterations + (~state.done)),
      features=features,
      provenance=record,
    )

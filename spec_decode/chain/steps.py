"""One speculative iteration, and one plain step inside a speculative loop.

Both the fixed-gamma and the gamma='auto' loop are built from these. An
iteration at gamma g (Algorithm 1 once per row): the drafter proposes g
tokens, the target scores the newest input and the g proposals in ONE call,
`core.verified_block` accepts a prefix per row and draws the next token,
and `core.buffer.commit_block` appends them. Shapes: `B` rows, `G` the
largest gamma (the counters' width), `V` vocabulary.

Randomness: every row has its own key; the draws for output token `k` use
`fold_in(fold_in(row_key, k), purpose)` (`core.verified_block`), so a row's
tokens depend only on its seed, never on its batch mates, and a draft equal
to the target draws exactly the tokens plain sampling draws.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from spec_decode.chain import plain
from spec_decode.chain import state as state_lib
from spec_decode.core import buffer
from spec_decode.core import counters as counters_lib
from spec_decode.core import drafter
from spec_decode.core import model_drafter
from spec_decode.core import provenance
from spec_decode.core import sampling
from spec_decode.core import verified_block
from spec_decode.core.counters import SpecCounters
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.protocol import LanguageModel


@dataclasses.dataclass(frozen=True)
class Iteration:
  """What every iteration of one speculative decode closes over.

  Attributes:
    target: the target language model.
    proposer: the draft as a `core.drafter.Drafter`.
    encoder_tokens: `[B, S] int32`.
    row_keys: `[B]` PRNG keys.
    settings: the decode's static settings (`gamma` is G, the largest).
    with_features: the drafter reads the target's features (the target
      then scores with them; the state keeps them in a window,
      `core.drafter.feature_window`).
  """

  target: LanguageModel
  proposer: Any
  encoder_tokens: jax.Array
  row_keys: jax.Array
  settings: DecodeSettings
  with_features: bool

  @classmethod
  def create(
    cls,
    target: LanguageModel,
    draft: Any,
    encoder_tokens: jax.Array,
    row_keys: jax.Array,
    settings: DecodeSettings,
  ) -> 'Iteration':
    """`draft`: a drafter or any language model (G autoregressive steps)."""
    proposer = model_drafter.as_drafter(draft)
    return cls(
      target=target,
      proposer=proposer,
      encoder_tokens=encoder_tokens,
      row_keys=row_keys,
      settings=settings,
      with_features=bool(getattr(proposer, 'uses_target_features', False)),
    )

  def init(self, with_gammas: bool = False) -> state_lib.SpecState:
    """The fixed-gamma loop's first state (`with_gammas`: count gammas)."""
    enc, settings = self.encoder_tokens, self.settings
    batch = enc.shape[0]
    # The window of the inputs one iteration can commit (G + 1).
    features = drafter.feature_window(
      self.proposer, self.target, batch, settings.gamma + 1
    )
    start = state_lib.init_plain(self.target, enc, settings)
    return state_lib.SpecState(
      **state_lib.shared_fields(start),
      draft=self.proposer.init_draft(enc, settings.buffer_len),
      counters=SpecCounters.zeros(batch, settings.gamma, with_gammas),
      features=features,
      provenance=(
        provenance.Record.zeros(batch, settings.buffer_len)
        if settings.provenance
        else None
      ),
    )

  def _score(self, tgt, tokens):
    """Target logits `[B, T, V]`, features `[B, T, D]` (or None), state."""
    if self.with_features:
      return self.target.score_with_features(tgt, tokens)
    logits, tgt = self.target.score(tgt, tokens)
    return logits, None, tgt

  def draft(self, state: state_lib.SpecState, g: int) -> state_lib.SpecState:
    """One iteration at gamma `g` (1 <= g <= G): Algorithm 1 per row."""
    settings, row_keys = self.settings, self.row_keys
    gmax = settings.gamma
    batch = state.length.shape[0]
    n = state.length
    active = ~state.done
    positions = n[:, None] + 1 + jnp.arange(g + 1)[None]
    context = drafter.DraftContext(
      inputs=state.inputs,
      length=n,
      encoder_tokens=self.encoder_tokens,
      keys=sampling.position_keys(
        row_keys, positions[:, :g], verified_block.SAMPLE
      ),
      **drafter.context_reads(self.proposer, state.features, state.target),
      # Under gamma='auto' the previous iteration may have drafted (and
      # accepted) up to G tokens, more than this one drafts.
      max_accepted=gmax if g < gmax else None,
    )
    proposal, ds = self.proposer.propose(
      state.draft, context, dataclasses.replace(settings, gamma=g)
    )
    drafter.check_proposal(self.proposer, proposal, context, g, state.draft, ds)
    draft_tokens = proposal.tokens
    newest = buffer.gather(state.inputs, n[:, None])
    tgt = self.target.rollback(state.target, n)
    logits, features, tgt = self._score(
      tgt, jnp.concatenate([newest, draft_tokens], axis=1)
    )
    result, _ = verified_block.verify_block(
      settings.verifier, settings.sampler, logits, proposal, row_keys, positions
    )
    a = result.accepted
    offsets = jnp.arange(g + 1)[None]
    block = jnp.where(
      offsets < a[:, None],
      jnp.concatenate([draft_tokens, jnp.zeros_like(newest)], axis=1),
      result.next_token[:, None],
    )
    inputs, length, done, kept = buffer.commit_block(
      state, block, a + 1, settings
    )
    num = proposal.num
    if num is None:
      num = jnp.full((batch,), g, jnp.int32)
    record = state.provenance
    if record is not None:
      codes, rejected = provenance.chain_block(a, num, draft_tokens)
      record = record.write(state.length, kept, codes, rejected)

    c = state.counters
    # Position i (0-based) was tested when it was proposed, its prefix was
    # accepted and it lies inside what the row kept (nothing after EOS or
    # past M counts: `core.counters`' convention, which the histogram and
    # the provenance follow too).
    tested = (offsets[:, :g] <= a[:, None]) & (offsets[:, :g] < kept[:, None])
    tested &= active[:, None] & (offsets[:, :g] < num[:, None])
    accepted = tested & (offsets[:, :g] < a[:, None])
    act = active.astype(jnp.int32)
    out_a = counters_lib.output_accepted(a, kept)

    def pad(x):  # [B, g] -> [B, G]
      return jnp.pad(x, ((0, 0), (0, gmax - g)))

    counters = c.replace(
      iterations=c.iterations + act,
      accepted_histogram=c.accepted_histogram
      + jax.nn.one_hot(out_a, gmax + 1, dtype=jnp.int32) * act[:, None],
      position_tries=c.position_tries + pad(tested),
      position_accepts=c.position_accepts + pad(accepted),
      beta_sum=c.beta_sum
      + jnp.sum(jnp.where(tested, result.beta, 0.0), axis=1),
      proposed=c.proposed + num * act,
    )
    if self.with_features:
      # The hidden state after input t predicted output token t + 1: the
      # window moves on by the inputs this iteration committed.
      features = drafter.slide_features(
        state.features, features, length - state.length
      )
    return state.replace(
      inputs=inputs,
      length=length,
      done=done,
      step=state.step + 1,
      target=tgt,
      draft=ds,
      counters=counters,
      features=features,
      provenance=record,
    )

  def plain(self, state: state_lib.SpecState) -> state_lib.SpecState:
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

"""Fixed-gamma speculative decoding: G draft tokens, one target call, a loop.

Every iteration runs `steps.Iteration.draft` at gamma G inside one jitted
`lax.while_loop`, until every row has emitted EOS or M tokens.
"""

from typing import Any

import jax
from jax import lax

from spec_decode.chain import steps
from spec_decode.core import loop_state
from spec_decode.core.counters import SpecCounters
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.protocol import LanguageModel
from spec_decode.core.provenance import Record


def fixed_decode(
  target: LanguageModel,
  draft: Any,
  encoder_tokens: jax.Array,
  row_keys: jax.Array,
  settings: DecodeSettings,
) -> tuple[jax.Array, jax.Array, SpecCounters, Record | None]:
  """Algorithm 1 in a loop at gamma `settings.gamma` (sized by
  `settings.width`, which is gamma when `generate` builds the settings).

  Args:
    target: the target language model.
    draft: a drafter (`core.drafter.Drafter`) or any language model.
    encoder_tokens: `[B, S] int32`.
    row_keys: `[B]` PRNG keys.
    settings: static settings.

  Returns:
    tokens `[B, M]`, lengths `[B]`, `SpecCounters`, and the
    `core.provenance.Record` (None with `settings.provenance` off).
  """
  it = steps.Iteration.create(target, draft, encoder_tokens, row_keys, settings)
  state = lax.while_loop(
    lambda s: loop_state.not_finished(s, settings),
    lambda s: it.draft(s, settings.gamma),
    it.init(),
  )
  tokens, lengths = loop_state.outputs(state, settings)
  return tokens, lengths, state.counters, state.provenance

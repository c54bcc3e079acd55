"""The chain loops' compiled entry points.

`plain_decode_jit` runs `plain.plain_decode`; `speculative_decode_jit` runs
the fixed-gamma loop (`fixed.fixed_decode`) or, with
`settings.gamma_policy`, the gamma='auto' loop (`auto.auto_decode`). Each is
one jitted function with the settings static: `generate` and the cost
measurement (`auto_costs`) share their compiled programs.
"""

from typing import Any

import jax

from spec_decode.chain import auto
from spec_decode.chain import fixed
from spec_decode.chain import plain
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.protocol import LanguageModel
from spec_decode.policy import finish_time


def speculative_decode(
  target: LanguageModel,
  draft: Any,
  encoder_tokens: jax.Array,
  row_keys: jax.Array,
  settings: DecodeSettings,
  policy: finish_time.PolicyInputs | None = None,
):
  """The fixed-gamma loop, or the gamma='auto' loop (`gamma_policy` set).

  Returns:
    tokens `[B, M]`, lengths `[B]`, `core.counters.SpecCounters` and the
    `core.provenance.Record` (None with `settings.provenance` off).
  """
  if settings.gamma_policy:
    return auto.auto_decode(
      target, draft, encoder_tokens, row_keys, settings, policy
    )
  return fixed.fixed_decode(target, draft, encoder_tokens, row_keys, settings)


plain_decode_jit = jax.jit(plain.plain_decode, static_argnames=('settings',))
speculative_decode_jit = jax.jit(
  speculative_decode, static_argnames=('settings',)
)

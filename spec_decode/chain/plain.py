"""Plain decoding: one target step per token, a jitted `lax.while_loop`.

T5X's `temperature_sample` in our loop shape: the token for output position
k is drawn with the key `core.sampling.position_keys(row_key, k, SAMPLE)`,
the key speculative decoding uses for its bonus and residual draws there,
so a draft equal to the target reproduces these tokens exactly.
"""

import jax
import jax.numpy as jnp
from jax import lax

from spec_decode.core import loop_state
from spec_decode.core import sampling
from spec_decode.core import verified_block
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.protocol import LanguageModel


def target_step(
  target: LanguageModel,
  state: loop_state.PlainState,
  row_keys: jax.Array,
  settings: DecodeSettings,
  with_features: bool = False,
):
  """One target call per row at its own position, one token drawn.

  Returns:
    the state one token on (any `PlainState` subclass keeps its other
    fields) and the target's features `[B, D]` of that call (None unless
    `with_features`).
  """
  n = state.length
  newest = loop_state.gather(state.inputs, n[:, None])
  tgt = target.rollback(state.target, n)
  features = None
  if with_features:
    logits, features, tgt = target.score_with_features(tgt, newest)
    features = features[:, 0]
  else:
    logits, tgt = target.score(tgt, newest)
  keys = sampling.position_keys(
    row_keys, (n + 1)[:, None], verified_block.SAMPLE
  )[:, 0]
  token, _ = sampling.draw_tokens(settings.sampler, keys, logits[:, 0])
  inputs, length, done, _ = loop_state.commit_block(
    state, token[:, None], jnp.ones_like(n), settings
  )
  new = state.replace(
    inputs=inputs, length=length, done=done, step=state.step + 1, target=tgt
  )
  return new, features


def plain_decode(
  target: LanguageModel,
  encoder_tokens: jax.Array,
  row_keys: jax.Array,
  settings: DecodeSettings,
):
  """Autoregressive sampling from the target alone.

  Args:
    target: the language model.
    encoder_tokens: `[B, S] int32`.
    row_keys: `[B]` PRNG keys.
    settings: static settings (gamma is ignored).

  Returns:
    tokens `[B, M]` (pad after EOS) and lengths `[B]`.
  """
  state = loop_state.init_plain(target, encoder_tokens, settings)
  state = lax.while_loop(
    lambda s: loop_state.not_finished(s, settings),
    lambda s: target_step(target, s, row_keys, settings)[0],
    state,
  )
  return loop_state.outputs(state, settings)

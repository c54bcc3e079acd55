"""The real sizes' programs built abstractly, so a shape bug shows on a CPU.

The rehearsal (`--tiny`) runs every item at toy widths; a bug that only the
real widths trigger (a head count that does not divide, a vocabulary the
controlled drafts index past) would wait for the GPU. `build` traces, with
`jax.eval_shape` (no memory, no arithmetic), each size's init and the
programs the bench compiles for it: the v(k) and tree scoring loops, plain
and speculative decoding, at the real widths and a toy depth
(`plan.toy_depth`); a T5Gemma pair's configs build `T5GemmaModel`s
(`weights.model_class`).
"""

from typing import Any

import jax
import jax.numpy as jnp

from spec_decode.bench import controlled
from spec_decode.bench.accel import weights
from spec_decode.chain import loops
from spec_decode.core import inputs
from spec_decode.core import tree_shape
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.policy import timing


def build(
  target_config, draft_config, gamma: int, max_decode_len: int = 8
) -> dict[str, Any]:
  """Output shapes of every program of one size (see the module doc)."""

  target_cls = weights.model_class(target_config)
  draft_cls = weights.model_class(draft_config)

  def params(config):
    cls = weights.model_class(config)
    return jax.eval_shape(lambda: cls.init(config, seed=0).params)

  tp, dp = params(target_config), params(draft_config)
  enc = jnp.full((1, 24), 5, jnp.int32)
  keys = inputs.row_keys(0, 1)
  settings = DecodeSettings(max_decode_len=max_decode_len, gamma=gamma)
  plain_settings = DecodeSettings(max_decode_len=max_decode_len, gamma=1)
  shape = tree_shape.from_branching((2, 1))
  out: dict[str, Any] = {'params': tp}

  def models(t, d):
    return target_cls(target_config, t), draft_cls(draft_config, d)

  def steps(t):
    target = target_cls(target_config, t)
    state = timing.primed_state(target, 1, 16, 16 + gamma + 4)
    chain = timing.repeated_score(target, state, gamma + 1, 2)
    tree = timing.repeated_score(
      target, state, shape.num_nodes + 1, 2, shape.target_attention()
    )
    return chain, tree

  def decodes(t, d):
    target, draft = models(t, d)
    plain = loops.plain_decode_jit(target, enc, keys, settings=plain_settings)
    reference = plain[0]
    cdraft = controlled.ControlledDraft(
      inner=draft,
      reference=reference,
      alpha=jnp.float32(0.75),
      key=jax.random.key(0),
    )
    spec = loops.speculative_decode_jit(
      target, cdraft, enc, keys, settings=settings
    )
    return plain, spec

  out['steps'] = jax.eval_shape(steps, tp)
  out['decodes'] = jax.eval_shape(decodes, tp, dp)
  return out

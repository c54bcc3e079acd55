"""Section 7 of `spec-decode bench --kernel`: the small-K kernel on vs off.

Sections 1-3 (plain decoding efficiency, v(k) and c, controlled acceptance;
`speed.decode_sections`) once per kernel setting ('on': packed weights and
the small-K CPU kernel of `spec_decode.kernels`, 'off': `jnp.dot`), on the
same models, inputs and reference in one process. `report.kernel_markdown`
renders them; `spec-decode bench kernel` is the kernel's own micro
benchmark (`bench.kernel`).
"""

from typing import Any

import spec_decode as sd
from spec_decode.bench import peer
from spec_decode.bench import speed
from spec_decode.kernels import ops as kernel_ops


def _kernel_setting(model: sd.Model, on: bool) -> sd.Model:
  if not on:
    return model.unpacked()
  return model if model.packed is not None else model.pack_for_cpu()


def kernel_sections(
  cfg: speed.BenchConfig, settings: tuple[str, ...]
) -> dict[str, Any]:
  """Sections 1-3 (plain efficiency, v(k), controlled acceptance) per kernel
  setting ('on': packed weights and the small-K kernel, 'off': jnp.dot), on
  the same models, inputs and reference in one process."""
  base = peer.suppress_eos(sd.Model.init(cfg.target, seed=0))
  draft_base = sd.Model.init(cfg.draft, seed=1)
  enc1 = speed.inputs(1)
  bandwidth = speed.copy_bandwidth(cfg.copy_mb, cfg.repeats)
  step_bytes = speed.decoder_step_bytes(base)
  out: dict[str, Any] = {
    'info': kernel_ops.info(),
    'copy_bandwidth_gb_s': bandwidth / 1e9,
    'decoder_weight_bytes_per_step': step_bytes,
  }
  reference = None
  for name in settings:
    on = name == 'on'
    if on and not kernel_ops.available():
      out[name] = {'skipped': 'kernel unavailable'}
      continue
    out[name], reference = speed.decode_sections(
      cfg,
      _kernel_setting(base, on),
      _kernel_setting(draft_base, on),
      enc1,
      bandwidth,
      step_bytes,
      reference,
    )
  return out

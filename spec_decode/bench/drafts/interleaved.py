"""Wall time of decoding configurations, interleaved, fastest round each.

Shared by the hierarchical and tree benches: every configuration compiles
first (untimed); then `repeats` rounds decode every example under every
configuration, interleaved (a load spike on a shared machine hits all
configurations alike), and each example counts with its fastest round.
"""

import time
from typing import Any

import numpy as np

import spec_decode as sd


def fastest_runs(
  target: Any,
  enc: np.ndarray,
  configs: list[dict[str, Any]],
  repeats: int,
) -> tuple[list[list[Any]], np.ndarray]:
  """Outputs and summed fastest seconds of `sd.generate` per configuration.

  Args:
    target: the target model.
    enc: `[N, S]` examples, decoded one row at a time (batch 1).
    configs: `sd.generate` keyword arguments, one dict per configuration.
    repeats: timed rounds.

  Returns:
    Per configuration the outputs (one per example, from the last round),
    and `[len(configs)]` seconds: per example the fastest round, summed.
  """
  for kw in configs:
    sd.generate(target, enc[:1], **kw)  # Compile.
  best = np.full((len(configs), len(enc)), np.inf)
  outs = [[None] * len(enc) for _ in configs]
  for _ in range(repeats):
    for i in range(len(enc)):
      for c, kw in enumerate(configs):
        t0 = time.perf_counter()
        out = sd.generate(target, enc[i : i + 1], **kw)
        best[c, i] = min(best[c, i], time.perf_counter() - t0)
        outs[c][i] = out
  return outs, best.sum(1)

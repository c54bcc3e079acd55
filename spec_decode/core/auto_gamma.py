"""Auto-gamma for `generate(..., gamma='auto')`: calibrate, then choose.

`generate` runs a calibration decode of the batch at `CALIBRATION_GAMMA`
and passes the alpha it measured (the mean of beta over tested positions);
this module never decodes. c and v(k) are timed (`costs.measure`,
cached per target, draft and batch size: they do not depend on the inputs);
`theory.choose_gamma` maximizes the generalized Theorem 3.8 over them.
"""

from typing import Any

import numpy as np

from spec_decode import theory
from spec_decode.core import costs
from spec_decode.core import sampling
from spec_decode.core.decode_settings import DecodeSettings

CALIBRATION_GAMMA = 4
MAX_GAMMA = 8
_REPEATS = 5
_cost_cache: dict[tuple[int, int, int], dict[str, Any]] = {}


def choose(
  target: Any,
  draft: Any,
  alpha: float,
  batch: int,
  sampler: sampling.Sampler,
  *,
  max_gamma: int = MAX_GAMMA,
) -> dict[str, Any]:
  """Times c and v(k) (cached) and picks gamma for a measured `alpha`.

  Args:
    target: the target language model.
    draft: the draft (language model or drafter).
    alpha: the acceptance rate measured by a calibration decode.
    batch: rows per decode (the timings depend on it).
    sampler: the decode's logits -> distribution map.
    max_gamma: the largest gamma considered.

  Returns:
    `{'gamma', 'alpha', 'c', 'v_of_k', 'predicted_improvement',
    'calibration_gamma'}`.
  """
  alpha = float(np.clip(alpha, 0.0, 1.0))
  key = (id(target), id(draft), batch)
  if key not in _cost_cache:
    settings = DecodeSettings(
      max_decode_len=1, sampler=sampler, gamma=CALIBRATION_GAMMA
    )
    _cost_cache[key] = costs.measure(
      target, draft, range(1, max_gamma + 2), batch, _REPEATS, settings
    )
  measured = _cost_cache[key]
  choice = theory.choose_gamma(
    alpha, measured['c'], measured['v_of_k'], max_gamma=max_gamma
  )
  return {
    'gamma': int(choice.gamma),
    'alpha': alpha,
    'c': float(measured['c']),
    'v_of_k': {int(k): float(v) for k, v in measured['v_of_k'].items()},
    'predicted_improvement': float(choice.improvement),
    'calibration_gamma': CALIBRATION_GAMMA,
  }

"""Auto-gamma for `generate(..., gamma='auto')`: calibrate, then choose.

A calibration decode of the batch at `CALIBRATION_GAMMA` measures alpha (the
mean of beta over tested positions); c and v(k) are timed (`costs.measure`,
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
  encoder_tokens: np.ndarray,
  *,
  max_gamma: int = MAX_GAMMA,
  **generate_kwargs,
) -> dict[str, Any]:
  """Measures alpha on `encoder_tokens`, times c and v(k), picks gamma.

  Returns:
    `{'gamma', 'alpha', 'c', 'v_of_k', 'predicted_improvement',
    'calibration_gamma'}`.
  """
  from spec_decode.core import generation  # pylint: disable=g-import-not-at-top

  out = generation.generate(
    target,
    encoder_tokens,
    draft=draft,
    gamma=CALIBRATION_GAMMA,
    **generate_kwargs,
  )
  alpha = float(np.clip(out.stats.alpha, 0.0, 1.0))
  batch = int(np.shape(encoder_tokens)[0])
  key = (id(target), id(draft), batch)
  if key not in _cost_cache:
    settings = DecodeSettings(
      max_decode_len=1,
      sampler=sampling.Sampler(
        float(generate_kwargs.get('temperature', 0.0)),
        generate_kwargs.get('top_k', 0),
        generate_kwargs.get('top_p', 1.0),
      ),
      gamma=CALIBRATION_GAMMA,
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

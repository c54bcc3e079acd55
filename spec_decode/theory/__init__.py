"""The paper's section 3 as vectorized functions (`from spec_decode import
theory`); `spec-decode theory` (`theory/cli.py`) prints its tables.

Numpy only: this package sits at the bottom of the layering, so the engine's
gamma policy and the reports both use it.

  analysis.py  the closed forms: expected tokens, speedup, optimal gamma...
  cli.py       `spec-decode theory`: Table 1, optimal-gamma tables, figures
"""

from spec_decode.theory.analysis import GammaChoice
from spec_decode.theory.analysis import VCost
from spec_decode.theory.analysis import alpha
from spec_decode.theory.analysis import beta
from spec_decode.theory.analysis import choose_gamma
from spec_decode.theory.analysis import expected_tokens
from spec_decode.theory.analysis import lenient_alpha
from spec_decode.theory.analysis import ops_increase
from spec_decode.theory.analysis import optimal_gamma
from spec_decode.theory.analysis import oracle_bound
from spec_decode.theory.analysis import walltime_improvement

__all__ = [
  'GammaChoice',
  'VCost',
  'alpha',
  'beta',
  'choose_gamma',
  'expected_tokens',
  'lenient_alpha',
  'ops_increase',
  'optimal_gamma',
  'oracle_bound',
  'walltime_improvement',
]

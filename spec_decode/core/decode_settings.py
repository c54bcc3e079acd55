"""The static settings of a decode (part of every jit cache key)."""

import dataclasses

from spec_decode.core import inputs
from spec_decode.core import rejection
from spec_decode.core import sampling
from spec_decode.core.ids import EOS_ID

# The width (and gamma) of settings that name neither.
DEFAULT_GAMMA = 4


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """Static settings of a decode (hashable: part of the jit cache key).

  Two numbers of draft tokens, because a loop may draft fewer than it
  has room for:
    * `width` W sizes what the loop allocates: the most draft tokens any
      iteration of this decode verifies (the fixed gamma; the largest
      gamma under `gamma_policy`; a tree's depth; 1 for plain decoding).
      The token buffer (`buffer_len` = M + W + 2), the counters' per-position
      arrays and gamma histogram (`core.counters.SpecCounters`) and the
      feature window (W + 1 inputs) are W wide.
    * `gamma` is what the current call drafts, 1 <= gamma <= W: what a
      drafter's `propose` reads as the tokens to propose now. The loops
      hand drafters these settings with `gamma` set to the iteration's
      (`dataclasses.replace(settings, gamma=g)`; g < W only under
      `gamma_policy`); the fixed-gamma loop drafts `gamma` every iteration.
  Either defaults to the other (both to `DEFAULT_GAMMA` when neither is
  given), so `DecodeSettings(max_decode_len=M, gamma=3)` is a fixed-gamma
  decode 3 wide.

  Attributes:
    max_decode_len: M, output tokens per row at most (EOS included).
    sampler: logits -> distribution, shared by draft and target.
    gamma: the draft tokens the current call proposes (above).
    verifier: Algorithm 1 or a variant with the same signature.
    eos_id: end-of-sequence id.
    dynamic_gamma: 0 (off) or tau in (0, 1): a model draft stops proposing
      where its confidence drops below tau (`core.model_drafter`).
    gamma_policy: gamma='auto': every iteration picks its gamma in
      {0, ..., W} at run time (`policy.finish_time`).
    provenance: speculative loops record where each output token came
      from (`core.provenance`); False only to measure what it costs.
    width: W, the loop's sizes (above).

  Raises:
    ValueError: `width` or `gamma` is not an int >= 1, or gamma > width.
  """

  max_decode_len: int
  sampler: sampling.Sampler = sampling.Sampler()
  gamma: int | None = None
  verifier: rejection.Verifier = rejection.ExactVerifier()
  eos_id: int = EOS_ID
  dynamic_gamma: float = 0.0
  gamma_policy: bool = False
  provenance: bool = True
  width: int | None = None

  def __post_init__(self):
    # Each checked as given, before it stands in for the other.
    width, gamma = (
      None if v is None else inputs.check_int(f'DecodeSettings.{name}', v, 1)
      for name, v in (('width', self.width), ('gamma', self.gamma))
    )
    if width is None:
      width = DEFAULT_GAMMA if gamma is None else gamma
    if gamma is None:
      gamma = width
    if gamma > width:
      raise ValueError(
        f'DecodeSettings.gamma ({gamma}) exceeds its width ({width}): an '
        'iteration drafts at most width tokens (the loop is sized by width)'
      )
    # Frozen: set once here, as the dataclass's own __init__ would.
    object.__setattr__(self, 'width', width)
    object.__setattr__(self, 'gamma', gamma)

  @property
  def buffer_len(self) -> int:
    """The token buffer's length, M + W + 2 (`core.loop_state`)."""
    return self.max_decode_len + self.width + 2

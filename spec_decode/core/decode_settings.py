"""The static settings of a decode (part of every jit cache key)."""

import dataclasses

from spec_decode.core import rejection
from spec_decode.core import sampling
from spec_decode.core.ids import EOS_ID


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """Static settings of a decode (hashable: part of the jit cache key).

  Attributes:
    max_decode_len: M, output tokens per row at most (EOS included).
    sampler: logits -> distribution, shared by draft and target.
    gamma: G, draft tokens per iteration (speculative only); with
      `gamma_policy`, the largest gamma the policy may pick.
    verifier: Algorithm 1 or a variant with the same signature.
    eos_id: end-of-sequence id.
    dynamic_gamma: 0 (off) or tau in (0, 1): a model draft stops proposing
      where its confidence drops below tau (`core.model_drafter`).
    gamma_policy: gamma='auto': every iteration picks its gamma in
      {0, ..., G} at run time (`policy.finish_time`).
    provenance: speculative loops record where each output token came
      from (`core.provenance`); False only to measure what it costs.
  """

  max_decode_len: int
  sampler: sampling.Sampler = sampling.Sampler()
  gamma: int = 4
  verifier: rejection.Verifier = rejection.ExactVerifier()
  eos_id: int = EOS_ID
  dynamic_gamma: float = 0.0
  gamma_policy: bool = False
  provenance: bool = True

  @property
  def buffer_len(self) -> int:
    return self.max_decode_len + self.gamma + 2

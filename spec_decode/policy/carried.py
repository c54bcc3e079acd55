"""gamma='auto''s acceptance estimate carried from one decode to the next.

The in-loop policy (`finish_time`) starts every decode from an optimistic
prior (PRIOR_WEIGHT positions at PRIOR_ALPHA), so a decode of a few
iterations spends most of them learning what the previous decode of the
same pair already knew: measured on the quick bench grid, 0.82x the best
fixed gamma at batch 1, alpha 0.95 (gamma 8 best; the policy climbs from
the prior's gamma) and 0.93x plain at alpha 0.5 (probes and the loop's
gamma-0 overhead where no gamma pays). A caller that decodes many batches
(the eval run, the infer job, any loop over `generate`) passes the
`AcceptanceEstimate` each decode returns (`GenerateOutput.gamma_choice
['acceptance']`) to the next (`generate(..., acceptance=...)`):

- the next decode's policy starts from it instead of the prior (its alpha
  and its weight in tested positions, `PolicyInputs.prior_alpha /
  prior_weight`), so its first iteration already runs the gamma the pair
  needs;
- where even alpha one standard error above it (`finish_time.
  UNCERTAINTY_Z`) predicts that plain decoding's program ends the batch
  sooner than the policy loop at any gamma >= 1 (`plain_wins`), the
  decode runs plain decoding's program outright: no loop overhead, no
  probes.

Forgetting: the estimate weighs at most CARRIED_WEIGHT positions (older
decodes' share shrinks as new ones come in, so a pair whose acceptance
drifts is followed), and each decode run plain outright (which tests
nothing) halves its weight (PLAIN_DECAY): its standard error grows until
the optimistic bound says a draft might pay again, and the next decode runs
the policy loop, whose own probes measure the pair afresh. Without that a
single poor estimate would rule out speculation for the rest of the run.

Exactness: the estimate a decode starts from is a function of earlier,
finished decodes' counters only; it is fixed before the decode draws
anything, exactly as the costs are, so the decode is the policy loop (or
plain decoding) with a start fixed in advance, whose tokens follow the
target's distribution (`finish_time`'s argument). That needs the earlier
decodes' draws independent of this decode's: their row keys must differ
(a repeated key would let the schedule depend on this decode's own
uniforms). `check_keys` refuses a sampled decode that reuses a row key an
estimate was measured with; greedy decodes never draw, so any keys do.
See docs/guarantees.md.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.policy import finish_time

# The most tested positions the carried estimate counts as (older decodes'
# share shrinks beyond it).
CARRIED_WEIGHT = 64.0
# A decode run plain outright multiplies the estimate's weight by this.
PLAIN_DECAY = 0.5
# Compiled once per batch size: the host-side check before every decode
# costs microseconds, not a few milliseconds of eager dispatches.
_finish_seconds = jax.jit(finish_time.finish_seconds)


@dataclasses.dataclass(frozen=True)
class AcceptanceEstimate:
  """An acceptance estimate carried between gamma='auto' decodes.

  Attributes:
    alpha: the estimated acceptance rate (mean beta over tested positions).
    weight: how many tested positions it counts as (the policy's prior
      weight; at most CARRIED_WEIGHT).
    decodes: decodes it has seen (policy loops and plain ones).
    keys: the row keys of the sampled decodes it was measured with (key
      data bytes), which a sampled decode may not reuse (`check_keys`).
  """

  alpha: float = finish_time.PRIOR_ALPHA
  weight: float = finish_time.PRIOR_WEIGHT
  decodes: int = 0
  keys: frozenset = frozenset()

  def __post_init__(self):
    if not 0.0 <= self.alpha <= 1.0 or not self.weight > 0.0:
      raise ValueError(
        'an AcceptanceEstimate needs alpha in [0, 1] and weight > 0, got '
        f'alpha={self.alpha!r}, weight={self.weight!r}'
      )

  def upper(self) -> float:
    """alpha one standard error (`finish_time.UNCERTAINTY_Z`) higher."""
    se = np.sqrt(self.alpha * (1.0 - self.alpha) / self.weight)
    return float(min(self.alpha + finish_time.UNCERTAINTY_Z * se, 1.0))

  def plain_wins(
    self,
    seconds,
    batch: int,
    max_decode_len: int,
    margin: float = finish_time.LOOP_MARGIN,
  ) -> bool:
    """Whether plain decoding's program beats the policy loop here.

    At `upper()`, with every row active and `max_decode_len` tokens left:
    the predicted finish of the loop at its best gamma >= 1 is no sooner
    than gamma 0's less the loop's own overhead over plain decoding
    (`margin`, `finish_time.LOOP_MARGIN`). False when gamma 0 is not a
    candidate (`inf`).
    """
    seconds = np.asarray(seconds, np.float64)
    if not np.isfinite(seconds[0]):
      return False
    finish = np.asarray(
      _finish_seconds(
        jnp.float32(self.upper()),
        jnp.ones((batch,), bool),
        jnp.full((batch,), max_decode_len, jnp.int32),
        jnp.asarray(seconds, jnp.float32),
      ),
      np.float64,
    )
    return bool(np.min(finish[1:]) * (1.0 + margin) >= finish[0])

  def after(self, beta_sum: float, tested: float, keys=None):
    """The estimate after a policy-loop decode that tested `tested`
    positions with `beta_sum` their summed beta (`keys`: its row keys if
    it sampled)."""
    total = self.weight + float(tested)
    alpha = (self.alpha * self.weight + float(beta_sum)) / total
    return AcceptanceEstimate(
      alpha=float(np.clip(alpha, 0.0, 1.0)),
      weight=min(total, CARRIED_WEIGHT),
      decodes=self.decodes + 1,
      keys=self._with(keys),
    )

  def after_plain(self, keys=None, decay: float = PLAIN_DECAY):
    """The estimate after a decode run plain outright (nothing tested):
    its weight times `decay`."""
    return dataclasses.replace(
      self,
      weight=self.weight * decay,
      decodes=self.decodes + 1,
      keys=self._with(keys),
    )

  def check_keys(self, keys) -> None:
    """Raises if a sampled decode's row keys `[B]` were used by a decode
    this estimate was measured with (the schedule could then depend on the
    decode's own draws)."""
    if self.keys and not self.keys.isdisjoint(key_bytes(keys)):
      raise ValueError(
        'acceptance= was measured with decodes that used some of these '
        'row keys: a sampled decode must use seeds of its own (e.g. a '
        'different seed per batch, or per-row seeds such as seed + '
        'example index), else its gamma schedule could depend on its own '
        'draws'
      )

  def to_json(self) -> dict:
    """alpha, weight and decodes (not the keys) for a run's state file."""
    return {'alpha': self.alpha, 'weight': self.weight, 'decodes': self.decodes}

  @classmethod
  def from_json(cls, d: dict) -> 'AcceptanceEstimate':
    """`to_json`'s estimate (without keys: a resumed run's new rows have
    seeds of their own)."""
    return cls(
      alpha=float(d['alpha']),
      weight=float(d['weight']),
      decodes=int(d['decodes']),
    )

  def _with(self, keys) -> frozenset:
    return self.keys if keys is None else self.keys | key_bytes(keys)


def key_bytes(keys) -> frozenset:
  """The row keys `[B]` as a set of their key data's bytes."""
  data = np.asarray(jax.random.key_data(keys))
  return frozenset(row.tobytes() for row in data.reshape(data.shape[0], -1))


def check(acceptance) -> AcceptanceEstimate | None:
  """`acceptance` as `generate` takes it: None or an AcceptanceEstimate."""
  if acceptance is None or isinstance(acceptance, AcceptanceEstimate):
    return acceptance
  raise ValueError(
    'acceptance must be None or the AcceptanceEstimate of an earlier '
    "decode (GenerateOutput.gamma_choice['acceptance']), got "
    f'{type(acceptance).__name__}'
  )

"""Each batch's timed work in rotating rounds, and the costs timed apart.

A machine's speed drifts (other processes, frequency, caches): a batch
timed once per decode, always in the same order, puts that drift into the
speedup. `run_rounds` times every decode of a batch (plain, speculative at
each γ, the draft alone) and every cost probe once per round, rotating the
order by one place each round, so that each runs in each place as often as
the rounds allow; the report takes, per round, the ratio of the whole run's
plain and speculative seconds, and gives their median and spread.

`Probes` are the costs the prediction uses, timed on their own in the same
process and rounds as the decodes: a target call on 1 and on k tokens
(v(k) = their ratio) and a draft step (c = draft step / target step), at
the batch's encoder tokens, its decode buffer and its rows' mean decode
position (half its plain outputs' mean length). Nothing of the speculative
loop's own seconds goes into them, so a prediction from them can miss the
measurement: by the loop's own overhead (verify, commit, rollback, the
while loop's control) and host syncs.
"""

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.core import decode_settings as settings_lib
from spec_decode.core import drafter as drafter_lib
from spec_decode.policy import timing

# Score calls per probe measurement: one compiled loop of this many calls
# (dispatch is paid once per loop, as in the decoding loops).
PROBE_CALLS = 8
# Prefix of the names of `Probes.runs`: `run_rounds` times them like the
# decodes, and their "output" is None.
PROBE = 'probe '
TARGET_STEP = 'target k=1'
DRAFT_STEP = 'draft step'


def target_k(k: int) -> str:
  """The probe name of a target call on k tokens."""
  return f'target k={k}'


def run_rounds(
  runs: dict[str, Callable[[], tuple[Any, float]]], rounds: int
) -> tuple[dict[str, Any], dict[str, list[float]]]:
  """Calls every `runs[name]()` once per round, in rotating order.

  Round r starts at the r-th name (mod the number of runs) and wraps, so
  round 0 runs them in the given order (callers put first what the others
  need: the plain decode gives the probes their position).

  Args:
    runs: name -> a call returning (its output, its seconds).
    rounds: how many rounds (>= 1).

  Returns:
    The first round's output of each run, and each run's seconds per round
    (`[rounds]`).
  """
  names = list(runs)
  outputs: dict[str, Any] = {}
  seconds: dict[str, list[float]] = {name: [] for name in names}
  for r in range(rounds):
    shift = r % len(names)
    for name in names[shift:] + names[:shift]:
      out, secs = runs[name]()
      outputs.setdefault(name, out)
      seconds[name].append(secs)
  return outputs, seconds


class Probes:
  """The cost probes of one batch (see the module docstring).

  `runs(position_of)` gives `run_rounds` one call per probe; each compiles
  untimed on its first call and builds its decode state then, at the
  position `position_of()` returns (the plain decode of round 0 has run by
  then). `record(seconds)` is what each row's record keeps.
  """

  def __init__(
    self,
    target: Any,
    draft: Any,
    enc: np.ndarray,
    ks: Sequence[int],
    max_gamma: int,
    max_decode_len: int,
    settings: settings_lib.DecodeSettings,
  ):
    self._target, self._draft = target, draft
    self._enc = jnp.asarray(enc)
    self._ks = sorted(set(int(k) for k in ks) - {1})
    self._length = max_decode_len + max_gamma + 2  # The speculative buffer.
    self._settings = settings
    self._states: dict[str, Any] = {}
    self.position: int | None = None

  def _state(self, name: str, model: Any, position_of) -> Any:
    if name not in self._states:
      if self.position is None:
        self.position = int(position_of())
      self._states[name] = timing.state_at(
        model, self._enc, self._length, self.position
      )
    return self._states[name]

  def _score(self, name, model, k, position_of) -> Callable:
    warm = []

    def run():
      state = self._state(name, model, position_of)
      if not warm:  # Compile untimed.
        jax.block_until_ready(
          timing.repeated_score(model, state, k, PROBE_CALLS)
        )
        warm.append(True)
      return None, timing.score_call_seconds(model, state, k, PROBE_CALLS)

    return run

  def _propose(self, position_of) -> Callable:
    """A drafter that is not a language model: one `propose` of γ tokens,
    per token (`timing.propose_time`, its own untimed warm-up each round)."""

    def run():
      if self.position is None:
        self.position = int(position_of())
      batch = self._enc.shape[0]
      size = getattr(getattr(self._target, 'config', None), 'emb_dim', 0)
      secs = timing.propose_time(
        self._draft,
        self._settings,
        1,
        batch,
        size,
        prefix=max(self.position, 1),
        target=self._target,
      )
      return None, secs / self._settings.gamma

    return run

  def runs(self, position_of: Callable[[], int]) -> dict[str, Callable]:
    """`run_rounds`' calls for the probes, by name (`PROBE` + ...)."""
    runs = {PROBE + TARGET_STEP: self._score('t', self._target, 1, position_of)}
    for k in self._ks:
      runs[PROBE + target_k(k)] = self._score('t', self._target, k, position_of)
    if drafter_lib.is_drafter(self._draft):
      runs[PROBE + DRAFT_STEP] = self._propose(position_of)
    else:
      runs[PROBE + DRAFT_STEP] = self._score('d', self._draft, 1, position_of)
    return runs

  def record(self, seconds: dict[str, list[float]]) -> dict[str, Any]:
    """The probes' seconds per call by round, as each row's record keeps
    them: `{'position', 'target_step': [R], 'target_calls': {'k': [R]},
    'draft_step': [R]}`."""
    return {
      'position': self.position,
      'target_step': seconds[PROBE + TARGET_STEP],
      'target_calls': {str(k): seconds[PROBE + target_k(k)] for k in self._ks},
      'draft_step': seconds[PROBE + DRAFT_STEP],
    }

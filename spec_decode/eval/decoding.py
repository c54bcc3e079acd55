"""Batches of an eval run decoded and timed, and the step costs c and v.

`Decoder` runs `sd.generate` plainly or speculatively on a batch (or
`sd.beam_search`, for `decode_method='beam'`), compiling each new input
shape once untimed first, so that walltimes exclude compile time (and, for
γ = `AUTO`, the policy's cost measurement, which `Decoder.cost_models`
keeps);
`Decoder.draft_alone` decodes a batch with the draft alone (its timed loop
gives the report's `c_loops`); `Decoder.probes` builds a batch's cost
probes (`rounds.Probes`: the c and v of the predictions, timed apart);
`batch_arrays` pads a batch of tokenized inputs to a
bucketed width; `row_spec_record` reads one row's acceptance counts from
`SpecStats` and `row_provenance` its tokens' provenance; `measure_costs`
times draft and target steps apart from the loops (`policy.timing.measure`: a
drafter that is not a language model, beam search).
"""

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import spec_decode as sd
from spec_decode.beam import scores as beam_scores
from spec_decode.chain import generation
from spec_decode.core import drafter as drafter_lib
from spec_decode.core import inputs
from spec_decode.core import rejection
from spec_decode.eval import rounds as rounds_lib
from spec_decode.eval import settings as settings_lib
from spec_decode.policy import timing as costs_lib

_MIN_BUCKET = 8
# The speculative "γ" of an auto-γ run: `sd.generate(gamma='auto')`, the
# in-loop policy. Records and results are keyed by it as by an int γ.
AUTO = inputs.AUTO


def tokenize(
  vocab: Any, examples: Sequence[dict[str, str]], max_input_len: int
) -> list[list[int]]:
  """The examples' inputs as ids, cut to `max_input_len` with EOS."""
  return [
    vocab.encode(ex['inputs'])[: max_input_len - 1] + [sd.EOS_ID]
    for ex in examples
  ]


def batches(start: int, stop: int, batch_size: int) -> list[list[int]]:
  """Example indices `start..stop-1` in batches of `batch_size`."""
  return [
    list(range(s, min(s + batch_size, stop)))
    for s in range(start, stop, batch_size)
  ]


def _bucket(n: int, max_len: int) -> int:
  b = _MIN_BUCKET
  while b < n:
    b *= 2
  return min(b, max_len)


def batch_arrays(
  token_lists: Sequence[list[int]],
  indices: Sequence[int],
  settings: settings_lib.EvalSettings,
) -> tuple[np.ndarray, np.ndarray]:
  """Encoder tokens `[batch_size, S]` and the rows' seeds (`seed + index`).

  A short batch repeats its last row (its results are dropped); S is the
  longest row rounded up to a power of two (at least 8, at most
  `max_input_len`), so that few shapes compile.
  """
  rows = [token_lists[i] for i in indices]
  seeds = [settings.seed + i for i in indices]
  while len(rows) < settings.batch_size:
    rows.append(rows[-1])
    seeds.append(seeds[-1])
  width = _bucket(max(len(r) for r in rows), settings.max_input_len)
  enc = np.zeros((settings.batch_size, width), np.int32)
  for b, r in enumerate(rows):
    enc[b, : len(r)] = r
  return enc, np.asarray(seeds, np.int64)


def measure_costs(
  target: Any,
  draft: Any,
  ks: Sequence[int],
  batch: int,
  repeats: int,
  sampling: dict[str, Any] | None = None,
  gamma: int = 4,
) -> dict[str, Any]:
  """c and v(k) (`policy.timing.measure`); a drafter is timed proposing `gamma`.

  Returns:
    `{'c', 'v_of_k': {k: v(k)}, 'target_step_seconds',
    'draft_step_seconds'}`, v(1) = 1.
  """
  settings = generation.decode_settings(
    speculative=True, gamma=gamma, max_decode_len=1, **(sampling or {})
  )
  return costs_lib.measure(target, draft, ks, batch, repeats, settings)


@dataclasses.dataclass(frozen=True)
class BeamDecode:
  """A beam-search decode as the run reads it: the best beam of each row.

  Attributes:
    tokens: `[B, M]` the best beam's tokens (pad after EOS).
    lengths: `[B]` its output tokens, EOS included.
    beams: the whole `sd.BeamSearchOutput` (`[B, K, ...]`, best first).
    stats: `BeamSpecStats` of speculative beam search; None for plain.
  """

  tokens: np.ndarray
  lengths: np.ndarray
  beams: sd.BeamSearchOutput
  stats: Any = None


@dataclasses.dataclass(frozen=True)
class BeamSpecStats:
  """Speculative beam search's counts in `row_spec_record`'s terms.

  A target call that commits 1 + a steps covered draft depths 1..a: the
  analogue of a accepted draft tokens. Depth d counts as tried in a call
  that checked it (`BeamSearchOutput.depth_tries`: not after the step that
  stopped the row) and accepted when covered (a >= d); a row's alpha is
  accepted over tried depths, its "proposed" nodes are the K beams' draft
  tree nodes per call (`BeamSearchOutput.tree_nodes` each).

  Attributes: per row `[B, ...]`, as `sd.SpecStats` names them, and
  `row_steps`, the beam-search steps each row took (`row_iterations` are
  its target calls).
  """

  row_accepted_histogram: np.ndarray
  row_iterations: np.ndarray
  row_position_tries: np.ndarray
  row_position_accepts: np.ndarray
  row_beta_sum: np.ndarray
  row_alpha: np.ndarray
  row_proposed: np.ndarray
  row_steps: np.ndarray
  row_gamma_histogram: np.ndarray | None = None

  @classmethod
  def of(cls, out: sd.BeamSearchOutput, num_beams: int) -> 'BeamSpecStats':
    """The counts of `out`; with gamma='auto', `row_gamma_histogram [B,
    G + 1]` holds each row's plain steps at γ 0 and speculative calls at
    G (the histogram and depth counts are the calls')."""
    hist = np.asarray(out.histogram, np.int64)  # [B, G + 1]
    gamma = hist.shape[1] - 1
    tries = np.asarray(out.depth_tries, np.int64)
    accepts = np.stack([hist[:, i + 1 :].sum(1) for i in range(gamma)], 1)
    beta = accepts.sum(1).astype(np.float64)
    calls = np.asarray(out.calls, np.int64)
    speculative = hist.sum(1)  # = calls unless gamma='auto'
    by_kind = None
    if out.iteration_seconds is not None:
      by_kind = np.zeros_like(hist)
      by_kind[:, 0], by_kind[:, gamma] = calls - speculative, speculative
    return cls(
      row_accepted_histogram=hist,
      row_iterations=calls,
      row_position_tries=tries,
      row_position_accepts=accepts,
      row_beta_sum=beta,
      row_alpha=beta / np.maximum(tries.sum(1), 1),
      row_proposed=speculative * num_beams * out.tree_nodes,
      row_steps=np.asarray(out.steps, np.int64),
      row_gamma_histogram=by_kind,
    )


def plain_row_record(plain: Any, r: int) -> dict[str, Any]:
  """What a record keeps of row r of a plain decode besides its tokens:
  for beam search, `plain_steps` (its target calls); else nothing."""
  if isinstance(plain, BeamDecode):
    return {'plain_steps': int(plain.beams.steps[r])}
  return {}


def same_output(plain: Any, spec: Any, r: int) -> bool:
  """Whether row r of a speculative decode is exact: its tokens are the
  plain decode's; for beam search, every beam's tokens and length are, and
  every score is within float32 rounding of plain's (`beam.scores`: 1e-5
  relative plus 1e-5 absolute)."""
  st = spec.tokens[r, : spec.lengths[r]].tolist()
  if st != plain.tokens[r, : plain.lengths[r]].tolist():
    return False
  if not isinstance(plain, BeamDecode):
    return True
  a, b = plain.beams, spec.beams
  return bool(
    np.array_equal(a.tokens[r], b.tokens[r])
    and np.array_equal(a.lengths[r], b.lengths[r])
    and beam_scores.agree(a.scores[r], b.scores[r])
  )


class Decoder:
  """Runs and times `sd.generate`, compiling each new shape untimed first.

  Attributes:
    target: the target model.
    draft: the draft (model or drafter).
    settings: the run's settings (sampling or beams, lengths, lenience,
      dynamic γ, max_auto_gamma).
    cost_models: the cost models the `AUTO` decodes used, in order, once
      each: `{'key', 'path'` (the cost cache's entry), `'measured'`
      (measured by one of this decoder's calls, else read from the cache),
      `'iteration_seconds': {'γ': seconds of one loop iteration or None}}`.
    acceptance: the acceptance estimate the `AUTO` decodes start from
      (`policy.carried`; None: the prior), carried from batch to batch:
      the first recorded decode of a batch gives the next batch's
      (`finish_batch`), never the batch's own (its timing rounds and
      warm-up decode with the same seeds, so the estimate they start from
      must not have seen those draws).
  """

  def __init__(
    self, target: Any, draft: Any, settings: settings_lib.EvalSettings
  ):
    self.target = target
    self.draft = draft
    self.settings = settings
    self._verifier = rejection.ExactVerifier(lenience=settings.lenience)
    self._seen = set()
    self.cost_models: list[dict[str, Any]] = []
    self.acceptance: Any = None
    self._batch_acceptance: Any = None

  def width(self, gamma: int | str) -> int:
    """The most draft tokens an iteration at `gamma` proposes."""
    return self.settings.max_auto_gamma if gamma == AUTO else int(gamma)

  def __call__(
    self,
    enc: np.ndarray,
    seeds: np.ndarray,
    gamma: int | str | None = None,
    timed: bool = True,
  ) -> tuple[Any, float]:
    """Decodes a batch plainly (`gamma` None) or speculatively (an int or
    `AUTO`).

    Returns:
      The `sd.generate` output and the seconds it took.
    """
    s = self.settings
    if s.beam:
      return self._beam(enc, timed, gamma)
    kw = dict(s.sampling(), max_decode_len=s.max_decode_len, seed=seeds)
    if gamma is not None:
      kw.update(
        draft=self.draft,
        gamma=gamma,
        verifier=self._verifier,
        dynamic_gamma=s.dynamic_gamma or False,
      )
      if gamma == AUTO:
        kw.update(max_auto_gamma=s.max_auto_gamma, acceptance=self.acceptance)
    key = (enc.shape, gamma)
    if timed and key not in self._seen:
      # Warm-up: compile (and for AUTO, measure or read the cost model).
      self._note_costs(sd.generate(self.target, enc, **kw))
    self._seen.add(key)
    t0 = time.perf_counter()
    out = sd.generate(self.target, enc, **kw)
    seconds = time.perf_counter() - t0
    self._note_costs(out)
    if gamma == AUTO and self._batch_acceptance is None:
      self._batch_acceptance = out.gamma_choice['acceptance']
    return out, seconds

  def finish_batch(self) -> None:
    """The batch is done: its first `AUTO` decode's estimate becomes the
    one the next batch starts from."""
    if self._batch_acceptance is not None:
      self.acceptance = self._batch_acceptance
    self._batch_acceptance = None

  @property
  def decodes_draft_alone(self) -> bool:
    """Whether `draft_alone` applies: a language-model draft, no beams."""
    return not self.settings.beam and not drafter_lib.is_drafter(self.draft)

  def draft_alone(
    self, enc: np.ndarray, seeds: np.ndarray
  ) -> tuple[Any, float]:
    """Plain decoding with the draft as the model (compiled untimed first):
    its loop's seconds per step are the draft's step time in the report.

    Returns:
      The `sd.generate` output and the seconds it took.
    """
    s = self.settings
    kw = dict(s.sampling(), max_decode_len=s.max_decode_len, seed=seeds)
    key = (enc.shape, 'draft alone')
    if key not in self._seen:
      sd.generate(self.draft, enc, **kw)
    self._seen.add(key)
    t0 = time.perf_counter()
    out = sd.generate(self.draft, enc, **kw)
    return out, time.perf_counter() - t0

  def _note_costs(self, out: Any) -> None:
    """Keeps the cost model of an `AUTO` decode (`cost_models`): seconds
    per loop iteration by γ (beam search: γ 0, a plain step, and γ G, a
    speculative call)."""
    if isinstance(out, sd.BeamSearchOutput):
      if out.cost_cache is None:
        return
      cache = out.cost_cache
      plain, call = out.iteration_seconds
      depth = out.histogram.shape[1] - 1  # The calls' tree depth.
      seconds = {'0': plain, str(depth): call}
    else:
      choice = getattr(out, 'gamma_choice', None)
      if not choice:
        return
      cache = choice['cost_cache']
      seconds = {str(g): s for g, s in choice['iteration_seconds'].items()}
    model = {
      'key': cache['key'],
      'path': cache['path'],
      'measured': bool(cache['measured']),
      'iteration_seconds': seconds,
    }
    add_cost_model(self.cost_models, model)

  def _beam(
    self, enc: np.ndarray, timed: bool, gamma: int | None
  ) -> tuple[BeamDecode, float]:
    """Plain (`gamma` None) or speculative beam search of a batch
    (compiled untimed first), timed."""
    s = self.settings
    kw = dict(
      num_beams=s.num_beams,
      alpha=s.beam_alpha,
      max_decode_len=s.max_decode_len,
    )
    if gamma is not None:
      kw.update(
        draft=self.draft,
        gamma=gamma,
        draft_beams=s.draft_beams,
        draft_children=s.draft_children,
      )
      if gamma == AUTO:  # Trees of depth max_auto_gamma where it pays.
        kw['max_auto_gamma'] = s.max_auto_gamma
    key = (enc.shape, 'beam', gamma)
    if timed and key not in self._seen:
      # Warm-up: compile (and for AUTO, measure or read the two costs).
      self._note_costs(sd.beam_search(self.target, enc, **kw))
    self._seen.add(key)
    t0 = time.perf_counter()
    out = sd.beam_search(self.target, enc, **kw)
    seconds = time.perf_counter() - t0
    self._note_costs(out)
    stats = None if gamma is None else BeamSpecStats.of(out, s.num_beams)
    return BeamDecode(out.tokens[:, 0], out.lengths[:, 0], out, stats), seconds

  def probes(self, enc: np.ndarray, gammas: Sequence[Any]) -> Any:
    """The batch's cost probes (`rounds.Probes`): a target call on 1 and
    on γ+1 tokens for each γ (`AUTO`: every γ in 0..max_auto_gamma) and a
    draft step; None for beam search (its report shows no chain
    prediction)."""
    s = self.settings
    if s.beam:
      return None
    width = max(self.width(g) for g in gammas)
    ks = range(1, width + 2) if AUTO in gammas else [int(g) + 1 for g in gammas]
    settings = generation.decode_settings(
      speculative=True, gamma=width, max_decode_len=1, **s.sampling()
    )
    return rounds_lib.Probes(
      self.target,
      self.draft,
      enc,
      ks,
      width,
      s.max_decode_len,
      settings,
    )

  def costs(self, ks: Sequence[int], gamma: int) -> dict[str, Any]:
    """`measure_costs` of the pair at the run's batch size and sampling."""
    s = self.settings
    return measure_costs(
      self.target,
      self.draft,
      ks,
      s.batch_size,
      s.timing_repeats,
      s.sampling(),
      gamma,
    )


def add_cost_model(models: list[dict[str, Any]], model: dict[str, Any]) -> None:
  """Appends `model` (as in `Decoder.cost_models`) to `models` unless one
  with its cache key and seconds is there; that one is then `measured` if
  either was."""
  for known in models:
    if (known['key'], known['iteration_seconds']) == (
      model['key'],
      model['iteration_seconds'],
    ):
      known['measured'] = known['measured'] or model['measured']
      return
  models.append(dict(model))


def row_spec_record(stats: Any, r: int) -> dict[str, Any]:
  """Per-example acceptance counts of row `r` of a speculative batch
  (`sd.SpecStats` or `BeamSpecStats`: both carry per-row counts).

  `position_tries[i]` / `position_accepts[i]`: iterations that tested /
  accepted draft token i; `tested` their total, `beta_sum` the row's
  summed beta (its alpha times `tested`), `proposed` its draft tokens.
  """
  tries = np.asarray(stats.row_position_tries[r], np.int64)
  # Beam search: its steps (`iterations` are its target calls).
  steps = getattr(stats, 'row_steps', None)
  # gamma='auto': the row's iterations at each γ 0..G while it decoded.
  by_gamma = stats.row_gamma_histogram
  return {
    **({} if steps is None else {'steps': int(steps[r])}),
    **(
      {}
      if by_gamma is None
      else {'gamma_iterations': np.asarray(by_gamma[r]).tolist()}
    ),
    'iterations': int(stats.row_iterations[r]),
    'accepted_histogram': np.asarray(
      stats.row_accepted_histogram[r], np.int64
    ).tolist(),
    'position_tries': tries.tolist(),
    'position_accepts': np.asarray(
      stats.row_position_accepts[r], np.int64
    ).tolist(),
    'tested': int(tries.sum()),
    'beta_sum': float(stats.row_beta_sum[r]),
    'alpha': float(stats.row_alpha[r]),
    'proposed': int(stats.row_proposed[r]),
  }


def row_provenance(out: Any, r: int, tokens: list[int]) -> dict[str, Any]:
  """Row r's per-token provenance for its record (`core.provenance`):
  `provenance`, the code of each output token, and `rejected`, `[position,
  draft token]` where the target replaced a rejected draft token; tree
  decodes add `rank` (sibling ranks). Empty without provenance (plain or
  beam decodes)."""
  prov = getattr(out, 'provenance', None)
  if prov is None:
    return {}
  n = len(tokens)
  rejected = prov.rejected[r, :n]
  rec = {
    'provenance': prov.codes[r, :n].astype(int).tolist(),
    'rejected': [
      [int(k), int(rejected[k])] for k in np.flatnonzero(rejected >= 0)
    ],
  }
  if prov.rank[r, :n].any():
    rec['rank'] = prov.rank[r, :n].astype(int).tolist()
  return rec

"""One batch decoded speculatively, and its rows as T5X infer.py's lines.

`Decoder(target, draft, settings)` runs `sd.generate` with the draft (a
chain of γ, γ = 'auto', or `tree=`; greedy or sampled with per-example
seeds `seed + index`, as the eval run seeds them) or `sd.beam_search` with
the draft (`decode_method='beam'`), once per batch: no plain decode, no
timing rounds, no cost probes (the eval run's). The first batch of each
input width compiles; the run's seconds include it, as T5X's infer does.
With γ = 'auto' each batch's policy starts from the acceptance estimate of
the batches before it (`policy/carried.py`; the first batch, and the first
after a resume, from the prior): batches have seeds of their own, so no
decode's schedule reads its own draws.

`line(...)` builds one prediction line as T5X's `write_inferences_to_file`
does: `inputs` (the `*_pretokenized` features, or a file's input and id),
`prediction` (the decoded text), `prediction_tokens` when asked
(`output_ids`: the ids through EOS), and for `predict_with_aux` an `aux`
dict with `scores` (and `provenance` when asked). `row_stats` keeps what
the summary adds up: tokens, target calls, acceptance, ran out.
"""

import time
from typing import Any

import numpy as np

import spec_decode as sd
from spec_decode.core import rejection
from spec_decode.eval import decoding
from spec_decode.eval.infer import settings as settings_lib
from spec_decode.eval.report import outcomes


class Decoder:
  """Speculative decodes of an infer run's batches.

  Attributes:
    target: the target model.
    draft: the draft (a model or a drafter); None decodes plainly (the
      same job without speculation: `bench infer`'s comparison).
    settings: the run's `InferSettings`.
    acceptance: the acceptance estimate the next γ = 'auto' decode starts
      from (`policy.carried`; None: the prior), the last decode's.
  """

  def __init__(
    self, target: Any, draft: Any, settings: settings_lib.InferSettings
  ):
    self.target = target
    self.draft = draft
    self.settings = settings
    self._verifier = rejection.ExactVerifier(lenience=settings.lenience)
    self.acceptance = None

  def __call__(self, enc: Any, seeds: np.ndarray) -> tuple[Any, float]:
    """Decodes a batch; returns the output and its seconds.

    Beam search gives a `decoding.BeamDecode` (the best beam per row).
    """
    s = self.settings
    t0 = time.perf_counter()
    if s.beam:
      kw = dict(
        num_beams=s.num_beams,
        alpha=s.beam_alpha,
        max_decode_len=s.max_decode_len,
        draft=self.draft,
        gamma=s.gamma_value,
        draft_beams=s.draft_beams,
        draft_children=s.draft_children,
      )
      if s.gamma_value == 'auto':
        kw['max_auto_gamma'] = s.max_auto_gamma
      out = sd.beam_search(self.target, enc, **kw)
      stats = (
        None
        if self.draft is None
        else decoding.BeamSpecStats.of(out, s.num_beams)
      )
      result = decoding.BeamDecode(
        out.tokens[:, 0], out.lengths[:, 0], out, stats
      )
      return result, time.perf_counter() - t0
    kw = dict(
      s.sampling(),
      max_decode_len=s.max_decode_len,
      seed=seeds,
      draft=self.draft,
      verifier=self._verifier,
      dynamic_gamma=s.dynamic_gamma or False,
    )
    if s.tree is not None and self.draft is not None:
      # Trees verify exactly (recursive rejection): no chain verifier.
      del kw['verifier'], kw['dynamic_gamma']
      kw['tree'] = list(s.tree) if isinstance(s.tree, tuple) else s.tree
      if isinstance(s.tree, tuple) and isinstance(s.tree[0], tuple):
        kw['tree'] = [list(p) for p in s.tree]
    else:
      kw['gamma'] = s.gamma_value
      if s.gamma_value == 'auto':
        kw['max_auto_gamma'] = s.max_auto_gamma
        if self.draft is not None:
          kw['acceptance'] = self.acceptance
    out = sd.generate(self.target, enc, **kw)
    if out.gamma_choice is not None:
      self.acceptance = out.gamma_choice['acceptance']
    return out, time.perf_counter() - t0

  def scores(self, enc: Any, out: Any) -> np.ndarray:
    """`[B]` T5X's `aux['scores']`: beam search's score of the best beam,
    else the target's log-probability of each output (EOS included;
    teacher-forced at temperature 1)."""
    if isinstance(out, decoding.BeamDecode):
      return np.asarray(out.beams.scores)[:, 0]
    tokens = np.asarray(out.tokens)
    lengths = np.asarray(out.lengths)
    logp = np.asarray(self.target.log_probs(enc, tokens))
    mask = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    return (logp * mask).sum(1)


def row_tokens(out: Any, r: int) -> list[int]:
  """Row r's output ids through EOS."""
  return np.asarray(out.tokens[r, : int(out.lengths[r])]).tolist()


def line(
  inputs: dict[str, Any],
  text: str,
  tokens: list[int],
  settings: settings_lib.InferSettings,
  score: float | None = None,
  provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
  """One prediction line's JSON object, keys in T5X infer.py's order."""
  obj = {'inputs': inputs, 'prediction': text}
  if settings.output_ids:
    obj['prediction_tokens'] = tokens
  if settings.mode == 'predict_with_aux':
    aux = {'scores': float(score)}
    if settings.provenance:
      aux['provenance'] = (provenance or {}).get('provenance', [])
    obj['aux'] = aux
  elif settings.provenance:
    obj['aux'] = {'provenance': (provenance or {}).get('provenance', [])}
  return obj


def row_stats(out: Any, r: int, tokens: list[int], max_len: int):
  """What the summary adds up for row r: `tokens`, `calls` (target
  calls), `beta_sum` and `tested` (alpha's parts), `ran_out` (no EOS).
  Plain decoding (no draft: `out.stats` is None) makes one target call per
  token (beam search: per step) and tests no draft token."""
  if out.stats is None:
    beams = getattr(out, 'beams', None)
    return {
      'tokens': len(tokens),
      'calls': len(tokens) if beams is None else int(beams.steps[r]),
      'beta_sum': 0.0,
      'tested': 0,
      'ran_out': outcomes.ran_out(tokens, max_len),
    }
  rec = decoding.row_spec_record(out.stats, r)
  return {
    'tokens': len(tokens),
    'calls': rec['iterations'],
    'beta_sum': rec['beta_sum'],
    'tested': rec['tested'],
    'ran_out': outcomes.ran_out(tokens, max_len),
  }

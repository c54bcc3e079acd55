"""`generate`: the public entry point for plain and speculative decoding."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.chain import auto_costs
from spec_decode.chain import loops
from spec_decode.core import inputs
from spec_decode.core import model_drafter
from spec_decode.core import placement
from spec_decode.core import provenance as provenance_lib
from spec_decode.core import rejection
from spec_decode.core import sampling
from spec_decode.core import tree_shape as tree_lib
from spec_decode.core.counters import SpecCounters
from spec_decode.core.counters import SpecStats
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.ids import EOS_ID
from spec_decode.core.protocol import LanguageModel
from spec_decode.policy import carried
from spec_decode.policy import finish_time
from spec_decode.tree import generation as tree_generation


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  """Result of `generate`.

  Attributes:
    tokens: `[B, max_decode_len] int32`; pad (0) after EOS.
    lengths: `[B] int32`, tokens up to and including EOS.
    stats: `SpecStats` for speculative decoding, None for plain decoding.
    gamma_choice: with `gamma='auto'`, what the policy used and did
      (`{'policy', 'max_gamma', 'iteration_seconds', 'gamma_iterations',
      'cost_cache', 'can_pay'}`: seconds per loop iteration at each gamma,
      the batch's iterations run at each gamma, the cost cache entry, and
      whether any gamma >= 1 could pay at these costs: where none could
      even with every draft token accepted, the decode ran plain decoding's
      program, all at gamma 0; and `'acceptance'`, the
      `policy.carried.AcceptanceEstimate` after this decode, to pass to
      the next decode's `acceptance=`; `'started_from'`, the alpha and
      weight the policy started from; `'plain_by_estimate'`, whether a
      carried estimate chose plain decoding's program), else None.
  """

  tokens: np.ndarray
  lengths: np.ndarray
  stats: SpecStats | None
  gamma_choice: dict | None = None
  # With `tree=`: the shape and what the decode measured (per-node and
  # per-depth/rank acceptance, tokens per call; with tree='auto' also
  # the choice), `tree_generation.report`; else None.
  tree: dict | None = None
  # Where each output token came from (the paper's Figure 1):
  # `core.provenance.Provenance` with codes `[B, max_decode_len]` (accepted
  # draft token, the target's replacement and the rejected draft token,
  # bonus token, plain step; iteration starts). None for plain decoding.
  provenance: provenance_lib.Provenance | None = None


# `dynamic_gamma=True` uses this draft-confidence threshold.
DEFAULT_CONFIDENCE = 0.5


def generate(
  model: LanguageModel,
  encoder_tokens: Any,
  *,
  draft: LanguageModel | None = None,
  gamma: int | str = 4,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
  max_decode_len: int = 64,
  seed: Any = 0,
  eos_id: int = EOS_ID,
  verifier: rejection.Verifier | None = None,
  lenience: float = 1.0,
  dynamic_gamma: bool | float = False,
  tree: Any = None,
  max_auto_gamma: int = finish_time.MAX_GAMMA,
  acceptance: carried.AcceptanceEstimate | None = None,
) -> GenerateOutput:
  """Decodes `encoder_tokens [B, S]` (int, padded with 0).

  Args:
    model: the target.
    encoder_tokens: `[B, S]` ints in [0, V), 0 = padding.
    draft: None for plain decoding; else any language model or drafter
      (`spec_decode.drafters`) with the target's vocabulary.
    gamma: draft tokens per iteration (>= 1), or 'auto': every iteration
      picks its gamma in {0, ..., max_auto_gamma} inside the compiled loop
      (`policy.finish_time`: the soonest predicted end of the rows still
      decoding, from their pooled running acceptance estimate, the tokens
      each may still emit and the loop's measured seconds per iteration
      at each gamma; 0 is a plain target step). The seconds are measured
      once per models' shapes, batch size, settings and device and cached
      on disk (`chain.auto_costs`); reported in `gamma_choice`.
    temperature: 0 is argmax.
    top_k: 0 keeps all ids.
    top_p: 1.0 keeps all ids.
    max_decode_len: output tokens per row at most.
    seed: int (row r uses fold_in(key(seed), r)) or int array `[B]`.
    eos_id: end-of-sequence id.
    verifier: Algorithm 1 variant; default `ExactVerifier(lenience)`.
    lenience: l in (0, 1]; 1 (the default) is exact. l < 1 accepts more
      draft tokens and no longer samples the target's distribution
      (appendix A.5; greedy: accept x when p(x) >= l * max p).
    dynamic_gamma: False, True (threshold `DEFAULT_CONFIDENCE`) or a
      threshold tau in (0, 1): a model draft stops proposing in a row where
      its confidence (largest draft probability) drops below tau, so gamma
      is the most tokens an iteration proposes. Exact either way.
    tree: None (chains of `gamma`), or token trees verified in one
      target call each: Medusa-style paths of child ranks
      (`[[0], [1], [0, 0]]`), a per-depth branching tuple (`(3, 2, 1)`;
      `(1,) * gamma` is the chain) or 'auto' (`tree.auto`). Exact
      for greedy and sampling (`tree.verification`); `gamma` is ignored.
    max_auto_gamma: the largest gamma of `gamma='auto'` (>= 1).
    acceptance: with `gamma='auto'`, an earlier decode's acceptance
      estimate (`gamma_choice['acceptance']`; `policy.carried`): the
      policy starts from it instead of the prior, and where it says no
      gamma >= 1 can beat plain decoding the decode runs plain decoding's
      program outright. None: the prior. A sampled decode must use row
      keys (seeds) of its own, none of the decodes the estimate was
      measured with (a ValueError otherwise).

  Sharded models (`Model.init/load(..., partitioner=p)`) decode sharded: the
  rows go on the mesh's `data` axis (padded to a multiple of its size with
  copies of the last row, dropped again from the results), an unsharded
  draft is replicated on the mesh, and the loop is one program over all
  devices. On several hosts, pass the global array of
  `parallel.multihost.global_batch` as `encoder_tokens`; every host gets
  the whole result.

  Returns:
    `GenerateOutput` with tokens `[B, max_decode_len]`, lengths `[B]`, stats.
  """
  # Every argument is checked before anything compiles.
  settings = decode_settings(
    speculative=draft is not None,
    gamma=gamma,
    temperature=temperature,
    top_k=top_k,
    top_p=top_p,
    max_decode_len=max_decode_len,
    eos_id=eos_id,
    verifier=verifier,
    lenience=lenience,
    dynamic_gamma=dynamic_gamma,
    max_auto_gamma=max_auto_gamma,
  )
  tree_shape = _tree_shape(
    model, draft, tree, settings, verifier, lenience, dynamic_gamma
  )
  model, draft, enc, keys, batch = _placed(model, draft, encoder_tokens, seed)
  estimate, sampled = _check_acceptance(
    acceptance, settings, inputs.row_keys(seed, batch)
  )
  if tree is not None:
    out, lengths, counters, report, prov = tree_generation.run(
      model, draft, enc, keys, settings, tree_shape, batch
    )
    stats = SpecStats.from_counters(counters, lengths)
    return GenerateOutput(out, lengths, stats, tree=report, provenance=prov)
  if draft is None:
    out, lengths = placement.to_host(
      loops.plain_decode_jit(model, enc, keys, settings=settings)
    )
    return GenerateOutput(out[:batch], lengths[:batch], None)
  if not settings.gamma_policy:
    return _speculative(model, draft, enc, keys, settings, batch)
  return _carried_auto(
    model, draft, enc, keys, settings, batch, estimate, sampled
  )


def _tree_shape(
  model, draft, tree, settings, verifier, lenience, dynamic_gamma
) -> tree_lib.TreeShape | None:
  """`tree=` checked (`tree_generation.check`): its static shape, None
  for tree='auto' (and for no tree)."""
  if tree is None:
    return None
  if settings.gamma_policy:
    raise ValueError("tree= replaces gamma; leave gamma='auto' out")
  return tree_generation.check(
    model,
    draft,
    tree,
    verifier,
    lenience,
    _confidence_threshold(dynamic_gamma),
  )


def _placed(
  model, draft, encoder_tokens, seed
) -> tuple[Any, Any, jax.Array, jax.Array, int]:
  """The models and inputs as the loop takes them: the tokens checked, a
  draft checked against the model and made its drafting copy, the row keys,
  and everything placed on the models' mesh (rows padded to the `data`
  axis) when they are sharded.

  Returns:
    model, draft, encoder tokens `[B', S]`, row keys `[B']` and B, the
    caller's rows (B' >= B on a mesh).
  """
  spans_hosts = placement.is_global(encoder_tokens)
  tokens = inputs.check_model_tokens(
    model, placement.local_data(encoder_tokens)
  )
  if draft is not None:
    inputs.check_pair(model, draft)
    draft = model_drafter.drafting_copy(draft, model)
  batch = encoder_tokens.shape[0] if spans_hosts else tokens.shape[0]
  keys = inputs.row_keys(seed, batch)
  mesh = placement.placement_of(model, draft)
  if mesh is not None:
    model, draft = mesh.place(model), mesh.place(draft)
    enc, keys = placement.sharded_inputs(
      mesh, encoder_tokens if spans_hosts else tokens, keys
    )
  elif spans_hosts:
    raise ValueError(
      'encoder_tokens span several hosts: the models must be '
      'sharded (Model.init/load(..., partitioner=...))'
    )
  else:
    enc = jnp.asarray(tokens)
  return model, draft, enc, keys, batch


def _check_acceptance(acceptance, settings, keys):
  """`generate`'s `acceptance` checked: the estimate (None: none given)
  and the row keys `[B]` of a sampled decode (None for greedy), which a
  carried estimate must not have seen (`policy.carried`)."""
  estimate = carried.check(acceptance)
  if estimate is not None and not settings.gamma_policy:
    raise ValueError(
      "acceptance= is gamma='auto''s: pass a draft and gamma='auto' with it"
    )
  sampled = None if settings.sampler.is_greedy else keys
  if estimate is not None and sampled is not None:
    estimate.check_keys(sampled)
  return estimate, sampled


def _carried_auto(
  model, draft, enc, keys, settings, batch, estimate, sampled
) -> GenerateOutput:
  """gamma='auto' from the carried `estimate` (None: the prior), an
  earlier decodes' (`policy.carried`); `sampled`: the row keys of a
  sampled decode (None for greedy), which the estimate then records."""
  # The policy's costs: measured on this program (forced gammas, their own
  # keys) or read from the cache; never from this decode's draws.
  seconds, cache = auto_costs.iteration_seconds(model, draft, enc, settings)
  start = estimate or carried.AcceptanceEstimate()
  pays = finish_time.can_pay(seconds)
  by_estimate = (
    pays
    and estimate is not None
    and estimate.plain_wins(seconds, batch, settings.max_decode_len)
  )
  if pays and not by_estimate:
    policy = finish_time.PolicyInputs.create(
      seconds, prior_alpha=start.alpha, prior_weight=start.weight
    )
    out = _speculative(model, draft, enc, keys, settings, batch, policy)
    after = start.after(
      out.stats.row_beta_sum.sum(),
      out.stats.row_position_tries.sum(),
      sampled,
    )
  else:
    out = _plain_as_auto(model, enc, keys, settings, batch)
    # Costs no alpha can beat say nothing about alpha: the weight stays.
    decay = carried.PLAIN_DECAY if pays else 1.0
    after = start.after_plain(sampled, decay)
  report = _policy_report(out.stats, seconds, cache, pays)
  report.update(
    acceptance=after,
    started_from={'alpha': start.alpha, 'weight': start.weight},
    plain_by_estimate=bool(by_estimate),
  )
  return dataclasses.replace(out, gamma_choice=report)


def decode_settings(
  *,
  speculative: bool,
  gamma: int | str = 4,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
  max_decode_len: int = 64,
  eos_id: int = EOS_ID,
  verifier: rejection.Verifier | None = None,
  lenience: float = 1.0,
  dynamic_gamma: bool | float = False,
  max_auto_gamma: int = finish_time.MAX_GAMMA,
) -> DecodeSettings:
  """`generate`'s checks of its settings and the static `DecodeSettings`
  they make, for every caller that decodes or times a decode as
  `generate` would (`generate`, the eval run's settings and cost probes):
  a bad value is the same ValueError, naming the argument, wherever it
  came from. The arguments are `generate`'s; `speculative` is whether a
  draft is given (plain decoding reads and checks `gamma`, then ignores
  it). `tree=` is checked by `generate` (it needs the models)."""
  gamma = inputs.parse_gamma(gamma)
  auto = gamma == inputs.AUTO
  sampler = sampling.Sampler(temperature, top_k, top_p)
  if auto:
    inputs.check_int('max_auto_gamma', max_auto_gamma, 1)
  tau = _confidence_threshold(dynamic_gamma)
  if (
    isinstance(lenience, bool)
    or not isinstance(lenience, (int, float, np.integer, np.floating))
    or not 0.0 < lenience <= 1.0
  ):
    raise ValueError(f'lenience must be in (0, 1], got {lenience!r}')
  if verifier is not None and lenience != 1.0:
    raise ValueError('pass lenience to your verifier, not to generate')
  inputs.check_int('max_decode_len', max_decode_len, 1)
  if not speculative:
    gamma = 1  # Plain decoding ignores gamma.
  elif auto:
    gamma = max_auto_gamma  # 'auto' picks up to max_auto_gamma.
  # The loop is sized by the most any iteration drafts; the top-level
  # gamma is that most (the auto loop sets each iteration's own).
  return DecodeSettings(
    max_decode_len=int(max_decode_len),
    sampler=sampler,
    width=int(gamma),
    gamma=int(gamma),
    verifier=verifier or rejection.ExactVerifier(float(lenience)),
    eos_id=eos_id,
    dynamic_gamma=tau if speculative else 0.0,
    gamma_policy=auto and speculative,
  )


def _plain_as_auto(model, enc, keys, settings, batch) -> GenerateOutput:
  """gamma='auto' where no acceptance rate could make a gamma >= 1 pay:
  plain decoding's own program (the policy loop at gamma 0 throughout,
  without its per-iteration work and probes; the same draws, since a
  gamma-0 iteration keys its token as a plain step does), counted as
  gamma-0 iterations."""
  plain = dataclasses.replace(
    settings, width=1, gamma=1, gamma_policy=False, dynamic_gamma=0.0
  )
  out, lengths = placement.to_host(
    loops.plain_decode_jit(model, enc, keys, settings=plain)
  )
  out, lengths = out[:batch], lengths[:batch]
  # Host arrays: eager device ops here cost milliseconds per decode.
  steps = np.asarray(lengths, np.int32)
  counters = SpecCounters.zeros(batch, settings.width, True, xp=np)
  counters.gamma_histogram[:, 0] = steps
  counters = counters.replace(iterations=steps)
  return GenerateOutput(
    out,
    lengths,
    SpecStats.from_counters(counters, lengths),
    provenance=provenance_lib.Provenance.plain(
      lengths, settings.max_decode_len
    ),
  )


def _speculative(
  model, draft, enc, keys, settings, batch, policy=None
) -> GenerateOutput:
  out, lengths, counters, record = placement.to_host(
    loops.speculative_decode_jit(
      model, draft, enc, keys, settings=settings, policy=policy
    )
  )
  counters = jax.tree.map(lambda x: x[:batch], counters)
  lengths = lengths[:batch]
  prov = None
  if record is not None:
    prov = provenance_lib.Provenance.of(record, settings.max_decode_len)
    prov = prov.rows(slice(0, batch))
  return GenerateOutput(
    out[:batch],
    lengths,
    SpecStats.from_counters(counters, lengths),
    provenance=prov,
  )


def _policy_report(stats: SpecStats, seconds, cache, can_pay: bool) -> dict:
  """What gamma='auto' used and did (`GenerateOutput.gamma_choice`)."""
  hist = stats.row_gamma_histogram
  # The decision is the batch's: the row that ran longest saw every
  # iteration.
  longest = hist[int(np.argmax(stats.row_iterations))]
  return {
    'policy': 'finish_time',
    'max_gamma': len(seconds) - 1,
    'iteration_seconds': {
      g: (float(s) if np.isfinite(s) else None) for g, s in enumerate(seconds)
    },
    'gamma_iterations': {g: int(n) for g, n in enumerate(longest)},
    'cost_cache': cache,
    'can_pay': can_pay,
  }


def _confidence_threshold(dynamic_gamma: Any) -> float:
  """0.0 (off) or the draft-confidence threshold in (0, 1)."""
  if dynamic_gamma is False or dynamic_gamma is None:
    return 0.0
  if dynamic_gamma is True:
    return DEFAULT_CONFIDENCE
  if isinstance(dynamic_gamma, (int, float, np.floating)) and (
    0.0 < float(dynamic_gamma) < 1.0
  ):
    return float(dynamic_gamma)
  raise ValueError(
    'dynamic_gamma must be False, True or a confidence threshold in '
    f'(0, 1), got {dynamic_gamma!r}'
  )

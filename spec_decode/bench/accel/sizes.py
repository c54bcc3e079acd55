"""One target size against the draft: step time, v(k), c, speedups.

Batch 1, greedy. v(k) is the time of one target call on k tokens over a
call on one (`policy.timing.step_times`, calls inside compiled loops, one
primed state per model), each printed next to its memory-bandwidth bound
(`cost.bound_seconds`); c is the draft step over the target step. Under
controlled acceptance (`bench.controlled.ControlledDraft`: the real draft
runs for its cost, its proposal is the target's own next token with
probability alpha) the measured speedup (walltime of plain over
speculative `generate`, medians) stands next to Theorem 3.8 generalized,
E[tokens] / (gamma c + v(gamma + 1)), from the measured c and v: first at
the paper's Table 2 setting (alpha 0.75, gamma 7), then at further alphas
with the gamma that prediction says is best.

`SizeBench` holds one size's results (`sections['sizes'][name]`) and makes
its items; each item is one measurement, written the moment it exists.
"""

import time
from typing import Any

import jax
import numpy as np

import spec_decode as sd
from spec_decode import theory
from spec_decode.bench import speed
from spec_decode.bench.accel import cost
from spec_decode.bench.accel.plan import Plan
from spec_decode.bench.accel.record import Recorder
from spec_decode.bench.accel.runner import Item
from spec_decode.bench.accel.runner import Skip
from spec_decode.policy import timing
from spec_decode.t5gemma.config import EOS_ID as T5GEMMA_EOS_ID

# The paper's Table 2 setting (T5-XXL/T5-small, WMT EnDe, greedy, TPU-v4):
# gamma 7 at alpha 0.75, c 0.02, expected 3.2x, measured 3.4x.
PAPER = {'alpha': 0.75, 'gamma': 7, 'c': 0.02, 'expected': 3.2, 'measured': 3.4}
ENCODER_LENGTH = 24


def inputs(batch: int, vocab_size: int, seed: int = 0) -> np.ndarray:
  """`[batch, 24]` encoder tokens (ids 3..min(999, V - 1), no padding)."""
  rng = np.random.default_rng(seed)
  high = min(1000, vocab_size)
  return rng.integers(3, high, (batch, ENCODER_LENGTH)).astype(np.int32)


def timed(fn, repeats: int) -> tuple[float, Any, float]:
  """(median seconds after the first call, the output, first call seconds)."""
  t0 = time.perf_counter()
  out = fn()
  jax.block_until_ready(getattr(out, 'tokens', out))
  first = time.perf_counter() - t0
  seconds = timing.median_time(lambda: fn().tokens, repeats)
  return seconds, out, first


def timed_compile(fn, repeats: int, predictor, units: int):
  """`timed`, and the compile time (first call less a steady one) fed to
  `predictor` as a program of `units`."""
  seconds, out, first = timed(fn, repeats)
  predictor.observe_compile(units, first - seconds)
  return seconds, out, first


def suppress_eos(model):
  """`bench.peer.suppress_eos` on the device (no host copy of the weights):
  EOS is never the argmax, so greedy decodes run to full length. A T5Gemma
  model's EOS row of its head (the tied embedding, or the untied head's
  column) becomes half of another token's row, as T5's column does."""
  if isinstance(model, sd.T5GemmaModel):
    return _suppress_eos_t5gemma(model)
  params = dict(model.params)
  decoder = dict(params['decoder'])
  dense = dict(decoder['logits_dense'])
  kernel = dense['kernel']
  dense['kernel'] = kernel.at[:, sd.EOS_ID].set(0.5 * kernel[:, sd.UNK_ID])
  decoder['logits_dense'] = dense
  params['decoder'] = decoder
  return model.with_params(params)


def _suppress_eos_t5gemma(model):
  eos, other = T5GEMMA_EOS_ID, 3  # 3: Gemma's <unk>, as T5's UNK_ID.
  params = jax.tree.map(lambda x: x, model.params)  # New dicts, same leaves.
  if not model.config.tie_head:
    head = params['decoder']['head']
    head['kernel'] = (
      head['kernel'].at[:, eos].set(0.5 * head['kernel'][:, other])
    )
  else:
    owner = params if model.config.shared_embedding else params['decoder']
    table = owner['embedder']['embedding']
    owner['embedder']['embedding'] = table.at[eos].set(0.5 * table[other])
  return sd.T5GemmaModel(
    model.config, params, model.vocabulary, partitioner=model.partitioner
  )


def best_gamma(
  alpha: float, c: float, v: dict[int, float]
) -> tuple[int, float]:
  """The gamma (with v(gamma + 1) measured) of the best predicted speedup."""
  options = {
    k - 1: float(theory.walltime_improvement(alpha, k - 1, c, v[k]))
    for k in v
    if k >= 2
  }
  gamma = max(options, key=options.get)
  return gamma, options[gamma]


class SizeBench:
  """One target size's items (see the module doc).

  Attributes:
    out: `sections['sizes'][name]`: `config`, `target` and `draft` (their
      names; the target's defaults to `name`),
      `target_step_ms`, `c`, `v` {k: v(k)}, `step` {k: {ms, bound_ms,
      bound_share}}, `paper_table2`, `speedup` {alpha: row},
      `plain_seconds`.
  """

  def __init__(
    self,
    rec: Recorder,
    plan: Plan,
    predictor,
    name: str,
    get_target,
    draft,
    target_name: str | None = None,
    draft_name: str = 'T5 v1.1 small',
  ):
    """`get_target()` returns the (EOS-suppressed) target, `draft()` the
    draft network and its step seconds (both made on first use);
    `plan.targets[name]` and `plan.draft` are their configs."""
    self.rec, self.plan, self.predictor, self.name = rec, plan, predictor, name
    self.config = plan.targets[name]
    self.get_target, self.draft = get_target, draft
    self.times: dict[int, float] = {}
    self.plain: tuple[float, Any] | None = None
    self.out: dict[str, Any] = {
      'config': self.config.to_dict(),
      'target': target_name or name,
      'draft': draft_name,
      'v': {},
      'step': {},
      'speedup': {},
    }

  def save(self) -> None:
    self.rec.put('sizes', self.name, self.out)

  # -- v(k) ------------------------------------------------------------------
  def _bound(self) -> float | None:
    """The bound of one call at batch 1: the same for every k (a few
    tokens read the same weights and caches)."""
    if self.predictor.bandwidth is None:  # The smoke step was skipped.
      self.predictor.bandwidth = cost.device_bandwidth(
        self.plan.smoke_copy_bytes
      )
    return cost.bound_seconds(
      self.config,
      1,
      self.plan.step_length,
      16,
      self.predictor.bandwidth,
    )

  def step_item(self, k: int) -> Item:
    plan, p = self.plan, self.predictor
    calls = 16

    def predict():
      # The primed state's program compiles with the first k.
      units = cost.score_units(self.config) * (1 if self.times else 2)
      guess = 1 + 0.1 * (k - 1)
      return p.predict(units, (1 + plan.repeats) * calls * guess, self.config)

    def run(box):
      target = self.get_target()
      t0 = time.perf_counter()
      seconds = timing.step_times(
        target, (k,), plan.repeats, length=plan.step_length, calls=calls
      )[k]
      p.observe_compile(
        cost.score_units(self.config),
        time.perf_counter() - t0 - (1 + plan.repeats) * calls * seconds,
      )
      self.times[k] = seconds
      bound = self._bound()
      self.out['step'][str(k)] = {
        'ms': seconds * 1e3,
        'bound_ms': None if bound is None else bound * 1e3,
        'bound_share': None if bound is None else bound / seconds,
      }
      print(
        f'accel: {self.name} v({k}) step {seconds * 1e3:.3f} ms'
        + ('' if bound is None else f', bandwidth bound {bound * 1e3:.3f} ms'),
        flush=True,
      )
      if k == 1:
        self.out['target_step_ms'] = seconds * 1e3
        p.step[self.config] = seconds
      if 1 in self.times:
        for j, t in self.times.items():
          self.out['v'][str(j)] = t / self.times[1]
      self.save()

    return Item(self.name, f'v({k})', predict, run)

  def c_item(self) -> Item:
    def predict():
      draft_net, _ = self.draft()
      return self.predictor.predict(0, 1, draft_net.config)

    def run(box):
      if 1 not in self.times:
        raise Skip('needs v(1), not measured')
      _, draft_seconds = self.draft()
      self.out['draft_step_ms'] = draft_seconds * 1e3
      self.out['c'] = draft_seconds / self.times[1]
      self.save()

    return Item(self.name, 'c', predict, run)

  # -- speedups ----------------------------------------------------------------
  def _v(self) -> dict[int, float]:
    if 1 not in self.times or 'c' not in self.out:
      raise Skip('needs v(1) and c, not measured')
    return {k: t / self.times[1] for k, t in self.times.items()}

  def _decode_cost(self, gamma: int, plain: bool) -> float:
    plan, p = self.plan, self.predictor
    draft_cfg = plan.draft
    m = plan.max_decode_len
    units = cost.decode_units(self.config, draft_cfg, gamma)
    steps = (1 + plan.repeats) * m * (1 + gamma * 0.1)
    if plain:
      units += cost.decode_units(self.config)
      steps += (1 + plan.repeats) * m
    return p.predict(units, steps, self.config)

  def _plain(self):
    if self.plain is None:
      target, plan = self.get_target(), self.plan
      enc = inputs(1, self.config.vocab_size)
      m = plan.max_decode_len
      seconds, out, first = timed_compile(
        lambda: sd.generate(target, enc, max_decode_len=m),
        plan.repeats,
        self.predictor,
        cost.decode_units(self.config),
      )
      self.plain = (seconds, out)
      self.out['plain_seconds'] = seconds
      self.out['plain_compile_seconds'] = first - seconds
      self.save()
    return self.plain

  def _speedup(self, alpha: float, gamma: int) -> dict[str, Any]:
    target, plan = self.get_target(), self.plan
    v, c = self._v(), self.out['c']
    if gamma + 1 not in v:
      raise Skip(f'needs v({gamma + 1}), not measured')
    plain_s, plain = self._plain()
    draft_net, _ = self.draft()
    enc = inputs(1, self.config.vocab_size)
    # The plain output is the reference: positions past it are past
    # max_decode_len, where proposals are never used.
    draft = speed.controlled_draft(draft_net, plain.tokens, alpha)
    spec_s, spec, _ = timed_compile(
      lambda: sd.generate(
        target,
        enc,
        draft=draft,
        gamma=gamma,
        max_decode_len=plan.max_decode_len,
      ),
      plan.repeats,
      self.predictor,
      cost.decode_units(self.config, plan.draft, gamma),
    )
    a_hat = spec.stats.alpha
    return {
      'gamma': gamma,
      'alpha_measured': a_hat,
      'plain_seconds': plain_s,
      'spec_seconds': spec_s,
      'measured': plain_s / spec_s,
      'predicted': float(
        theory.walltime_improvement(a_hat, gamma, c, v[gamma + 1])
      ),
      'predicted_v1': float(theory.walltime_improvement(a_hat, gamma, c)),
      'tokens_per_call': spec.stats.tokens_per_call,
      'same_as_plain': bool(np.array_equal(spec.tokens, plain.tokens)),
    }

  def table2_item(self) -> Item:
    """The paper's Table 2 setting at the plan's core alpha and gamma."""
    plan = self.plan

    def run(box):
      alpha, gamma = plan.core_alpha, plan.core_gamma
      row = self._speedup(alpha, gamma)
      v = self._v()
      row['predicted_at_alpha'] = float(
        theory.walltime_improvement(alpha, gamma, self.out['c'], v[gamma + 1])
      )
      row.update(
        alpha=alpha,
        paper_expected=PAPER['expected'],
        paper_measured=PAPER['measured'],
        paper_c=PAPER['c'],
        paper_setting=(alpha, gamma) == (PAPER['alpha'], PAPER['gamma']),
      )
      self.out['paper_table2'] = row
      self.out['speedup'][str(alpha)] = row
      self.save()

    return Item(
      self.name,
      f'alpha {plan.core_alpha} gamma {plan.core_gamma}',
      lambda: self._decode_cost(plan.core_gamma, self.plain is None),
      run,
    )

  def alpha_item(self, alpha: float) -> Item:
    """Controlled acceptance `alpha` at the gamma Theorem 3.8 says is best
    from the measured c and v."""

    def gamma():
      v = self._v()
      if max(v) < 2:
        raise Skip('needs v(k) for some k >= 2, none measured')
      return best_gamma(alpha, self.out['c'], v)

    def run(box):
      g, predicted = gamma()
      row = self._speedup(alpha, g)
      row['predicted_at_alpha'] = predicted
      self.out['speedup'][str(alpha)] = row
      self.save()

    def predict():
      self._v()
      return self._decode_cost(gamma()[0], self.plain is None)

    return Item(self.name, f'alpha {alpha}', predict, run)

  def items(self, ks, alphas, core: bool) -> list[Item]:
    """v(k) for `ks`, then (core) c and the Table 2 setting, then `alphas`."""
    out = [self.step_item(k) for k in ks]
    if core:
      out += [self.c_item(), self.table2_item()]
    return out + [self.alpha_item(a) for a in alphas]

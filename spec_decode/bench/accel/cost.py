"""What an item of the accelerator bench will cost, and what a step must.

Two models, both written down so the run can be judged against them:

* `Predictor`: seconds an item will take, compilation included, from the
  sizes and from what the run has measured so far. Compilation dominates on
  a GPU (a T5-XXL step runs in milliseconds; its program compiles in tens
  of seconds), and XLA's compile time grows with the layers a program
  traces, whatever their width. So a program costs `units` (the decoder
  and encoder layers it traces, draft steps unrolled) times a rate in
  seconds per unit, which every measured compile updates; running costs
  target steps times the measured step time.
* `step_bytes` / `bound_seconds`: the memory-bandwidth bound of one decoder
  call, the bytes it must read (the decoder's weights that a step
  multiplies, the vocabulary projection, the self- and cross-attention
  caches) over the device's bandwidth. At batch 1 a decoder step is bound
  by memory, so the measured step over this bound says how close to the
  hardware the decode runs.
"""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.t5gemma.cache import ring_size
from spec_decode.t5gemma.config import T5GemmaConfig

# Nominal HBM bandwidth in bytes/s by device kind (vendor data sheets),
# matched by substring of `jax.devices()[0].device_kind`, most specific
# first. Unknown kinds fall back to the bandwidth the smoke step measures.
_BANDWIDTH = (
  ('H200', 4.8e12),
  ('H100 NVL', 3.9e12),
  ('H100 PCIe', 2.0e12),
  ('H100', 3.35e12),  # SXM, 80 GB HBM3.
  ('A100-SXM4-80GB', 2.039e12),
  ('A100-SXM4-40GB', 1.555e12),
  ('A100', 1.935e12),
  ('L4', 0.3e12),
  ('TPU v4', 1.2e12),
  ('TPU v5 lite', 0.819e12),
  ('TPU v5e', 0.819e12),
  ('TPU v5p', 2.765e12),
  ('TPU v5', 2.765e12),
  ('TPU v6', 1.64e12),
)


def nominal_bandwidth(device_kind: str) -> float | None:
  """Bytes/s of `device_kind`'s memory (data sheet), None if unknown."""
  for name, bandwidth in _BANDWIDTH:
    if name.lower() in device_kind.lower():
      return bandwidth
  return None


def copy_bandwidth(num_bytes: int, repeats: int = 5) -> float:
  """Bytes/s of a device copy (bytes read plus bytes written)."""
  x = jnp.ones((num_bytes // 2,), jnp.bfloat16)
  f = jax.jit(lambda a: a * 2)
  jax.block_until_ready(f(x))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(x))
    times.append(time.perf_counter() - t0)
  del x
  return 2 * num_bytes / float(np.median(times))


def device_bandwidth(copy_bytes: int) -> float:
  """The data sheet's bandwidth of this device, else a measured copy's."""
  kind = jax.devices()[0].device_kind
  return nominal_bandwidth(kind) or copy_bandwidth(copy_bytes)


def layers(config) -> tuple[int, int]:
  """(encoder layers, decoder layers) of a `T5Config` or `T5GemmaConfig`."""
  if isinstance(config, T5GemmaConfig):
    return config.encoder.num_layers, config.decoder.num_layers
  return config.num_encoder_layers, config.num_decoder_layers


def step_bytes(config, batch: int, length: int, encoder_length: int) -> int:
  """Bytes one decoder call over a few tokens must read.

  Args:
    config: the `T5Config` or `T5GemmaConfig`.
    batch: rows.
    length: self-attention positions the call attends to (cache length).
    encoder_length: encoder positions (cross-attention keys and values).

  The cross-attention keys and values are computed once per decode
  (`prepare_decoder`), so their projection weights are not read per step.
  """
  if isinstance(config, T5GemmaConfig):
    return _t5gemma_step_bytes(config, batch, length, encoder_length)
  d, f = config.emb_dim, config.mlp_dim
  inner = config.num_heads * config.head_dim
  per_layer = (
    4 * d * inner  # self-attention q, k, v, o
    + 2 * d * inner  # cross-attention q, o
    + (len(config.mlp_activations) + 1) * d * f
  )
  weights = config.num_decoder_layers * per_layer + config.vocab_size * d
  cache = (
    2 * config.num_decoder_layers * batch * (length + encoder_length) * inner
  )
  return weights * config.param_dtype.itemsize + cache * config.dtype.itemsize


def _t5gemma_step_bytes(config, batch, length, encoder_length) -> int:
  """`step_bytes` of a T5Gemma decoder: grouped-query projections (K
  key/value heads), version 1's cross-attention query and output (version
  2's merged attention reuses the self-attention's), GeGLU's three
  matrices, the tied head; a sliding layer reads its ring
  (`t5gemma.cache.ring_size`), a global layer the whole cache."""
  dec = config.decoder
  d, q = dec.emb_dim, dec.num_heads * dec.head_dim
  kv = dec.num_kv_heads * dec.head_dim
  per_layer = 2 * d * q + 2 * d * kv + 3 * d * dec.mlp_dim
  if not config.merged_attention:
    per_layer += 2 * d * q
  weights = dec.num_layers * per_layer + config.vocab_size * d
  entries = sum(
    ring_size(dec, t, length, config.ring_margin) + encoder_length
    for t in dec.layer_types
  )
  cache = 2 * batch * entries * kv
  return weights * config.param_dtype.itemsize + cache * config.dtype.itemsize


def bound_seconds(config, batch, length, encoder_length, bandwidth):
  """`step_bytes` over `bandwidth` (bytes/s): the fastest a step can run."""
  if not bandwidth:
    return None
  return step_bytes(config, batch, length, encoder_length) / bandwidth


def score_units(config) -> int:
  """Compile units of a program of one decoder call (embed and logits: 1)."""
  return layers(config)[1] + 1


def decode_units(target, draft=None, gamma: int = 0, calls: int = 1) -> int:
  """Compile units of a decode: the encoders, `calls` target calls (one per
  gamma the program holds), and gamma + 1 unrolled draft steps."""
  units = layers(target)[0] + calls * score_units(target)
  if draft is not None:
    units += layers(draft)[0] + (gamma + 1) * score_units(draft)
  return units


@dataclasses.dataclass
class Predictor:
  """Seconds an item will take, from the sizes and the run's measurements.

  Attributes:
    rate: seconds of compilation per unit (`score_units`): the prior until
      a real-size program is measured, then the largest rate measured (an
      item whose compile runs long shortens the plan, never lengthens it).
    step: config -> measured seconds of one decoder call at batch 1.
    bandwidth: bytes/s, for a step not yet measured (3x its bound).
    margin: predictions are multiplied by this.
    measured: (units, seconds) of every compile measured.
  """

  rate: float = 1.0
  step: dict = dataclasses.field(default_factory=dict)
  bandwidth: float | None = None
  margin: float = 1.3
  measured: list = dataclasses.field(default_factory=list)
  _calibrated: bool = False

  def observe_compile(self, units: int, seconds: float) -> None:
    """A program of `units` compiled in `seconds` (first call less a
    steady one)."""
    self.measured.append((units, seconds))
    rate = max(seconds, 0.0) / max(units, 1)
    self.rate = max(self.rate, rate) if self._calibrated else rate
    self._calibrated = True

  def step_seconds(self, config) -> float:
    if config in self.step:
      return self.step[config]
    bound = bound_seconds(config, 1, 128, 24, self.bandwidth)
    # Unmeasured: three times the bound, plus launch overheads per layer.
    return 3 * (bound or 0.0) + 2e-4 * layers(config)[1]

  def compile(self, units: int) -> float:
    return self.rate * units

  def predict(self, compile_units: int, steps: float, config) -> float:
    """Seconds: `compile_units` to compile, `steps` target steps of
    `config` to run (times `margin`)."""
    run = steps * self.step_seconds(config)
    return self.margin * (self.compile(compile_units) + run)

"""What `spec-decode bench accel` measures, in what order, within what time.

The models are T5 v1.1 at the sizes of our gin files (`gin/models/t5_1_1/`,
T5X's own sizes) with random weights, bfloat16 weights and activations and
float32 logits (as T5X runs them on an accelerator), the CPU kernel off.
The draft is T5 v1.1 small. `TINY` is the same plan at toy sizes, for the
CPU rehearsal that `make test` runs.

Every item runs inside a time box (`Deadline`): an item whose predicted
duration no longer fits is skipped and recorded as skipped, so a slow size
costs that size's box, never the sections after it. XXL comes first among
the targets: it is the size the paper's numbers are about.
"""

import dataclasses
import time

from spec_decode.t5.config import T5Config

SIZES = ('xxl', 'small', 'base', 'large', 'xl')
# v(k) at these k first (then the rest up to 16): what the speedup
# prediction and gamma choice read most.
K_ORDER = (1, 2, 4, 8, 16, 3, 5, 6, 12, 7, 10, 14, 9, 11, 13, 15)
ALPHAS = (0.5, 0.7, 0.8, 0.9)


@dataclasses.dataclass(frozen=True)
class Plan:
  """One run's sizes and time boxes (seconds).

  Attributes:
    targets: size name -> target config (bf16), measured in this order.
    draft: the draft config (T5 v1.1 small, bf16).
    max_decode_len: output tokens per decode.
    repeats: timed repeats (medians).
    ks: v(k) token counts, most needed first.
    alphas: controlled acceptance rates.
    batches: the XXL/small batch sizes (plain vs auto vs best fixed gamma).
    batch_alpha: the controlled acceptance of the batch section.
    fixed_gammas: the fixed gammas the batch section tries.
    tree_nodes: tree sizes whose scoring cost v(n) is measured.
    tree_alpha: the controlled acceptance of trees vs chains.
    tree_budgets: node budgets of trees vs chains (same target positions).
    beams: beam count of speculative vs plain beam search.
    beam_gamma: draft tree depth of speculative beam search.
    identity_rows: decodes compared token for token, per dtype.
    identity_batch: rows per decode call of the identity check.
    identity_gamma: gamma of the identity check's speculative decodes.
    budget: seconds for the whole run.
    boxes: section (or size) name -> its share of the budget.
  """

  targets: dict
  draft: T5Config
  max_decode_len: int = 64
  repeats: int = 3
  ks: tuple = K_ORDER
  alphas: tuple = ALPHAS
  batches: tuple = (1, 8, 32, 64)
  batch_alpha: float = 0.8
  fixed_gammas: tuple = (2, 4, 8)
  tree_nodes: tuple = (1, 2, 4, 8, 16, 32, 64)
  tree_alpha: float = 0.7
  tree_budgets: tuple = (4, 8, 16)
  beams: int = 4
  beam_gamma: int = 3
  identity_rows: int = 256
  identity_batch: int = 64
  identity_gamma: int = 4
  budget: float = 420.0
  boxes: dict = dataclasses.field(default_factory=dict)


def _bf16(config: T5Config) -> T5Config:
  return config.replace(
    dtype='bfloat16',
    param_dtype='bfloat16',
    dropout_rate=0.0,
    cpu_kernel=False,
  )


def t5_1_1(size: str) -> T5Config:
  """T5 v1.1 `size` (`gin/models/t5_1_1/<size>.gin`), bf16, kernel off."""
  return _bf16(T5Config.from_gin(f'models/t5_1_1/{size}.gin'))


# Shares of the budget (they sum to 1): the identity check and XXL first.
FULL_BOXES = {
  'identity_bfloat16': 0.12,
  'xxl': 0.26,
  'batching': 0.14,
  'trees': 0.09,
  'beam': 0.09,
  'identity_float32': 0.10,
  'small': 0.04,
  'base': 0.04,
  'large': 0.06,
  'xl': 0.06,
}


def full(budget: float = 420.0) -> Plan:
  """The real sizes (XXL: 11B parameters, 22 GB in bfloat16)."""
  return Plan(
    targets={s: t5_1_1(s) for s in SIZES},
    draft=t5_1_1('small'),
    budget=budget,
    boxes=dict(FULL_BOXES),
  )


def _toy(layers: int, emb: int) -> T5Config:
  return _bf16(
    T5Config(
      vocab_size=512,
      emb_dim=emb,
      num_heads=2,
      head_dim=16,
      mlp_dim=2 * emb,
      num_encoder_layers=1,
      num_decoder_layers=layers,
      mlp_activations=('gelu', 'linear'),
    )
  )


def tiny(budget: float = 600.0) -> Plan:
  """Every section at toy sizes: the CPU rehearsal (`--tiny`).

  Its budget is large enough that nothing is skipped (the rehearsal runs
  every code path once); its items are few, so that it takes about a
  minute of mostly compiling on a 2-core CPU.
  """
  return Plan(
    # The draft and the small target share shapes: one compile serves both.
    targets={'xxl': _toy(2, 64), 'small': _toy(1, 32)},
    draft=_toy(1, 32),
    max_decode_len=8,
    repeats=1,
    ks=(1, 3),
    alphas=(0.8,),
    batches=(2,),
    fixed_gammas=(2,),
    tree_nodes=(2,),
    tree_budgets=(2,),
    beams=2,
    beam_gamma=2,
    identity_rows=8,
    identity_batch=4,
    identity_gamma=2,
    budget=budget,
    boxes={
      'identity_bfloat16': 0.15,
      'xxl': 0.25,
      'batching': 0.15,
      'trees': 0.1,
      'beam': 0.1,
      'identity_float32': 0.1,
      'small': 0.15,
    },
  )


class Deadline:
  """A time box: seconds left, and whether a step of a given length fits."""

  def __init__(self, seconds: float, parent: 'Deadline | None' = None):
    self.end = time.monotonic() + seconds
    if parent is not None:
      self.end = min(self.end, parent.end)

  def left(self) -> float:
    return max(self.end - time.monotonic(), 0.0)

  def fits(self, seconds: float) -> bool:
    return seconds <= self.left()

  def box(self, seconds: float) -> 'Deadline':
    """A box of `seconds` inside this one."""
    return Deadline(seconds, parent=self)

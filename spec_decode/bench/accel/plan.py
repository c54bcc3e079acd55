"""What `spec-decode bench accel` measures, in what order, within what time.

The models are T5 v1.1 at the sizes of our gin files (`gin/models/t5_1_1/`,
T5X's own sizes) with random weights, bfloat16 weights and activations and
float32 logits (as T5X runs them on an accelerator), the CPU kernel off.
The draft is T5 v1.1 small. After every T5 section, a T5Gemma pair
(the 9B-2B target, the S-S draft, random weights) gets the same core.
`tiny` is the same plan at toy sizes, for the CPU rehearsal that `make
test` runs.

Every item predicts its own cost (`cost.Predictor`) and runs only if that
fits its time box (`Deadline`); one that would not is skipped and recorded
with the reason, so a slow item costs its own box, never the items after
it. The XXL core comes first: it is what the paper's numbers are about.
"""

import dataclasses
import time

from spec_decode.t5.config import T5Config
from spec_decode.t5gemma import config as t5gemma_lib
from spec_decode.t5gemma.config import T5GemmaConfig

SIZES = ('xxl', 'small', 'base', 'large', 'xl')
# The T5Gemma section's pair (`full`): T5Gemma 9B-2B as the target
# (gin/models/t5gemma/9b_2b.gin), S-S as the draft (s_s.gin). Memory: 9B-2B
# has 12.29B parameters, 22.9 GiB in bfloat16 (a 9B encoder, 42 layers 3584
# wide; a 2B decoder, 26 layers 2304 wide; two 256k-row embeddings), S-S
# 0.31B (0.58 GiB): with one row's caches, under a third of an H100's
# 78 GiB, leaving XLA its workspace; the T5 target of the sections before
# is freed first (`run.Models`: one large target at a time). Of the
# published targets it has the largest encoder on a 2B decoder (what a
# target step reads: the 2B-2B's step with the 9B's cross keys).
T5GEMMA_NAMES = ('T5Gemma 9B-2B', 'T5Gemma S-S')


@dataclasses.dataclass(frozen=True)
class Plan:
  """One run's sizes, items and time shares.

  The XXL core comes first (`run.py`): the plain step, v(k) at `core_ks`,
  c, the controlled-acceptance speedup at `core_alpha` and `core_gamma`
  (the paper's Table 2 setting) next to Theorem 3.8, and the bfloat16
  identity check. The rest follows, each section in its share (`boxes`) of
  what the core left.

  Attributes:
    targets: size name -> target config (bf16), measured in this order.
    draft: the draft config (T5 v1.1 small, bf16).
    max_decode_len: output tokens per decode.
    repeats: timed repeats (medians).
    core_ks: v(k) token counts of the core, most needed first.
    more_ks: further v(k) (the alpha sweep's gamma choice reads them).
    core_alpha: the core's controlled acceptance (Table 2: 0.75).
    core_gamma: the core's gamma (Table 2: 7; needs v(core_gamma + 1)).
    alphas: further controlled acceptance rates (gamma by Theorem 3.8).
    batches: the XXL/small batch sizes (plain vs auto vs best fixed gamma).
    batch_alpha: the controlled acceptance of the batch section.
    fixed_gammas: the fixed gammas the batch section tries.
    tree_nodes: tree sizes whose scoring cost v_tree(n) is measured.
    tree_alpha: the controlled acceptance of trees vs chains.
    tree_budgets: node budgets of trees vs chains (same target positions).
    beams: beam count of speculative vs plain beam search.
    beam_gamma: draft tree depth of speculative beam search.
    beam_alphas: controlled acceptance rates of the beam section.
    identity_rows: decodes compared token for token, per dtype.
    identity_batch: rows per decode call of the identity check.
    identity_gamma: gamma of the identity check's speculative decodes.
    smoke_copy_bytes: the array the smoke step copies to measure bandwidth.
    t5gemma_target: the T5Gemma section's target config (bf16), or None
      (no section).
    t5gemma_draft: its draft config (bf16).
    t5gemma_names: (target, draft) names, for the tables.
    compile_rate: the prior seconds of compilation per layer traced
      (`cost.Predictor`) until a real-size program is measured. The full
      plan's 0.5 is above what the first H100 runs measured for T5-small's
      step-timing programs: 0.31 s per layer with XLA's autotuning, 0.23
      without (docs/accelerator.md, Results).
    budget: seconds for the whole run.
    boxes: section name -> its share of what the core leaves.
  """

  targets: dict
  draft: T5Config
  max_decode_len: int = 64
  repeats: int = 3
  core_ks: tuple = (1, 8, 2, 4, 16)
  more_ks: tuple = (3, 5, 6, 12)
  core_alpha: float = 0.75
  core_gamma: int = 7
  alphas: tuple = (0.5, 0.9)
  batches: tuple = (1, 8, 32, 64)
  batch_alpha: float = 0.8
  fixed_gammas: tuple = (2, 4, 8)
  tree_nodes: tuple = (1, 2, 4, 8, 16, 32, 64)
  tree_alpha: float = 0.7
  tree_budgets: tuple = (4, 8, 16)
  beams: int = 4
  beam_gamma: int = 3
  beam_alphas: tuple = (0.7, 0.9)
  identity_rows: int = 256
  identity_batch: int = 64
  identity_gamma: int = 4
  smoke_copy_bytes: int = 2**31
  t5gemma_target: T5GemmaConfig | None = None
  t5gemma_draft: T5GemmaConfig | None = None
  t5gemma_names: tuple = T5GEMMA_NAMES
  compile_rate: float = 0.5
  budget: float = 360.0
  boxes: dict = dataclasses.field(default_factory=dict)

  @property
  def step_length(self) -> int:
    """Cache length of every v(k) timing (one primed state per model)."""
    return 16 + max(self.core_ks + self.more_ks) + 2


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


def toy_depth(config, layers: int = 1):
  """`config` at its real widths with `layers` encoder and decoder layers
  (a T5Gemma stack: its first `layers` layer types): built (abstractly) by
  the rehearsal, so a shape bug at the real widths shows on the CPU."""
  if isinstance(config, T5GemmaConfig):

    def cut(stack):
      return dataclasses.replace(
        stack, num_layers=layers, layer_types=stack.layer_types[:layers]
      )

    return config.replace(
      encoder=cut(config.encoder), decoder=cut(config.decoder)
    )
  return config.replace(num_encoder_layers=layers, num_decoder_layers=layers)


def t5gemma_size(
  num_layers: int,
  emb_dim: int,
  mlp_dim: int,
  num_heads: int,
  num_kv_heads: int,
  head_dim: int = 256,
  encoder: dict | None = None,
) -> T5GemmaConfig:
  """A published T5Gemma size, bf16 (the CPU's blocked sums off, as the T5
  configs' kernel). The values `gin/models/t5gemma/base.gin` gives every
  size (the bench reads no gin: gin is the command lines'); the size's own
  (`encoder`: the encoder's where it differs) as its size file gives them.
  tests/bench/test_accel.py checks the result equals the size file's."""

  def stack(**size):
    return t5gemma_lib.pattern_stack(
      2,
      sliding_window=4096,
      attn_logit_softcap=50.0,
      query_pre_attn_scalar=float(size['head_dim']),
      rms_eps=1e-6,
      **size,
    )

  size = dict(
    num_layers=num_layers,
    emb_dim=emb_dim,
    mlp_dim=mlp_dim,
    num_heads=num_heads,
    num_kv_heads=num_kv_heads,
    head_dim=head_dim,
  )
  return T5GemmaConfig(
    version=1,
    vocab_size=256_000,
    encoder=stack(**{**size, **(encoder or {})}),
    decoder=stack(**size),
    final_logit_softcap=30.0,
    tie_head=True,
    dtype='bfloat16',
    param_dtype='bfloat16',
    cpu_sum_block=0,
  )


def t5gemma_pair(plan: Plan) -> Plan:
  """`plan` with the T5Gemma pair as its one target (`'t5gemma'`) and its
  draft: what the T5 sections' code measures for the T5Gemma section."""
  return dataclasses.replace(
    plan,
    targets={'t5gemma': plan.t5gemma_target},
    draft=plan.t5gemma_draft,
  )


# Shares of what the core leaves (they sum to 1).
FULL_BOXES = {
  'xxl_more': 0.12,
  'f32_attention': 0.06,
  'batching': 0.12,
  'trees': 0.14,
  'beam': 0.12,
  'identity_float32': 0.12,
  'small': 0.06,
  'base': 0.06,
  'large': 0.08,
  'xl': 0.08,
  # Last: it gets whatever the sections before it leave, so its share only
  # sets how much it takes from their boxes (little: it comes last).
  't5gemma': 0.04,
}


def full(budget: float = 360.0) -> Plan:
  """The real sizes (XXL: 11B parameters, 22 GB in bfloat16)."""
  nine_b = dict(
    num_layers=42, emb_dim=3584, mlp_dim=14336, num_heads=16, num_kv_heads=8
  )
  return Plan(
    targets={s: t5_1_1(s) for s in SIZES},
    draft=t5_1_1('small'),
    # 9B-2B: a Gemma 2 9B encoder, a Gemma 2 2B decoder.
    t5gemma_target=t5gemma_size(26, 2304, 9216, 8, 4, encoder=nine_b),
    # S-S: T5 Small's shape, heads of 64.
    t5gemma_draft=t5gemma_size(8, 512, 1024, 8, 8, head_dim=64),
    t5gemma_names=T5GEMMA_NAMES,
    budget=budget,
    boxes=dict(FULL_BOXES),
  )


def toy(layers: int, emb: int) -> T5Config:
  """A toy T5 v1.1 (vocabulary 512, 2 heads of 16), bf16."""
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


def toy_t5gemma(layers: int, emb: int) -> T5GemmaConfig:
  """A toy T5Gemma (vocabulary 512, 4 query heads on 2 key/value heads of
  16, every other layer global, window 4: it slides within the rehearsal's
  outputs), bf16."""
  stack = t5gemma_lib.pattern_stack(
    2,
    num_layers=layers,
    emb_dim=emb,
    mlp_dim=2 * emb,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    sliding_window=4,
    query_pre_attn_scalar=16.0,
    attn_logit_softcap=50.0,
  )
  return T5GemmaConfig(
    version=1,
    vocab_size=512,
    encoder=dataclasses.replace(stack, num_layers=1, layer_types=('sliding',)),
    decoder=stack,
    final_logit_softcap=30.0,
    # The v(k) timings prime their state with one call of 16 tokens
    # (`policy.timing.primed_state`): the most slots one call writes.
    ring_margin=16,
    dtype='bfloat16',
    param_dtype='bfloat16',
    cpu_sum_block=0,
  )


def tiny(budget: float = 1200.0) -> Plan:
  """Every section at toy sizes: the CPU rehearsal (`--tiny`).

  Its default budget is large enough that nothing is skipped (the
  rehearsal runs every code path once); its items are few, so that it takes
  about a minute of mostly compiling on a 2-core CPU. A short `--budget`
  rehearses the plan itself: the core first, the rest skipped with reasons.
  """
  return Plan(
    # The draft and the small target share shapes: one compile serves both.
    targets={'xxl': toy(2, 64), 'small': toy(1, 32)},
    draft=toy(1, 32),
    max_decode_len=8,
    repeats=1,
    core_ks=(1, 3, 2),
    more_ks=(),
    core_alpha=0.75,
    core_gamma=2,
    alphas=(0.9,),
    batches=(2,),
    fixed_gammas=(2,),
    tree_nodes=(2,),
    tree_budgets=(2,),
    beams=2,
    beam_gamma=2,
    beam_alphas=(0.8,),
    identity_rows=8,
    identity_batch=4,
    identity_gamma=2,
    smoke_copy_bytes=2**24,
    # As T5's: one shape for both, so the draft's programs serve the target.
    t5gemma_target=toy_t5gemma(2, 32),
    t5gemma_draft=toy_t5gemma(2, 32),
    t5gemma_names=('T5Gemma toy', 'T5Gemma toy'),
    compile_rate=0.2,
    budget=budget,
    boxes={
      'xxl_more': 0.1,
      'f32_attention': 0.05,
      'batching': 0.2,
      'trees': 0.15,
      'beam': 0.15,
      'identity_float32': 0.15,
      'small': 0.15,
      't5gemma': 0.05,
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

"""Standardized sampling (paper section 2.2): logits -> probability vector.

Argmax, temperature, top-k and top-p are each a map from logits to a
distribution. Draft and target use the same map, and the `q` that enters the
acceptance test is exactly the distribution the draft token was drawn from,
which is what keeps speculative sampling exact for every setting. The
truncation rules (ties at a top-k or top-p cut are all kept) are T5X's.
"""

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclasses.dataclass(frozen=True)
class Sampler:
  """Logits -> probabilities, applied as temperature, then top-k, then top-p.

  The rules are T5X's (`t5x/decoding.py` `temperature_sample` with
  `binary_search.topk_mask` and `topp_mask`), which transformers' top-k
  shares; ties at a cut are all kept, so more than k ids can survive:

  - temperature t > 0 divides the logits by t.
  - top-k keeps every id whose scaled logit is >= the k-th largest scaled
    logit (duplicates counted): for logits [3, 1, 2, 2, 0] and k = 2 the
    k-th largest is 2 and ids {0, 2, 3} are kept.
  - top-p takes the softmax of the surviving logits and keeps every id
    with probability >= c, where c is the largest threshold whose ids
    {x : probs[x] >= c} have total mass >= p: the smallest such
    "probability above a threshold" set, every id tied at the boundary
    included. With both set (T5X allows one at a time), top-p measures
    mass within the top-k survivors.
  - The result is the softmax of the kept logits; every other id has
    probability exactly 0.

  Attributes:
    temperature: 0 means argmax (one-hot on the first maximal id; top-k and
      top-p are then ignored, as in T5X).
    top_k: keep the ids tied with or above the k-th largest logit; 0 = all.
    top_p: keep the ids with probability >= the threshold c above; 1.0 =
      all.

  Both thresholds are found by `largest_key`, a 32-step bitwise search
  over the float32 order (T5X's method; no sort).
  """

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    validate(self.temperature, self.top_k, self.top_p)
    object.__setattr__(self, 'temperature', float(self.temperature))
    object.__setattr__(self, 'top_k', int(self.top_k))
    object.__setattr__(self, 'top_p', float(self.top_p))

  @property
  def is_greedy(self) -> bool:
    return self.temperature == 0.0

  def probs(self, logits: jax.Array) -> jax.Array:
    """`logits [..., V]` -> float32 probabilities `[..., V]` summing to 1."""
    logits = logits.astype(jnp.float32)
    if self.is_greedy:
      return jax.nn.one_hot(argmax(logits), logits.shape[-1], dtype=jnp.float32)
    scaled = logits / self.temperature
    if 0 < self.top_k < scaled.shape[-1]:
      keys = order_keys(scaled)
      kth = largest_key(
        keys, lambda c: jnp.sum(keys >= c, -1, keepdims=True) >= self.top_k
      )
      scaled = jnp.where(keys >= kth, scaled, -jnp.inf)
    probs = jax.nn.softmax(scaled, axis=-1)
    if self.top_p < 1.0:
      keys = order_keys(probs)
      cut = largest_key(
        keys,
        lambda c: (
          jnp.sum(jnp.where(keys >= c, probs, 0.0), -1, keepdims=True)
          >= self.top_p
        ),
      )
      probs = jax.nn.softmax(jnp.where(keys >= cut, scaled, -jnp.inf), -1)
    return probs

  def draw(self, key: jax.Array, probs: jax.Array) -> jax.Array:
    """Draws from `probs` made by this sampler: argmax when greedy.

    A one-hot draw needs no randomness, and skipping the V Gumbel draws
    matters on CPU (about 1 ms per draw for V = 32128).
    """
    if self.is_greedy:
      return argmax(probs)
    return sample(key, probs)


def order_keys(x: jax.Array) -> jax.Array:
  """uint32 keys with the order of the float32 values `x` (-0.0 = 0.0).

  Non-negative floats order like their bit patterns; negative ones in
  reverse, so their magnitude bits are flipped; the sign bit is then
  flipped so that every negative key is below every non-negative one.
  """
  x = jnp.where(x == 0, 0.0, x.astype(jnp.float32))
  bits = lax.bitcast_convert_type(x, jnp.int32)
  bits = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)
  return lax.bitcast_convert_type(bits, jnp.uint32) ^ jnp.uint32(1 << 31)


def largest_key(keys: jax.Array, enough) -> jax.Array:
  """The largest uint32 c `[..., 1]` per row with `enough(c)` true.

  `enough(c [..., 1]) -> bool [..., 1]` must be monotone (true up to some
  c, false above). Built bit by bit from the top, as T5X's binary search
  does: 32 passes over the row and no sort, which on CPU is about 35x
  faster than sorting V = 32128 ids. 0 when only c = 0 qualifies.
  """

  def set_bit(i, c):
    trial = c | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
    return jnp.where(enough(trial), trial, c)

  start = jnp.zeros(keys.shape[:-1] + (1,), jnp.uint32)
  return lax.fori_loop(0, 32, set_bit, start)


def argmax(x: jax.Array) -> jax.Array:
  """`jnp.argmax(x, axis=-1)` as int32, faster on CPU for a long last axis.

  The same ids (the first maximal one; the first NaN if there is one),
  from a max and a min over the ids where `x` attains it: XLA:CPU runs the
  variadic (value, index) reduction `jnp.argmax` lowers to about 6x slower
  (130 vs 22 us for V = 32128), once per draft step and per verification.
  """
  top = jnp.max(x, axis=-1, keepdims=True)
  ids = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  hit = (x == top) | jnp.isnan(x)
  return jnp.min(jnp.where(hit, ids, x.shape[-1]), axis=-1)


LEVELS = 3


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one id per row of `probs [..., V]`: `invert_nested`, LEVELS deep.

  Exact: id x is drawn with probability probs[x] / sum(probs) up to
  float32 rounding, and only ids with probs > 0 (0 for a row with none).
  A few uniforms and short cumulative sums cost far less than
  `jax.random.categorical` (a Gumbel draw per id, about 30x slower at
  V = 4096 on this CPU than one cumulative sum, which costs more than the
  nested sums), and the loops draw several times per iteration.

  Why nested and not one inverse CDF over all V ids: the draw must not
  hinge on float32 noise. Logits of the same row differ by ~1e-6 between
  batch shapes and meshes (other summation orders), and in one cumulative
  sum a perturbed id moves the interval of every id after it; an id whose
  interval is narrower than that shift (most of a vocabulary at t = 1)
  flips the draw when u lands near it. Measured on the demo pair's logits
  (64 rows computed as one batch and as 8 batches of 8, V = 4096), the
  exact chance that one draw differs was 1.1e-4 with one cumulative sum,
  4.8e-6 with two levels and 1.7e-6 with three; a Gumbel-max draw, 0 in
  102,400. Each level draws its own uniform: rescaling one uniform into
  the chosen block would lay out the same intervals as one sum does.
  """
  shape = probs.shape[:-1]
  u = jax.random.uniform(key, shape + (LEVELS,), dtype=jnp.float32)
  return invert_nested(u, probs)


def invert_nested(u: jax.Array, probs: jax.Array) -> jax.Array:
  """The id `[...]` of `probs [..., V]` selected by uniforms `u [..., L]`.

  The ids, padded with zero-probability ids to b**L (b the smallest base
  with b**L >= V), form a tree with b children per node: level l picks a
  child by `invert_cdf` of the children's masses with `u[..., l]`, so an
  id x is reached with probability probs[x] / total (each level is a
  conditional draw and the uniforms are independent). Every level keeps
  `invert_cdf`'s rules: a child with zero mass holds no positive id and
  is never picked, and a row with no positive entry gives 0.

  A perturbed mass now moves at most b boundaries per level (L * b in
  all, 96 at V = 32128 with L = 3) instead of every boundary after it.
  """
  levels = u.shape[-1]
  vocab = probs.shape[-1]
  base = 1
  while base**levels < vocab:
    base += 1
  probs = probs.astype(jnp.float32)
  pad = [(0, 0)] * (probs.ndim - 1) + [(0, base**levels - vocab)]
  node = jnp.pad(probs, pad)
  chosen = jnp.zeros(probs.shape[:-1], jnp.int32)
  for level in range(levels):
    children = node.reshape(node.shape[:-1] + (base, -1))
    pick = invert_cdf(u[..., level], jnp.sum(children, axis=-1))
    chosen = chosen * base + pick
    node = jnp.take_along_axis(children, pick[..., None, None], axis=-2)[
      ..., 0, :
    ]
  return chosen


def invert_cdf(
  u: jax.Array, probs: jax.Array, cdf: jax.Array | None = None
) -> jax.Array:
  """The id `[...]` of `probs [..., V]` that the uniform `u [...]` selects.

  Only ids with `probs > 0` can be returned: the first such id x with
  `cdf[x] > u * cdf[-1]`, or the last such id when none qualifies (u * total
  rounded up to the total); 0 for a row with no positive entry. Id x is then
  drawn with probability (cdf[x] - cdf[previous positive id]) / cdf[-1],
  i.e. probs[x] / total up to float32 rounding.

  Why not "the first i with cdf[i] > u * total" over all ids: that relies on
  a zero-probability id having cdf[i] == cdf[i - 1] exactly, which a
  blocked or tree-shaped cumulative sum (XLA may lower a long cumsum that
  way) does not guarantee: XLA:CPU's own cumsum at V = 32128 gives some
  zero ids a step, and an id outside top-k/top-p, or a drafted token with
  q = 0, was drawn at about 1e-6 per draw.

  Args:
    u: uniforms in [0, 1), one per row.
    probs: non-negative weights (need not sum to 1).
    cdf: the cumulative sums of `probs` if already computed (any rounding,
      any summation order); default `jnp.cumsum(probs)`.
  """
  probs = probs.astype(jnp.float32)
  if cdf is None:
    cdf = jnp.cumsum(probs, axis=-1)
  vocab = probs.shape[-1]
  ids = lax.broadcasted_iota(jnp.int32, probs.shape, probs.ndim - 1)
  positive = probs > 0
  hit = positive & (cdf > (u * cdf[..., -1])[..., None])
  # One min-reduction finds both the first hit (codes < V) and, failing
  # that, the last positive id (codes V..2V-1, larger ids smaller codes).
  code = jnp.where(
    hit, ids, jnp.where(positive, 2 * vocab - 1 - ids, 2 * vocab)
  )
  best = jnp.min(code, axis=-1)
  fallback = jnp.where(best < 2 * vocab, 2 * vocab - 1 - best, 0)
  return jnp.where(best < vocab, best, fallback)


def _real(value) -> bool:
  """Whether `value` is a finite real number (a Python or numpy int or
  float; not a bool)."""
  return (
    isinstance(value, numbers.Real)
    and not isinstance(value, (bool, np.bool_))
    and math.isfinite(value)
  )


def validate(temperature, top_k, top_p) -> None:
  """Raises ValueError naming the bad argument."""
  if not _real(temperature) or temperature < 0:
    raise ValueError(f'temperature must be a number >= 0, got {temperature!r}')
  if (
    isinstance(top_k, bool)
    or not isinstance(top_k, (int, np.integer))
    or top_k < 0
  ):
    raise ValueError(f'top_k must be an int >= 0, got {top_k!r}')
  if not _real(top_p) or not 0.0 < top_p <= 1.0:
    raise ValueError(f'top_p must be in (0, 1], got {top_p!r}')


def position_keys(
  row_keys: jax.Array, positions: jax.Array, purpose: int
) -> jax.Array:
  """Keys `[B, T]` for output positions `[B, T]` of rows with `row_keys [B]`.

  `fold_in(fold_in(row_key, position), purpose)`: a row's draws depend only
  on its own seed, the output position and what the draw is for.
  """

  def one_row(key, pos):
    return jax.vmap(
      lambda p: jax.random.fold_in(jax.random.fold_in(key, p), purpose)
    )(pos)

  return jax.vmap(one_row)(row_keys, positions)


def draw_tokens(sampler: Sampler, keys: jax.Array, logits: jax.Array):
  """Tokens `[B]` from `logits [B, V]`, and the distribution drawn from.

  Greedy draws are the argmax and their one-hot distribution is not
  materialized (None): skipping V-wide passes per draw matters on CPU.
  """
  if sampler.is_greedy:
    return argmax(logits), None
  probs = sampler.probs(logits)
  return jax.vmap(sample)(keys, probs), probs

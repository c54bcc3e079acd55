"""Beam search's scores are T5X's to the last bit (`beam/rules.py`).

T5X's `decoding.beam_search` (revision 03d3e28, which `beam.rules`
mirrors) divides the 2K candidates' log-probs by the brevity penalty of
ONE scalar length per step, inside its loop body: `x / ((5 + n) / 6) **
alpha` with `n` the loop's step. XLA computes that differently from the
power of a per-row length array, by an ulp or two, which can flip an exact
tie in the finished set.

1. Always: `rules.step` on rows at different steps gives each finished
   candidate the score T5X's expression gives it for that row's step, bit
   for bit (alpha 0, 0.6 and 2, lengths 1..40).
2. With T5X's source (T5X is not installable from PyPI: set `T5X_SOURCE` to
   a checkout at that revision): `sd.beam_search` against T5X's
   `decoding.beam_search` on table models, tokens and scores bit for bit
   (alpha 0, 0.6 and 2; V = 5 < 2K = 8, so the K - 1 placeholder beams
   reach the top 2K; tables with exactly tied columns). Skipped without it.
"""

import importlib.util
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_speculative import ENC
from test_speculative import RowTableLM
from test_speculative import _tables

import spec_decode as sd
from spec_decode.beam import rules

ALPHAS = (0.0, 0.6, 2.0)


def _t5x_penalized(alpha: float, x: np.ndarray, steps: np.ndarray):
  """`x [B, N]` divided as T5X's loop body divides it at step `steps[b]`.

  One row per iteration of a `lax.while_loop` whose step is carried, as
  T5X's `cur_index` is: `x / ((5.0 + (step + 1)) / 6.0) ** alpha`.
  """

  def run(x, steps):
    def body(carry):
      i, out = carry
      n = steps[i] + 1
      row = x[i] / jnp.power((5.0 + n) / 6.0, alpha)
      return i + 1, out.at[i].set(row)

    init = (jnp.int32(0), jnp.zeros_like(x))
    return lax.while_loop(lambda c: c[0] < x.shape[0], body, init)[1]

  return np.asarray(jax.jit(run)(x, steps))


@pytest.mark.parametrize('alpha', ALPHAS)
def test_finished_scores_divide_as_t5x_does(alpha):
  """EOS is every beam's best extension: the K finished candidates' scores
  are their log-probs over T5X's penalty of the row's length."""
  batch, k, vocab = 40, 2, 4
  rng = np.random.default_rng(0)
  logits = rng.normal(0.0, 1.0, (batch, k, vocab)).astype(np.float32)
  logits[:, :, sd.EOS_ID] += 4.0
  log_probs = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
  live = jnp.asarray(
    rng.uniform(-3.0, -1.0, (batch, k)).astype(np.float32)
  ).sort(axis=1)  # Worst first.
  m = batch + 1
  beams = rules.Beams.init(batch, k, m).replace(
    step=jnp.arange(batch, dtype=jnp.int32), live_logprobs=live
  )
  new, _ = jax.jit(rules.step, static_argnums=(2, 3))(
    beams, log_probs, alpha, sd.EOS_ID, jnp.ones((batch,), bool)
  )
  candidates = np.asarray(log_probs + live[:, :, None])[:, :, sd.EOS_ID]
  want = _t5x_penalized(alpha, candidates, np.arange(batch, dtype=np.int32))
  got = np.asarray(new.finished_scores)
  assert np.asarray(new.finished_flags).all()
  # The K finished slots hold the K EOS candidates, worst first.
  np.testing.assert_array_equal(got, np.sort(want, axis=1))


def _t5x_decoding():
  """T5X's `decoding` module from `$T5X_SOURCE`, or None.

  Only `t5x/decoding.py` and `t5x/binary_search.py` are loaded (T5X's
  package `__init__` pulls in its trainer); `jax.tree_map`, which JAX has
  since removed, is given back as `jax.tree.map` for it.
  """
  root = os.environ.get('T5X_SOURCE')
  if not root:
    return None
  folder = os.path.join(root, 't5x')
  if 't5x.decoding' not in sys.modules:
    if not hasattr(jax, 'tree_map'):
      jax.tree_map = jax.tree.map
    package = types.ModuleType('t5x')
    package.__path__ = [folder]
    sys.modules['t5x'] = package
    for name in ('binary_search', 'decoding'):
      spec = importlib.util.spec_from_file_location(
        f't5x.{name}', os.path.join(folder, f'{name}.py')
      )
      module = importlib.util.module_from_spec(spec)
      sys.modules[f't5x.{name}'] = module
      spec.loader.exec_module(module)
      setattr(package, name, module)
  return sys.modules['t5x.decoding']


def _t5x_beam_search(decoding, tables, enc, k, alpha, m):
  """T5X's beam search over `RowTableLM(tables)`, best first."""
  tables = jnp.asarray(tables)

  def tokens_to_logits(state):
    return tables[state.cache['which'], state.cur_token[:, 0]], state.cache

  def run(which):
    return decoding.beam_search(
      jnp.zeros((enc.shape[0], m), jnp.int32),
      {'which': which},
      tokens_to_logits,
      sd.EOS_ID,
      num_decodes=k,
      alpha=alpha,
      max_decode_len=m,
    )

  seqs, scores = jax.jit(run)(jnp.asarray(enc[:, 0] % tables.shape[0]))
  return np.asarray(seqs)[:, ::-1], np.asarray(scores)[:, ::-1]


def _tied(vocab: int, seed: int) -> np.ndarray:
  """Tables where ids 2 and 3 always have the same logit (exact ties)."""
  tables = _tables(vocab, seed)
  tables[:, :, 3] = tables[:, :, 2]
  return tables


@pytest.mark.skipif(
  not os.environ.get('T5X_SOURCE'),
  reason='needs T5X_SOURCE: a T5X checkout (T5X is not on PyPI)',
)
@pytest.mark.parametrize('alpha', ALPHAS)
def test_beam_search_is_t5x_bit_for_bit(alpha):
  decoding = _t5x_decoding()
  m = 10
  for vocab, k, make in (
    (5, 4, _tables),
    (8, 2, _tables),
    (8, 4, _tied),
    (16, 4, _tables),
  ):
    for seed in range(3):
      tables = make(vocab, seed)
      enc = ENC % vocab
      ours = sd.beam_search(
        RowTableLM(tables=jnp.asarray(tables)),
        enc,
        num_beams=k,
        alpha=alpha,
        max_decode_len=m,
      )
      tokens, scores = _t5x_beam_search(decoding, tables, enc, k, alpha, m)
      np.testing.assert_array_equal(ours.tokens, tokens)
      np.testing.assert_array_equal(ours.scores, scores)

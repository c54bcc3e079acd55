"""Tree scoring and path commits against teacher forcing (tiny T5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import encoder_batch
from conftest import tiny_config

import spec_decode as sd
from spec_decode.core import tree_shape as tree_lib

V = 16
SHAPE = tree_lib.from_paths(
  [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [1, 0, 0]]
)
PREFIX = np.array([3, 1])  # Committed inputs per row (ragged).


@pytest.fixture(scope='module')
def setup():
  model = sd.Model.init(tiny_config(vocab_size=V), seed=1)
  enc = encoder_batch(2, 6, V, seed=2)
  rng = np.random.default_rng(0)
  inputs = np.concatenate(
    [np.zeros((2, 1), np.int32), rng.integers(2, V, (2, 8)).astype(np.int32)],
    1,
  )
  nodes = rng.integers(2, V, (2, SHAPE.num_nodes)).astype(np.int32)
  length = int(PREFIX.max()) + SHAPE.num_nodes + 4
  state = _init(model, jnp.asarray(enc), length)
  _, state = _score(model, state, jnp.asarray(inputs[:, :4]))
  state = _rollback(model, state, jnp.asarray(PREFIX, jnp.int32))
  root = inputs[np.arange(2), PREFIX]
  tree_tokens = np.concatenate([root[:, None], nodes], 1)
  logits, tstate = _score_tree(
    model, state, jnp.asarray(tree_tokens), SHAPE.target_attention()
  )
  return model, enc, inputs, tree_tokens, state, logits, tstate


_score = jax.jit(lambda m, s, t: m.score(s, t))
_score_tree = jax.jit(
  lambda m, s, t, a: m.score_tree(s, t, a), static_argnums=3
)
_init = jax.jit(lambda m, e, n: m.init_state(e, n), static_argnums=2)
_rollback = jax.jit(lambda m, s, i: m.rollback(s, i))
_commit = jax.jit(lambda m, s, p, c: m.commit_tree(s, p, c))


def _path_inputs(inputs, tree_tokens, row, node):
  """Teacher-forcing inputs: committed prefix, root, the path to `node`."""
  path = [u for u in SHAPE.path_nodes[node] if u != 0]
  path = list(dict.fromkeys(path))  # Trailing repeats of `node` dropped.
  prefix = inputs[row, : PREFIX[row] + 1]
  return np.concatenate([prefix, tree_tokens[row, path]]).astype(np.int32)


def _forced_last(model, enc, seqs):
  """Teacher-forced logits after the last input of each `(row, seq)`, in
  one call (padded; causal attention ignores what follows)."""
  width, size = 12, 24  # One compiled shape for every call.
  assert len(seqs) <= size
  batch = np.zeros((size, width), np.int32)
  rows = np.zeros(size, np.int32)
  for i, (r, seq) in enumerate(seqs):
    batch[i, : len(seq)] = seq
    rows[i] = r
  logits = np.asarray(model.logits(enc[rows], batch))
  return [logits[i, len(seq) - 1] for i, (_, seq) in enumerate(seqs)]


def test_tree_logits_equal_teacher_forcing(setup):
  model, enc, inputs, tree_tokens, _, logits, tstate = setup
  cases = [
    (row, node) for row in range(2) for node in range(SHAPE.num_nodes + 1)
  ]
  forced = _forced_last(
    model,
    enc,
    [(r, _path_inputs(inputs, tree_tokens, r, u)) for r, u in cases],
  )
  for (row, node), want in zip(cases, forced, strict=True):
    np.testing.assert_allclose(np.asarray(logits[row, node]), want, atol=2e-5)
  # The index did not move.
  np.testing.assert_array_equal(np.asarray(tstate.cache.index), PREFIX)


def test_committed_path_equals_decoding_it_token_by_token(setup):
  model, enc, inputs, tree_tokens, state, _, tstate = setup
  nodes = np.array([7, 5])  # [0, 0, 0] in row 0, [1, 0] in row 1.
  slots = SHAPE.path_nodes[nodes]
  count = SHAPE.depths[nodes] + 1
  committed = _commit(
    model, tstate, jnp.asarray(slots), jnp.asarray(count, jnp.int32)
  )
  np.testing.assert_array_equal(
    np.asarray(committed.cache.index), PREFIX + count
  )
  for row in range(2):
    seq = _path_inputs(inputs, tree_tokens, row, nodes[row])
    # One by one from the start: the reference cache.
    ref = _init(model, jnp.asarray(enc[row : row + 1]), state.cache.length)
    for t in range(len(seq)):
      _, ref = _score(model, ref, jnp.asarray(seq[None, t : t + 1]))
    n = len(seq)
    for layer in range(len(ref.cache.keys)):
      for got, want in (
        (committed.cache.keys[layer], ref.cache.keys[layer]),
        (committed.cache.values[layer], ref.cache.values[layer]),
      ):
        np.testing.assert_allclose(
          np.asarray(got[row, ..., :n]), np.asarray(want[0, ..., :n]), atol=2e-5
        )
  # Decoding goes on from the committed cache as from teacher forcing.
  nxt = jnp.asarray([[4], [9]], jnp.int32)
  logits, _ = _score(model, committed, nxt)
  seqs = [
    (r, np.append(_path_inputs(inputs, tree_tokens, r, nodes[r]), nxt[r, 0]))
    for r in range(2)
  ]
  for row, want in enumerate(_forced_last(model, enc, seqs)):
    np.testing.assert_allclose(np.asarray(logits[row, 0]), want, atol=2e-5)


def test_draft_layout_calls_equal_teacher_forcing(setup):
  """Depth by depth (a model draft's calls): each level's logits."""
  model, enc, inputs, tree_tokens, state, _, _ = setup
  state = _rollback(model, state, jnp.asarray(PREFIX + 1, jnp.int32))
  for depth in range(1, SHAPE.depth):
    fed, attention = SHAPE.draft_attention(depth)
    logits, state = _score_tree(
      model, state, jnp.asarray(tree_tokens[:, fed]), attention
    )
    cases = [(r, t, u) for r in range(2) for t, u in enumerate(fed)]
    forced = _forced_last(
      model,
      enc,
      [(r, _path_inputs(inputs, tree_tokens, r, u)) for r, _, u in cases],
    )
    for (row, t, _), want in zip(cases, forced, strict=True):
      np.testing.assert_allclose(np.asarray(logits[row, t]), want, atol=2e-5)

"""The draft's per-beam trees (`beam/draft_trees.py`) against a reference
written from their definition (coverage: tests/beam/test_speculative.py)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.beam import draft_trees

EOS = sd.EOS_ID


def test_layout_sizes():
  layout = draft_trees.TreeLayout(gamma=3, width=2, children=3)
  assert layout.kept == (2, 2)
  assert layout.sizes == (3, 6, 6)
  assert layout.offsets == (1, 4, 10)
  assert layout.num_nodes == 15
  assert layout.depths == (0,) + (1,) * 3 + (2,) * 6 + (3,) * 6
  # A level with fewer nodes than W keeps them all.
  wide = draft_trees.TreeLayout(gamma=3, width=5, children=2)
  assert wide.kept == (2, 4)
  assert wide.sizes == (2, 4, 8)


def _reference(table: np.ndarray, root: int, layout) -> list[list]:
  """Per level: (path, cum) of every node, in node order, by definition."""
  c = layout.children

  def children(path, cum):
    lp = np.array(jax.nn.log_softmax(table[path[-1]]), np.float32)
    lp[EOS] = -np.inf
    order = sorted(range(len(lp)), key=lambda t: (-lp[t], t))[:c]
    return [(path + (t,), cum + lp[t]) for t in order]

  levels = [children((root,), np.float32(0.0))]
  for width in layout.kept:
    ranked = sorted(
      range(len(levels[-1])), key=lambda i: (-levels[-1][i][1], i)
    )
    levels.append(
      list(
        itertools.chain.from_iterable(
          children(*levels[-1][i]) for i in ranked[:width]
        )
      )
    )
  return levels


@pytest.mark.parametrize('gamma,width,children', [(1, 1, 3), (3, 2, 2)])
def test_grow_matches_the_definition(gamma, width, children):
  vocab = 7
  draft = sd.TableLM.random(vocab, seed=3)
  table = np.asarray(draft.table, np.float32)
  layout = draft_trees.TreeLayout(gamma=gamma, width=width, children=children)
  roots = np.array([0, 2, 5], np.int32)
  state = draft.init_state(jnp.ones((3, 2), jnp.int32), 16)
  trees = draft_trees.grow(draft, state, jnp.asarray(table[roots]), layout, EOS)
  tokens = np.asarray(trees.tokens)
  first = np.asarray(trees.first_child)
  mask = np.asarray(trees.mask)
  for row, root in enumerate(roots):
    levels = _reference(table, int(root), layout)
    # Walk the tree through first_child: every node's path from the root.
    paths = {0: ()}
    for u in range(layout.num_nodes + 1):
      kid = first[row, u]
      if kid >= 0:
        for r in range(children):
          paths[kid + r] = paths[u] + (tokens[row, kid + r],)
    assert len(paths) == layout.num_nodes + 1
    for d, level in enumerate(levels):
      ids = range(layout.offsets[d], layout.offsets[d] + layout.sizes[d])
      assert [paths[u] for u in ids] == [p[1:] for p, _ in level]
    for u, path in paths.items():
      anc = {v for v, p in paths.items() if path[: len(p)] == p}
      assert set(np.flatnonzero(mask[row, u])) == anc
      assert EOS not in path

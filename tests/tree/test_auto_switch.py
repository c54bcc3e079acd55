"""tree='auto' after its calibration: the drafters are re-synchronised with
the committed prefix when the tree gets shallower (issue 43).

The calibration tree is 6 deep; costs of one unit per node (nothing else)
make `[[0]]` the choice after it. A drafter that proposes the target's own
greedy tokens (the target as a model draft, an early exit with all the
target's layers, a feature draft built to be the target's decoder) must
then have every draft token accepted: a drafter whose state kept scratch
tree nodes of the calibration in place of committed inputs does not.
Before the fix (the drafters re-fed or copied only the new depth + 1
inputs) the model draft accepted 47 of 77 such tokens here, the early exit
53 of 71.

Heads hold no per-position state: after the switch, each of their
proposals must be head 1's choice on the target's own feature of input
n - 1 (read back from the output's provenance).
"""

import numpy as np
import pytest
from _self_draft_util import SELF_DRAFTS
from _self_draft_util import self_draft
from conftest import encoder_batch

import spec_decode as sd
from spec_decode.core import provenance
from spec_decode.core import tree_shape as tree_lib
from spec_decode.drafters import Heads
from spec_decode.tree import auto as tree_auto

# One calibration iteration (M // 16), then about 8 with the chosen tree.
M = 24


def _per_node_seconds(target, draft, enc, settings, shapes=tree_auto.TIMED):
  """t(n, D) = n: the cheapest tokens come from a single node, `[[0]]`."""
  del target, draft, enc, settings
  return {b: float(tree_lib.from_branching(b).num_nodes) for b in shapes}


@pytest.fixture(autouse=True)
def _one_node_costs(monkeypatch):
  monkeypatch.setattr(tree_auto, 'iteration_seconds', _per_node_seconds)


@pytest.fixture(scope='module')
def enc():
  return encoder_batch(8, 7, 16, seed=3)


@pytest.fixture(scope='module')
def plain(target, enc):
  return sd.generate(target, enc, max_decode_len=M)


def _auto(target, enc, draft):
  out = sd.generate(target, enc, draft=draft, tree='auto', max_decode_len=M)
  auto = out.tree['auto']
  # The switch this file is about: from the 6-deep calibration tree to one
  # node.
  assert auto['calibration']['iterations'] == 1
  assert auto['paths'] == [[0]]
  return out


@pytest.mark.parametrize('name', SELF_DRAFTS)
def test_draft_equal_to_target_is_accepted_after_the_switch(
  target, enc, plain, name
):
  out = _auto(target, enc, self_draft(name, target))
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  # The calibration's iteration accepted more than the new depth (1).
  assert out.tree['auto']['calibration']['tokens_per_call'] > 2.0
  tries = int(out.tree['node_tries'].sum())
  accepts = int(out.tree['node_accepts'].sum())
  assert tries >= 40  # Enough iterations after the switch to tell.
  assert accepts == tries, f'{accepts} of {tries} accepted after the switch'


def test_heads_propose_from_the_committed_prefix_after_the_switch(
  target, enc, plain
):
  heads = Heads.init(target, num_heads=6, init_scale=0.3, seed=4)
  out = _auto(target, enc, heads)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  inputs = np.pad(out.tokens, ((0, 0), (1, 0)))[:, :M]
  feats = np.asarray(target.features(enc, inputs))  # [B, M, D] at input t
  head1 = np.asarray(heads.logits(feats, 1))[:, :, 0].argmax(-1)
  got, want, hits = [], [], 0
  for r in range(enc.shape[0]):
    for it in out.provenance.iterations(r)[1:]:  # After the calibration.
      pos, kind, rejected = it[0]  # Output token pos + 1 at length n = pos.
      assert kind in (provenance.ACCEPTED, provenance.REPLACED)
      accepted = kind == provenance.ACCEPTED
      hits += accepted
      got.append(out.tokens[r, pos] if accepted else rejected)
      want.append(head1[r, pos - 1])  # Head 1 on the feature of input n - 1.
  assert len(got) >= 40
  np.testing.assert_array_equal(got, want)
  # The report counts the same acceptances, and some of each kind.
  assert 0 < hits == int(out.tree['node_accepts'].sum()) < len(got)

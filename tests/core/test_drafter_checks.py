"""What a drafter hands the loops is checked where they receive it.

`core.drafter.check_proposal` runs at trace time at the one place each loop
receives a proposal (the chain's `Iteration.draft`, the tree loop's body),
and speculative beam search checks its draft's logits: a malformed
proposal, draft state or draft logits is an error naming the drafter's
class, the field, its shape and dtype and the expected ones, not an XLA
shape error deep inside the verifier.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.core import drafter as drafter_lib
from spec_decode.core import model_drafter
from spec_decode.core import tree_shape

V = 8
M = 6
MANGLES = (
  'tokens_shape', 'tokens_dtype', 'q_vocab', 'num_shape', 'state_dtype',
  'tuple', 'nodes', 'valid_dtype',
)  # fmt: skip
ENC = np.array([[3, 4, 5], [6, 7, 0]], np.int32)


@flax.struct.dataclass(kw_only=True)
class Mangler(model_drafter.ModelDrafter):
  """A table-model drafter whose proposals `mangle` breaks one way."""

  mangle: str = flax.struct.field(pytree_node=False, default='')

  def _broken(self, proposal, state):
    m = self.mangle
    if m == 'tokens_shape':
      proposal = proposal.replace(tokens=proposal.tokens[:, :-1])
    elif m == 'tokens_dtype':
      proposal = proposal.replace(tokens=proposal.tokens.astype(jnp.float32))
    elif m == 'q_vocab':
      proposal = proposal.replace(q=proposal.q[..., :-1])
    elif m == 'num_shape':
      proposal = proposal.replace(num=proposal.num[:, None])
    elif m == 'nodes':
      proposal = proposal.replace(
        tokens=proposal.tokens[:, :-1], valid=proposal.valid[:, :-1]
      )
    elif m == 'valid_dtype':
      proposal = proposal.replace(valid=proposal.valid.astype(jnp.int32))
    elif m == 'state_dtype':
      state = state.replace(index=state.index.astype(jnp.float32))
    elif m == 'tuple':
      proposal = (proposal.tokens, proposal.q)
    return proposal, state

  def propose(self, state, context, settings):
    return self._broken(*super().propose(state, context, settings))

  def propose_tree(self, state, context, settings, shape):
    return self._broken(*super().propose_tree(state, context, settings, shape))


@pytest.fixture(scope='module')
def target():
  return sd.TableLM.random(V, seed=1)


def _mangler(mangle=''):
  draft = sd.TableLM.random(V, seed=2, scale=1.0)
  return Mangler(model=draft, mangle=mangle)


def _decode(target, draft, **kw):
  return sd.generate(target, ENC, draft=draft, gamma=3, max_decode_len=M, **kw)


@pytest.mark.parametrize(
  'mangle, sampled, pattern',
  [
    (
      'tokens_shape',
      False,
      r'Mangler\.propose returned Proposal\.tokens of shape \(2, 2\) int32; '
      r'expected \(2, 3\) int32 \(\[B, G\]: B = 2 rows, G = 3, V = 8\)',
    ),
    (
      'tokens_dtype',
      False,
      r'Mangler\.propose returned Proposal\.tokens of dtype float32; '
      r'expected \(2, 3\) int32',
    ),
    (
      'q_vocab',
      True,
      r'Mangler\.propose returned Proposal\.q of shape \(2, 3, 7\) float32; '
      r'expected \(2, 3, 8\) floating',
    ),
    (
      'num_shape',
      False,
      r'Mangler\.propose returned Proposal\.num of shape \(2, 1\) int32; '
      r'expected \(2,\) int32',
    ),
    (
      'state_dtype',
      False,
      r'Mangler\.propose returned draft state\.index of dtype float32; '
      r'expected \(2,\) int32 \(the state it was given\)',
    ),
    (
      'tuple',
      False,
      r'Mangler\.propose returned tuple as its proposal; expected a '
      r'core\.drafter\.Proposal',
    ),
  ],
  ids=lambda x: x if x in MANGLES else '',
)
def test_chain_loop_names_the_drafter_and_the_field(
  target, mangle, sampled, pattern
):
  kw = {'temperature': 1.0} if sampled else {}
  with pytest.raises((ValueError, TypeError), match=pattern):
    _decode(target, _mangler(mangle), **kw)


@pytest.mark.parametrize(
  'mangle, error, pattern',
  [
    (
      'nodes',
      ValueError,
      r'Mangler\.propose_tree returned TreeProposal\.tokens of shape '
      r'\(2, 3\) int32; expected \(2, 4\) int32 \(\[B, N\]: B = 2 rows, '
      r'N = 4, V = 8\)',
    ),
    (
      'valid_dtype',
      TypeError,
      r'Mangler\.propose_tree returned TreeProposal\.valid of dtype '
      r'int32; expected \(2, 4\) bool',
    ),
  ],
  ids=lambda x: x if x in MANGLES else '',
)
def test_tree_loop_names_the_drafter_and_the_field(
  target, mangle, error, pattern
):
  with pytest.raises(error, match=pattern):
    sd.generate(
      target, ENC, draft=_mangler(mangle), tree=(2, 1), max_decode_len=M
    )


def test_a_well_formed_custom_drafter_decodes(target):
  """The checks pass a drafter that keeps the contract: its greedy
  speculative output is plain decoding's, in the chain and the tree loop."""
  plain = sd.generate(target, ENC, max_decode_len=M)
  chain = _decode(target, _mangler())
  tree = sd.generate(
    target, ENC, draft=_mangler(), tree=(2, 1), max_decode_len=M
  )
  np.testing.assert_array_equal(chain.tokens, plain.tokens)
  np.testing.assert_array_equal(tree.tokens, plain.tokens)


def _context(batch=2, gamma=3):
  return drafter_lib.DraftContext(
    inputs=jnp.zeros((batch, 10), jnp.int32),
    length=jnp.zeros((batch,), jnp.int32),
    encoder_tokens=jnp.zeros((batch, 3), jnp.int32),
    keys=jax.random.split(jax.random.key(0), batch * gamma).reshape(
      batch, gamma
    ),
  )


def test_the_checks_read_every_field():
  """Directly, outside any loop: None q and num are allowed, a state of
  another structure or a missing array is named."""
  d = _mangler()
  ok = drafter_lib.Proposal(
    tokens=jnp.zeros((2, 3), jnp.int32), q=None, num=None
  )
  drafter_lib.check_proposal(d, ok, _context(), 3, None, None)
  with pytest.raises(TypeError, match=r'Mangler\.propose returned a draft '):
    drafter_lib.check_proposal(d, ok, _context(), 3, None, {'x': ok.tokens})
  with pytest.raises(TypeError, match=r'Proposal\.tokens = list, not an array'):
    drafter_lib.check_proposal(
      d, ok.replace(tokens=[1, 2]), _context(), 3, None, None
    )
  with pytest.raises(ValueError, match=r'Proposal\.q of shape \(2, 3\) '):
    drafter_lib.check_proposal(
      d, ok.replace(q=jnp.zeros((2, 3))), _context(), 3, None, None
    )
  with pytest.raises(
    ValueError,
    match=r'the loop gave Mangler\.propose DraftContext\.keys of shape '
    r'\(2, 3\) key<fry>; expected \(2, 4\) prng_key',
  ):
    drafter_lib.check_proposal(d, ok, _context(), 4, None, None)
  with pytest.raises(
    TypeError, match=r'DraftContext\.target_features of dtype int32; '
  ):
    context = _context().replace(target_features=jnp.zeros((2, 5), int))
    drafter_lib.check_proposal(d, ok, context, 3, None, None)
  shape = tree_shape.from_branching((2, 1))
  with pytest.raises(
    TypeError, match=r'Mangler\.propose_tree returned Proposal as its '
  ):
    drafter_lib.check_proposal(d, ok, _context(), shape, None, None)


@flax.struct.dataclass(kw_only=True)
class WideLM:
  """A draft model whose logits have one column too many."""

  inner: Any

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  def init_state(self, encoder_tokens, length):
    return self.inner.init_state(encoder_tokens, length)

  def rollback(self, state, index):
    return self.inner.rollback(state, index)

  def score(self, state, tokens):
    logits, state = self.inner.score(state, tokens)
    return jnp.pad(logits, ((0, 0), (0, 0), (0, 1))), state

  def score_tree(self, state, tokens, attention):
    return self.inner.score_tree(state, tokens, attention)

  def commit_tree(self, state, slots, count):
    return self.inner.commit_tree(state, slots, count)


def test_beam_search_names_the_draft_and_its_logits(target):
  draft = WideLM(inner=sd.TableLM.random(V, seed=2))
  with pytest.raises(
    ValueError,
    match=r'WideLM\.score returned logits of shape \(4, 5, 9\) float32; '
    r'expected \(4, 5, 8\) floating \(\[R, T, V\]: R = 4, T = 5, V = 8\)',
  ):
    sd.beam_search(
      target, ENC, num_beams=2, max_decode_len=M, draft=draft, gamma=3
    )

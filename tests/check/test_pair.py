"""`sd.verify` and `spec-decode verify`: the bring-your-own-drafter check.

A correct pair must pass every check, and broken pairs must fail: a
drafter that draws from q but reports norm(q^2) (greedy identity cannot
see it; the distribution tests must), a verifier that samples p instead of
the residual, and one that accepts every draft token (its outputs include
tokens outside the target's top-k). Each report's statistical checks run
at a family-wise false-alarm rate of 1e-3 (Bonferroni), so a correct pair
fails with probability at most 1e-3; the seeds are fixed, so the outcome
is deterministic. Sample sizes: 3,000 sequences of 3 tokens per setting.
"""

import dataclasses
import json

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _distribution_util import ResidualDroppingVerifier
from _distribution_util import WrappedDrafter
from conftest import perturbed
from conftest import sharpened
from conftest import tiny_config
from scipy import stats

import spec_decode as sd
from spec_decode.check import statistics
from spec_decode.core import model_drafter
from spec_decode.core import rejection
from spec_decode.eval import verify_cli

FAST = dict(num_samples=3000, batch_size=1500, gammas=(3,), num_inputs=8)


@pytest.fixture(scope='module')
def pair():
  """Tiny T5 target and a draft near it."""
  target = sharpened(sd.Model.init(tiny_config(), seed=0))
  return target, perturbed(target, 0.3, seed=1)


@pytest.fixture(scope='module')
def tables():
  """Bigram-table target and draft: the broken-pair tests compile fast."""
  return sd.TableLM.random(16, seed=0), sd.TableLM.random(16, seed=1)


@flax.struct.dataclass(kw_only=True)
class HashedBigramLM:
  """A user's own protocol implementation at T5's vocabulary (V = 32128):
  next-token logits `table[prev % R]` from an `[R, V]` table."""

  table: jax.Array

  @property
  def vocab_size(self):
    return self.table.shape[1]

  @property
  def vocabulary(self):
    return None

  def init_state(self, encoder_tokens, length):
    del length
    return jnp.zeros((encoder_tokens.shape[0],), jnp.int32)

  def score(self, state, tokens):
    logits = self.table[tokens % self.table.shape[0]]
    return logits, state + tokens.shape[1]

  def rollback(self, state, index):
    del state
    return jnp.asarray(index, jnp.int32)


@flax.struct.dataclass(kw_only=True)
class SharpenedQ(WrappedDrafter):
  """Broken on purpose: draws from the draft's q, reports norm(q^2)."""

  def propose(self, state, context, settings):
    proposal, state = self.inner.propose(state, context, settings)
    if proposal.q is None:
      return proposal, state
    q2 = proposal.q**2
    return proposal.replace(q=q2 / jnp.sum(q2, -1, keepdims=True)), state


def lying(draft):
  return SharpenedQ(inner=model_drafter.as_drafter(draft))


@dataclasses.dataclass(frozen=True)
class AcceptAllVerifier:
  """Broken on purpose: keeps every draft token (and the bonus draw)."""

  def __call__(self, p, q, draft_tokens, uniforms, bonus_keys, *args, **kw):
    exact = rejection.ExactVerifier()(
      p, q, draft_tokens, uniforms, bonus_keys, *args, **kw
    )
    g = q.shape[1]
    return exact.replace(
      accepted=jnp.full_like(exact.accepted, g),
      next_token=jax.vmap(jax.random.categorical)(
        bonus_keys[:, g], jnp.log(p[:, g])
      ),
    )


def _kinds(report):
  return {c.name.split(',')[0] for c in report.checks}


def test_chi2_tail_without_scipy_matches_scipy():
  for df in (1, 2, 9, 27, 60, 300):
    for x in (0.0, 0.5 * df, df, 2.0 * df + 10, 4.0 * df + 40):
      want = stats.chi2.sf(x, df)
      got = statistics.chi2_sf(x, df)
      assert got == pytest.approx(want, rel=1e-3, abs=1e-30), (df, x)
  assert statistics.chi2_sf(float('inf'), 5) == 0.0


@pytest.mark.parametrize(
  'sampler', [sd.Sampler(1.0), sd.Sampler(1.0, top_k=3, top_p=0.8)]
)
def test_partition_cells_have_the_probability_of_their_sequences(sampler):
  """Every sequence of a V = 6 bigram table (M = 3; 1 + 5 + 25 + 125 of
  them), with its probability computed here from the table, is mapped to a
  cell by `cell_of`; each cell's probability must be the sum over its
  sequences, and every cell must be reached."""
  v, m, n = 6, 3, 400
  lm = sd.TableLM.random(v, seed=2, scale=1.5)
  cond = np.asarray(sampler.probs(lm.table), np.float64)  # [prev, next]
  forcer = statistics.Forcer(lm, np.ones((1, 2), np.int32), sampler, 64, 8)
  cells, expanded = statistics.partition(forcer, n, m, 5.0, sd.EOS_ID)
  assert len(expanded) > 3 and len(cells) > 10
  total = dict.fromkeys(cells, 0.0)
  seqs = [()]
  for _ in range(m):
    seqs = [s + (t,) for s in seqs if sd.EOS_ID not in s for t in range(v)]
    for seq in seqs:
      if len(seq) < m and seq[-1] != sd.EOS_ID:
        continue
      prev = (0,) + seq[:-1]
      prob = np.prod([cond[a, b] for a, b in zip(prev, seq, strict=True)])
      row = np.array(seq + (0,) * (m - len(seq)))
      total[statistics.cell_of(row, expanded, cells, sd.EOS_ID)] += prob
  for key, mass in cells.items():
    assert total[key] == pytest.approx(mass, abs=1e-6), key
  assert sum(total.values()) == pytest.approx(1.0, abs=1e-6)
  assert min(total.values()) >= 0.0


@pytest.mark.parametrize(
  'sampler', [sd.Sampler(1.0), sd.Sampler(0.8, top_k=4, top_p=0.9)]
)
def test_a_correct_pair_passes_every_check(pair, sampler):
  target, draft = pair
  report = sd.verify(target, draft, samplers=(sampler,), **FAST)
  assert isinstance(report, sd.PairReport)
  assert report.passed, report.table()
  assert _kinds(report) == {
    'greedy identity',
    'zero probability',
    'PIT chi-square',
    'enumerated G-test',
  }
  tests = [c for c in report.checks if c.p_value is not None]
  assert len(tests) == 2  # PIT and G.
  for c in tests:
    assert c.false_alarm == pytest.approx(1e-3 / 2)
    assert c.sample_size == 3000 and c.df > 0
  assert 'PASS' in report.table() and '| FAIL |' not in report.table()


def test_medusa_heads_pass(pair):
  """A drafter reading the target's features (any drafter works)."""
  target, _ = pair
  heads = sd.drafters.Heads.init(target, num_heads=3, init_scale=1.0, seed=1)
  noise = jax.random.normal(jax.random.key(2), heads.biases.shape)
  report = sd.verify(
    target, heads.replace(biases=noise), samplers=(sd.Sampler(1.0),), **FAST
  )
  assert report.passed, report.table()


def test_a_correct_table_pair_passes(tables):
  """The control for the broken table pairs below."""
  report = sd.verify(*tables, samplers=(sd.Sampler(1.0),), **FAST)
  assert report.passed, report.table()


def test_a_drafter_that_lies_about_q_fails(tables):
  target, draft = tables
  report = sd.verify(target, lying(draft), samplers=(sd.Sampler(1.0),), **FAST)
  assert not report.passed
  by_kind = {c.name.split(',')[0]: c for c in report.checks}
  # Greedy proposals carry no q: the lie is invisible there.
  assert all(c.passed for c in report.checks if 'greedy' in c.name)
  assert not by_kind['PIT chi-square'].passed, report.table()
  assert not by_kind['enumerated G-test'].passed, report.table()
  assert 'FAIL' in report.table()


def test_a_verifier_that_drops_the_residual_fails(tables):
  report = sd.verify(
    *tables,
    samplers=(sd.Sampler(1.0),),
    verifier=ResidualDroppingVerifier(),
    **FAST,
  )
  failed = {c.name for c in report.checks if not c.passed}
  assert failed == {'PIT chi-square, t=1', 'enumerated G-test, t=1'}


def test_an_accept_all_verifier_fails_the_zero_probability_check(tables):
  report = sd.verify(
    *tables,
    samplers=(sd.Sampler(1.0, top_k=2),),
    verifier=AcceptAllVerifier(),
    **FAST,
  )
  zero = [c for c in report.checks if c.name.startswith('zero')]
  assert len(zero) == 1 and not zero[0].passed and zero[0].statistic > 0
  assert not any(c.passed for c in report.checks if 'greedy' in c.name)


@pytest.mark.optimized
def test_works_at_t5_vocabulary_size():
  """V = 32128 with a user's own protocol class: the enumeration expands
  only probable prefixes and the PIT needs none. A correct pair passes;
  the lying drafter fails."""
  rng = np.random.default_rng(0)
  logits = rng.normal(0.0, 1.0, (8, 32128)).astype(np.float32)
  logits[:, rng.integers(0, 32128, 12)] += 9.0  # Some probable tokens.
  target = HashedBigramLM(table=jnp.asarray(logits))
  noise = rng.normal(0.0, 0.5, logits.shape).astype(np.float32)
  draft = HashedBigramLM(table=jnp.asarray(logits + noise))
  kw = dict(FAST, num_samples=2000, batch_size=500, num_inputs=4)
  report = sd.verify(target, draft, samplers=(sd.Sampler(1.0),), **kw)
  assert report.passed, report.table()
  assert 'enumerated G-test' in _kinds(report), report.table()
  report = sd.verify(target, lying(draft), samplers=(sd.Sampler(1.0),), **kw)
  assert not report.passed, report.table()


@pytest.mark.parametrize(
  'kwargs, name',
  [
    (dict(gammas=()), 'gammas'),
    (dict(gammas=(0,)), 'gammas'),
    (dict(num_samples=0), 'num_samples'),
    (dict(sample_len=0), 'sample_len'),
    (dict(bins=1), 'bins'),
    (dict(false_alarm=0.0), 'false_alarm'),
    (dict(samplers=(sd.Sampler(0.0),)), 'samplers'),
    (dict(seed=-1), 'seed'),
  ],
)
def test_bad_settings_name_the_argument(pair, kwargs, name):
  with pytest.raises(ValueError, match=name):
    sd.verify(*pair, **kwargs)


@flax.struct.dataclass(kw_only=True)
class TreeOnlyLie(WrappedDrafter):
  """Broken on purpose in its trees only: chains are the inner drafter's,
  tree nodes report norm(q^2) instead of the q they were drawn from."""

  def propose_tree(self, state, context, settings, shape):
    proposal, state = self.inner.propose_tree(state, context, settings, shape)
    if proposal.q is None:  # Greedy.
      return proposal, state
    q2 = proposal.q**2
    return proposal.replace(q=q2 / jnp.sum(q2, -1, keepdims=True)), state


def test_a_tree_is_checked_on_the_tree_path(tables):
  """`tree=` checks the tree path: a drafter broken only in its trees
  passes the chain checks and fails the tree's (issue 28)."""
  target, draft = tables
  lie = TreeOnlyLie(inner=model_drafter.as_drafter(draft))
  kw = dict(FAST, samplers=(sd.Sampler(1.0),))
  good = sd.verify(target, draft, tree=(2, 2), **kw)
  assert good.passed, good.table()
  assert good.checks[0].name == 'greedy identity, tree=(2, 2)'
  assert sd.verify(target, lie, **kw).passed  # Chains: the inner drafter.
  bad = sd.verify(target, lie, tree=(2, 2), **kw)
  assert not bad.passed, bad.table()
  with pytest.raises(ValueError):
    sd.verify(target, draft, tree=[[1]], **kw)


# ------------------------------------------------------------ the command.

CLI_FAST = [  # The settings of FAST.
  '--num_samples=3000',
  '--batch_size=1500',
  '--gammas=3',
  '--num_inputs=8',
  '--temperature=1',
  '--top_k=0',
  '--top_p=1',
]


@pytest.fixture(scope='module')
def saved(pair, tmp_path_factory):
  root = tmp_path_factory.mktemp('pair')
  target, draft = pair
  target.save(str(root / 'target'))
  draft.save(str(root / 'draft'))
  return str(root / 'target'), str(root / 'draft')


def test_cli_passes_a_correct_pair(saved, tmp_path, capsys):
  target, draft = saved
  out = tmp_path / 'report.json'
  code = verify_cli.main(
    ['--target', target, '--draft', draft, '--json', str(out), *CLI_FAST]
  )
  printed = capsys.readouterr().out
  assert code == 0, printed
  assert '| PIT chi-square, t=1 | pass | 3000 |' in printed
  assert 'PASS: all' in printed and 'false-alarm rate 0.001' in printed
  report = json.loads(out.read_text())
  assert report['passed'] and len(report['checks']) == 4


def test_cli_checks_a_tree(saved, capsys):
  target, draft = saved
  code = verify_cli.main(
    ['--target', target, '--draft', draft, '--tree', '2,2', *CLI_FAST]
  )
  printed = capsys.readouterr().out
  assert code == 0, printed
  assert '| greedy identity, tree=(2, 2) | pass |' in printed
  assert verify_cli.parse_tree('[[0], [1], [0, 0]]') == [[0], [1], [0, 0]]
  assert verify_cli.parse_tree(' AUTO ') == 'auto'


def test_cli_fails_a_broken_pair(saved, monkeypatch, capsys):
  load_pair = verify_cli.load_pair

  def with_lying_draft(args, checked):
    target, draft = load_pair(args, checked)
    return target, lying(draft)

  monkeypatch.setattr(verify_cli, 'load_pair', with_lying_draft)
  target, draft = saved
  code = verify_cli.main(['--target', target, '--draft', draft, *CLI_FAST])
  printed = capsys.readouterr().out
  assert code == 1, printed
  assert '| FAIL |' in printed and 'FAIL:' in printed


def test_cli_ngram_draft_from_token_files(saved, pair, tmp_path, capsys):
  target_model, _ = pair
  rng = np.random.default_rng(0)
  enc = rng.integers(2, 16, (64, 6)).astype(np.int32)
  outputs = sd.generate(target_model, enc, max_decode_len=8).tokens
  text = tmp_path / 'outputs.txt'
  text.write_text('\n'.join(' '.join(map(str, row)) for row in outputs[:32]))
  np.save(tmp_path / 'more.npy', outputs[32:])
  code = verify_cli.main(
    [
      '--target',
      saved[0],
      '--draft_ngram',
      str(text),
      '--draft_ngram',
      str(tmp_path / 'more.npy'),
      *CLI_FAST,
    ]
  )
  printed = capsys.readouterr().out
  assert code == 0, printed
  assert '2-gram fit on' in printed


@pytest.mark.parametrize(
  'argv, message',
  [
    ([], '--target'),
    (['--target', 'T'], 'give a draft'),
    (['--target', 'T', '--draft', 'D', '--draft_ngram', 'N'], 'give a draft'),
    (['--target', '/no/such/dir', '--draft', 'D'], 'no such checkpoint'),
    (['--target', 'T', '--draft', 'D', '--gammas', '1,x'], '--gammas'),
    (['--target', 'T', '--draft', 'D', '--gammas', '0'], 'gammas'),
    (['--target', 'T', '--draft', 'D', '--top_p', '1.5'], 'top_p'),
    (['--target', 'T', '--draft', 'D', '--num_samples', '0'], 'num_samples'),
    (['--target', 'T', '--draft', 'D', '--inputs', '/no/file'], 'no such'),
    (['--target_gin_file', '/no/such.gin', '--draft', 'D'], 'gin_file'),
    (['--target', 'T', '--draft', 'D', '--sample_len', 'x'], None),
    (['--target', 'T', '--draft', 'D', '--tree', '2,x'], '--tree'),
    (['--target', 'T', '--draft', 'D', '--tree', '[[1]]'], None),
  ],
)
def test_cli_bad_arguments_exit_2_before_loading(
  saved, monkeypatch, capsys, argv, message
):
  def no_loading(*args, **kwargs):
    raise AssertionError('a model was loaded')

  monkeypatch.setattr(sd.Model, 'load', no_loading)
  monkeypatch.setattr(sd.Model, 'from_gin', no_loading)
  argv = [{'T': saved[0], 'D': saved[1], 'N': saved[0]}.get(a, a) for a in argv]
  assert verify_cli.main(argv) == 2
  if message:
    assert message in capsys.readouterr().err

"""One γ for every entry point: `generate`, `beam_search`, `verify`, the
eval and infer settings, `spec-decode eval`, `spec-decode verify`, the demo
and the bench command lines accept the same spellings (an int >= 1 as an
int, a numpy int or its text, 'auto' in any case with whitespace) and
refuse the rest with one text (`core.inputs.parse_gamma`), before anything
compiles or loads. Commands that time fixed γs refuse 'auto' too, with the
same text less "or 'auto'". The public decodes take everything after the
model and the inputs by keyword."""

import numpy as np
import pytest
from conftest import tiny_config

import spec_decode as sd
from spec_decode import demo
from spec_decode.bench import infer as bench_infer
from spec_decode.bench import provenance as bench_provenance
from spec_decode.bench.beam import search as bench_beam
from spec_decode.bench.drafts import dtype as bench_dtype
from spec_decode.bench.drafts import hierarchical as bench_hierarchical
from spec_decode.bench.drafts import on_target as bench_on_target
from spec_decode.bench.drafts import table as bench_table
from spec_decode.bench.drafts import trees as bench_trees
from spec_decode.chain import generation
from spec_decode.check import pair
from spec_decode.core import inputs
from spec_decode.eval import cli as eval_cli
from spec_decode.eval import settings as eval_settings
from spec_decode.eval import verify_cli
from spec_decode.eval.infer import settings as infer_settings

# (spelling, what it reads as).
GOOD = [
  (4, 4), (7, 7), ('4', 4), (' 4 ', 4), ('\t12\n', 12), (np.int32(4), 4),
  (np.int64(3), 3), ('auto', 'auto'), (' Auto ', 'auto'), ('AUTO', 'auto'),
]  # fmt: skip
BAD = [0, -1, '0', '-1', 'fast', '', ' ', 1.5, 2.5, True, False, None,
       '4.0', 'auto4', np.int32(0)]  # fmt: skip
GIN = 'gin/models/t5_1_1/tiny.gin'
# Command lines that take one γ (flag text), and those that take a list.
ONE_GAMMA = [bench_infer, bench_table, demo]
FIXED_GAMMA = [bench_provenance, bench_dtype, bench_on_target,
               bench_hierarchical]  # fmt: skip
FIXED_GAMMAS = [bench_trees, bench_beam]


def _message(name, value, auto=True):
  what = "an int >= 1 or 'auto'" if auto else 'an int >= 1'
  return f'{name} must be {what}, got {value!r}'


def _text(value):
  """The spelling as a command line or a gin file gives it."""
  return value if isinstance(value, str) else str(value)


@pytest.mark.parametrize('value,want', GOOD)
def test_the_library_entry_points_read_a_spelling_alike(value, want):
  assert inputs.parse_gamma(value) == want
  # `generate`'s settings (what the loop gets): the γ, or under 'auto' the
  # policy on and the largest γ as the width.
  s = generation.decode_settings(speculative=True, gamma=value)
  if want == 'auto':
    assert s.gamma_policy and s.gamma == generation.finish_time.MAX_GAMMA
  else:
    assert not s.gamma_policy and s.gamma == want
  plain = generation.decode_settings(speculative=False, gamma=value)
  assert plain.gamma == 1 and not plain.gamma_policy
  settings = eval_settings.EvalSettings(task='synthetic_tiny', gamma=value)
  assert settings.gamma == (want if want == 'auto' else (want,))
  assert settings.gammas == (want,)
  infer = infer_settings.InferSettings(task='synthetic_tiny', gamma=value)
  assert infer.gamma_value == want
  pair.validate(**_verify_args(gammas=[value]))
  assert pair._modes([value], None) == [(f'gamma={want}', {'gamma': want})]


@pytest.mark.parametrize('value,want', GOOD)
def test_the_command_lines_read_a_spelling_alike(value, want):
  text = _text(value)
  assert inputs.gamma_flag()(text) == want
  assert demo._parser().parse_args(['--gamma', text]).gamma == want
  assert inputs.gamma_flag(many=True)(f'{text},2') == (want, 2)
  args = verify_cli._parser().parse_args(
    ['--target_gin_file', GIN, '--draft_gin_file', GIN, '--gammas', text]
  )
  assert verify_cli._checked(args)['settings']['gammas'] == (want,)
  if want != 'auto':
    assert inputs.gamma_flag(auto=False)(text) == want


@pytest.mark.parametrize('value', BAD)
def test_every_entry_point_refuses_a_bad_spelling_with_one_text(value):
  with pytest.raises(ValueError) as e:
    inputs.parse_gamma(value)
  assert str(e.value) == _message('gamma', value)
  with pytest.raises(ValueError) as e:
    generation.decode_settings(speculative=True, gamma=value)
  assert str(e.value) == _message('gamma', value)
  for settings in (eval_settings.EvalSettings, infer_settings.InferSettings):
    with pytest.raises(ValueError) as e:
      settings(task='synthetic_tiny', gamma=value)
    assert str(e.value) == 'EvalSettings.' + _message('gamma', value)
  with pytest.raises(ValueError) as e:
    pair.validate(**_verify_args(gammas=[value]))
  assert str(e.value) == _message('gammas', value)


@pytest.mark.parametrize('value', BAD)
def test_every_command_line_refuses_a_bad_spelling_with_one_text(value, capsys):
  text = _text(value)
  for cli in ONE_GAMMA + FIXED_GAMMA:
    with pytest.raises(SystemExit) as e:
      cli.main(['--gamma', text])
    assert e.value.code == 2, cli.__name__
    auto = cli not in FIXED_GAMMA
    assert _message('gamma', text, auto) in capsys.readouterr().err
  for cli in FIXED_GAMMAS:
    with pytest.raises(SystemExit) as e:
      cli.main(['--gammas', f'2,{text}'])
    assert e.value.code == 2, cli.__name__
    assert _message('gammas', text, False) in capsys.readouterr().err
  with pytest.raises(SystemExit):
    bench_hierarchical.main(['--inner_gammas', text])
  assert _message('inner_gammas', text, False) in capsys.readouterr().err
  args = verify_cli._parser().parse_args(
    ['--target_gin_file', GIN, '--draft_gin_file', GIN, '--gammas', text]
  )
  with pytest.raises(verify_cli._BadArguments) as e:
    verify_cli._checked(args)
  assert _message('--gammas', text) in str(e.value)


def test_commands_that_time_fixed_gammas_refuse_auto(capsys):
  for cli in FIXED_GAMMA:
    with pytest.raises(SystemExit):
      cli.main(['--gamma', ' Auto '])
    assert _message('gamma', ' Auto ', False) in capsys.readouterr().err
  for cli in FIXED_GAMMAS:
    with pytest.raises(SystemExit):
      cli.main(['--gammas', '2,auto'])
    assert _message('gammas', 'auto', False) in capsys.readouterr().err


# The γs a gin file can spell (Python literals), refused by `spec-decode
# eval` before a model loads (loading either one would fail first).
GIN_BAD = [0, -1, 'fast', 1.5, True, None, '4.0']


@pytest.mark.parametrize('value', GIN_BAD)
def test_spec_decode_eval_refuses_a_bad_gin_gamma_before_loading(
  value, tmp_path, capsys
):
  code = eval_cli.main([
    '--gin_file=demo_debian_ende', '--gin.TARGET_CHECKPOINT=/nonexistent/t',
    '--gin.DRAFT_CHECKPOINT=/nonexistent/d', f'--gin.GAMMA={value!r}',
    f'--output_dir={tmp_path}',
  ])  # fmt: skip
  assert code == 1
  err = capsys.readouterr().err
  assert 'EvalSettings.' + _message('gamma', value) in err
  assert 'checkpoint not found' not in err


@pytest.fixture(scope='module')
def model():
  return sd.Model.init(tiny_config(), seed=0)


@pytest.mark.parametrize('value', BAD)
def test_generate_beam_search_and_verify_refuse_them_alike(model, value):
  enc = np.full((1, 4), 3, np.int32)
  for decode in (sd.generate, sd.beam_search):
    with pytest.raises(ValueError) as e:
      decode(model, enc, draft=model, gamma=value, max_decode_len=2)
    assert str(e.value) == _message('gamma', value), decode.__name__
  with pytest.raises(ValueError) as e:
    sd.verify(model, model, gammas=[value])
  assert str(e.value) == _message('gammas', value)


def test_generate_and_beam_search_read_every_spelling(model):
  """Without a draft the γ is read and checked, then unused (no decode at
  'auto' has to run to show the spelling is accepted)."""
  enc = np.full((1, 4), 3, np.int32)
  for value, _ in GOOD:
    sd.generate(model, enc, gamma=value, max_decode_len=2)
    sd.beam_search(model, enc, gamma=value, num_beams=2, max_decode_len=2)


def test_a_tree_refuses_auto_gamma_in_any_spelling(model):
  enc = np.full((1, 4), 3, np.int32)
  for value in ('auto', ' Auto '):
    with pytest.raises(ValueError, match='tree= replaces gamma'):
      sd.generate(model, enc, draft=model, gamma=value, tree=(2, 1))


def test_public_decodes_take_their_settings_by_keyword(model):
  """`generate(target, inputs, *, ...)`, `beam_search(model, inputs, *,
  ...)`, `verify(target, draft, *, ...)`: a third positional argument is
  a TypeError (the old orders would pass a draft as num_beams)."""
  enc = np.full((1, 4), 3, np.int32)
  with pytest.raises(TypeError, match='positional'):
    sd.generate(model, enc, model)
  with pytest.raises(TypeError, match='positional'):
    sd.beam_search(model, enc, 2)
  with pytest.raises(TypeError, match='positional'):
    sd.verify(model, model, enc)


def _verify_args(**changes):
  args = dict(
    gammas=[1],
    num_inputs=2,
    max_decode_len=4,
    samplers=[sd.Sampler(1.0)],
    num_samples=10,
    sample_len=2,
    batch_size=2,
    bins=2,
    false_alarm=0.01,
    seed=0,
  )
  args.update(changes)
  return args

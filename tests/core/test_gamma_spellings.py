"""One γ for every entry point: `generate`, `beam_search`, `verify`'s
arguments, the eval settings and `spec-decode verify`'s `--gammas` accept
the same spellings (an int >= 1 as an int or its text, 'auto' in any case
with whitespace) and refuse the rest with one text
(`core.inputs.parse_gamma`), before anything compiles."""

import numpy as np
import pytest
from conftest import tiny_config

import spec_decode as sd
from spec_decode.check import pair
from spec_decode.core import inputs
from spec_decode.eval import settings as eval_settings
from spec_decode.eval import verify_cli

GOOD = [(4, 4), ('4', 4), (' 4 ', 4), (np.int32(4), 4), ('auto', 'auto'),
        (' Auto ', 'auto'), ('AUTO', 'auto')]  # fmt: skip
GIN = 'gin/models/t5_1_1/tiny.gin'
BAD = [0, -1, '0', 'fast', '', ' ', 2.5, True, None, '4.0', 'auto4']


def _message(name, value):
  return f"{name} must be an int >= 1 or 'auto', got {value!r}"


@pytest.mark.parametrize('value,want', GOOD)
def test_the_spellings_every_entry_point_accepts(value, want):
  assert inputs.parse_gamma(value) == want
  settings = eval_settings.EvalSettings(task='synthetic_tiny', gamma=value)
  assert settings.gamma == (want if want == 'auto' else (want,))
  pair.validate(**_verify_args(gammas=[value]))


@pytest.mark.parametrize('value', BAD)
def test_the_spellings_every_entry_point_refuses_with_one_text(value):
  with pytest.raises(ValueError) as e:
    inputs.parse_gamma(value)
  assert str(e.value) == _message('gamma', value)
  with pytest.raises(ValueError) as e:
    eval_settings.EvalSettings(task='synthetic_tiny', gamma=value)
  assert _message('gamma', value) in str(e.value)
  with pytest.raises(ValueError) as e:
    pair.validate(**_verify_args(gammas=[value]))
  assert str(e.value) == _message('gammas', value)


@pytest.fixture(scope='module')
def model():
  return sd.Model.init(tiny_config(), seed=0)


@pytest.mark.parametrize('value', BAD)
def test_generate_and_beam_search_refuse_them_alike(model, value):
  enc = np.full((1, 4), 3, np.int32)
  for decode in (sd.generate, sd.beam_search):
    with pytest.raises(ValueError) as e:
      decode(model, enc, draft=model, gamma=value, max_decode_len=2)
    assert str(e.value) == _message('gamma', value), decode.__name__


def test_generate_and_beam_search_read_auto_in_any_case(model):
  """Without a draft the γ is read and checked, then unused (no decode at
  'auto' has to run to show the spelling is accepted)."""
  enc = np.full((1, 4), 3, np.int32)
  for value in (' Auto ', 'AUTO', '2'):
    sd.generate(model, enc, gamma=value, max_decode_len=2)
    sd.beam_search(model, enc, gamma=value, num_beams=2, max_decode_len=2)


def test_the_verify_command_line_reads_gammas_alike():
  parser = verify_cli._parser()
  gin = ['--target_gin_file', GIN, '--draft_gin_file', GIN]
  args = parser.parse_args([*gin, '--gammas', '1, Auto ,3'])
  assert verify_cli._checked(args)['settings']['gammas'] == (1, 'auto', 3)
  bad = parser.parse_args([*gin, '--gammas', '1,fast'])
  with pytest.raises(verify_cli._BadArguments) as e:
    verify_cli._checked(bad)
  assert _message('--gammas', 'fast') in str(e.value)


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

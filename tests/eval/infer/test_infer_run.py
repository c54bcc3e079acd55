"""Infer runs on tiny random models: eval parity, file inputs, resume.

The target and draft are `configs/smoke_synthetic.gin`'s (random T5 v1.1
"tiny", seeds 0 and 1) on the synthetic_tiny task, as tests/eval/test_run.py
uses them, so the loops compile once per shape for the module.
"""

import json
import os
import subprocess
import sys

import pytest

from spec_decode.eval import run as eval_lib
from spec_decode.eval.infer import chunks
from spec_decode.eval.infer import run as infer_lib

TASK = 'synthetic_tiny'
COMMON = dict(num_examples=5, batch_size=2, max_decode_len=12, max_input_len=32)
RUN = dict(progress=False)


@pytest.fixture(scope='module')
def models():
  vocab = eval_lib.task_vocabulary(TASK, vocab_size=64)
  tiny = 'models/t5_1_1/tiny.gin'
  target = eval_lib.load_model(model_gin=tiny, seed=0, vocabulary=vocab)
  draft = eval_lib.load_model(model_gin=tiny, seed=1, vocabulary=vocab)
  return target, draft


def _settings(**changes):
  return infer_lib.InferSettings(
    **{'task': TASK, 'gamma': 3, 'checkpoint_period': 1, **COMMON, **changes}
  )


def _lines(out, task=TASK, mode='predict'):
  path = os.path.join(out, infer_lib.predictions_file(task, mode))
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope='module')
def full(models, tmp_path_factory):
  out = str(tmp_path_factory.mktemp('full'))
  summary = infer_lib.infer(*models, _settings(), output_dir=out, **RUN)
  return out, summary


def test_greedy_predictions_equal_an_eval_runs_plain_ones(
  models, full, tmp_path
):
  out, summary = full
  evaluated = str(tmp_path / 'eval')
  settings = eval_lib.EvalSettings(
    task=TASK, gamma=3, timing_repeats=1, timing_rounds=1, **COMMON
  )
  eval_lib.evaluate(
    *models, settings, output_dir=evaluated, progress=False,
    print_summary=False,
  )  # fmt: skip
  with open(os.path.join(evaluated, eval_lib.EXAMPLES_FILE)) as f:
    plain = [json.loads(line)['plain'] for line in f]
  lines = _lines(out)
  assert [x['prediction'] for x in lines] == plain
  assert lines[0]['inputs']['inputs_pretokenized'].startswith('translate ')
  assert list(lines[0]) == ['inputs', 'prediction']
  # The summary beside the predictions; the chunks are gone, as in T5X.
  assert summary['examples'] == 5 and summary['target_calls'] > 0
  assert summary['tokens_per_call'] == pytest.approx(
    summary['tokens'] / summary['target_calls']
  )
  assert 0 <= summary['alpha'] <= 1 and 0 <= summary['no_eos_fraction'] <= 1
  assert summary['files'] == [infer_lib.predictions_file(TASK, 'predict')]
  assert not os.path.exists(os.path.join(out, chunks.TMP_DIR))
  assert os.path.exists(
    os.path.join(out, infer_lib.predictions_file(TASK, 'predict'))
    + chunks.COMPLETED
  )


def test_an_interrupted_run_resumes_giving_every_line_once(
  models, full, tmp_path
):
  out = str(tmp_path / 'resumed')

  class Interrupt(Exception):
    pass

  def stop(done):
    if done >= 2:
      raise Interrupt

  with pytest.raises(Interrupt):
    infer_lib.infer(*models, _settings(), output_dir=out,
                    on_chunk_done=stop, **RUN)  # fmt: skip
  assert chunks.chunks_done(out) == 1
  # A crash inside the next chunk's write leaves only its aside copy.
  with open(chunks.chunk_path(out, 1) + '.tmp', 'w') as f:
    f.write('{"index": 2, "ta')
  seen = []
  infer_lib.infer(*models, _settings(), output_dir=out,
                  on_chunk_done=seen.append, **RUN)  # fmt: skip
  assert seen == [4, 5]  # Only the chunks not written were decoded.
  assert _lines(out) == _lines(full[0])
  # Complete: a rerun decodes nothing.
  again = []
  infer_lib.infer(*models, _settings(), output_dir=out,
                  on_chunk_done=again.append, **RUN)  # fmt: skip
  assert again == [] and _lines(out) == _lines(full[0])
  with pytest.raises(ValueError, match='other settings'):
    infer_lib.infer(*models, _settings(seed=3), output_dir=out, **RUN)


BAD = [
  'translate English to German: the red dog .'.encode(),
  b'',
  b'translate English to German: a \xff cat .',
  ('translate English to German: ' + 'the old tree ' * 20).encode(),
  'translate English to German: a small bird .'.encode(),
]


def _file(tmp_path, lines, name='inputs.txt'):
  path = tmp_path / name
  path.write_bytes(b'\n'.join(lines) + b'\n')
  return str(path)


def test_a_text_file_trims_bad_lines_seqio_style_in_input_order(
  models, full, tmp_path
):
  path = _file(tmp_path, BAD)
  out = str(tmp_path / 'out')
  s = _settings(task=None, input_file=path, num_examples=None)
  summary = infer_lib.infer(*models, s, output_dir=out, **RUN)
  lines = _lines(out, task='inputs')
  assert summary['examples'] == 5
  texts = [x['inputs']['inputs_pretokenized'] for x in lines]
  assert texts[0] == BAD[0].decode() and texts[1] == ''
  assert texts[2] == 'translate English to German: a \ufffd cat .'
  assert texts[3] == BAD[3].decode()  # Written whole; its ids were cut.
  # The same input as a task example gives the same prediction.
  by_input = {x['inputs']['inputs_pretokenized']: x for x in _lines(full[0])}
  for x in lines:
    if x['inputs']['inputs_pretokenized'] in by_input:
      assert (
        x['prediction']
        == by_input[x['inputs']['inputs_pretokenized']]['prediction']
      )


@pytest.mark.parametrize(
  'line,problem', [(2, 'empty input'), (3, 'not UTF-8'), (4, 'longer than')]
)
def test_a_bad_line_fails_naming_it(models, tmp_path, line, problem):
  lines = [BAD[0]] * 5
  lines[line - 1] = BAD[line - 1]
  path = _file(tmp_path, lines)
  s = _settings(task=None, input_file=path, bad_lines='fail')
  with pytest.raises(ValueError, match=f'inputs.txt:{line}: .*{problem}'):
    infer_lib.infer(*models, s, output_dir=str(tmp_path / 'o'), **RUN)


def test_a_jsonl_file_keeps_ids_and_writes_scores_tokens_provenance(
  models, tmp_path
):
  rows = [
    {'id': f'ex{k}', 'text': BAD[k].decode(), 'other': k} for k in (4, 0, 4)
  ]
  path = _file(
    tmp_path, [json.dumps(r).encode() for r in rows], name='batch.jsonl'
  )
  out = str(tmp_path / 'out')
  s = _settings(
    task=None, input_file=path, input_field='text', id_field='id',
    mode='predict_with_aux', provenance=True, output_ids=True,
  )  # fmt: skip
  infer_lib.infer(*models, s, output_dir=out, **RUN)
  lines = _lines(out, task='batch', mode='predict_with_aux')
  assert [x['inputs']['id'] for x in lines] == ['ex4', 'ex0', 'ex4']
  assert lines[0]['prediction'] == lines[2]['prediction']
  for x in lines:
    assert list(x) == ['inputs', 'prediction', 'prediction_tokens', 'aux']
    n = len(x['prediction_tokens'])
    assert 1 <= n <= 12 and len(x['aux']['provenance']) == n
    assert x['aux']['scores'] < 0


@pytest.mark.parametrize(
  'changes',
  [
    dict(tree=(2, 1)),
    # The policy measures its cost model first (about 45 s here).
    pytest.param(dict(gamma='auto', max_auto_gamma=2), marks=pytest.mark.slow),
    dict(decode_method='beam', num_beams=1, gamma=2),
  ],
  ids=['tree', 'auto', 'beam1'],
)
def test_trees_auto_gamma_and_one_beam_give_the_greedy_predictions(
  models, full, tmp_path, changes
):
  out = str(tmp_path / 'out')
  s = _settings(checkpoint_period=100, **changes)
  summary = infer_lib.infer(*models, s, output_dir=out, **RUN)
  assert _lines(out) == _lines(full[0])
  assert summary['decode_method'] == s.method


def test_sampling_with_per_example_seeds_repeats_and_depends_on_the_seed(
  models, tmp_path
):
  def run(name, seed):
    out = str(tmp_path / name)
    s = _settings(temperature=1.0, seed=seed, checkpoint_period=100)
    infer_lib.infer(*models, s, output_dir=out, **RUN)
    return [x['prediction'] for x in _lines(out)]

  first = run('a', 0)
  assert run('b', 0) == first
  assert run('c', 7) != first


def test_no_draft_decodes_plainly_into_the_same_files(models, full, tmp_path):
  """The job without a draft (the bench's plain side): the same greedy
  predictions, one target call per token, no draft token tested."""
  out = str(tmp_path / 'plain')
  summary = infer_lib.infer(models[0], None, _settings(), output_dir=out, **RUN)
  assert [x['prediction'] for x in _lines(out)] == [
    x['prediction'] for x in _lines(full[0])
  ]
  assert summary['target_calls'] == summary['tokens']
  assert summary['tokens_per_call'] == 1.0 and summary['alpha'] is None


def test_a_page_draws_the_first_predictions_as_figure_1(models, tmp_path):
  out = str(tmp_path / 'page')
  infer_lib.infer(*models, _settings(page_examples=2), output_dir=out, **RUN)
  with open(os.path.join(out, 'examples.html'), encoding='utf-8') as f:
    page = f.read()
  assert page.count('class="ex"') == 2 and '#0 ·' in page and '#1 ·' in page
  assert 'class="it"' in page  # A bar per target call, from provenance.
  assert 'accepted draft token' in page  # The legend.
  with pytest.raises(ValueError, match='page_examples'):
    _settings(page_examples=-1)


def test_a_file_of_inputs_needs_no_seqio(tmp_path):
  """A process where seqio and TensorFlow cannot be imported (as after `make
  install EXTRAS=test,hf,metrics`) runs `spec-decode infer` on a text file
  with random tiny models."""
  path = tmp_path / 'in.txt'
  path.write_text('translate English to German: the cat .\nthe dog .\n')
  out = tmp_path / 'out'
  argv = [
    '--gin_file=smoke_synthetic',
    '--gin.MAX_DECODE_LEN=6',
    f'--gin.INPUT_FILE={str(path)!r}',
    f'--output_dir={out}',
    '--no_progress',
  ]
  script = (
    'import sys\n'
    "sys.modules['seqio'] = None\n"  # `import seqio` now raises.
    "sys.modules['tensorflow'] = None\n"
    'from spec_decode.eval.infer import cli\n'
    f'sys.exit(cli.main({argv!r}))\n'
  )
  proc = subprocess.run(
    [sys.executable, '-c', script],
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = _lines(str(out), task='in')
  assert len(lines) == 2 and lines[1]['inputs']['inputs_pretokenized'] == (
    'the dog .'
  )

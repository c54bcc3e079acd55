"""Tests of the task abstraction: Debian TSV readers and the synthetic task."""

import itertools

import pytest

from spec_decode.data import debian
from spec_decode.data import quality
from spec_decode.data import tasks


def _write_split(root, subdir, split, rows, header=True):
  path = root / subdir / f'{split}.tsv'
  path.parent.mkdir(parents=True, exist_ok=True)
  lines = (['id\tsource\ttarget'] if header else []) + [
    '\t'.join(r) for r in rows
  ]
  path.write_text('\n'.join(lines) + '\n', encoding='utf-8')
  return path


def test_prefixes_are_t5s():
  assert tasks.TRANSLATE_EN_DE_PREFIX == 'translate English to German: '
  assert tasks.SUMMARIZE_PREFIX == 'summarize: '


def test_task_names_and_metrics():
  names = tasks.task_names()
  for name, metric, prefix in [
    ('debian_ende', 'bleu', tasks.TRANSLATE_EN_DE_PREFIX),
    ('debian_summarize', 'rouge', tasks.SUMMARIZE_PREFIX),
    ('wmt_t2t_ende_v003', 'bleu', tasks.TRANSLATE_EN_DE_PREFIX),
    ('cnn_dailymail_v002', 'rouge', tasks.SUMMARIZE_PREFIX),
    ('synthetic_tiny', 'bleu', tasks.TRANSLATE_EN_DE_PREFIX),
    ('synthetic_tiny_summarize', 'rouge', tasks.SUMMARIZE_PREFIX),
  ]:
    assert name in names
    task = tasks.get_task(name)
    assert (task.name, task.metric, task.input_prefix) == (name, metric, prefix)
  with pytest.raises(ValueError, match='Unknown task'):
    tasks.get_task('no_such_task')


def test_task_rejects_unknown_metric():
  with pytest.raises(ValueError, match='unknown metric'):
    tasks.Task('t', lambda split: [], '', 'meteor')


def test_debian_reader_adds_prefix_and_limits(tmp_path):
  rows = [('a:s', 'Hello world', 'Hallo Welt'), ('b:s', 'Yes', 'Ja')]
  _write_split(tmp_path, 'ende', 'test', rows)
  task = tasks.get_task('debian_ende', data_dir=str(tmp_path))
  got = list(tasks.examples(task, 'test'))
  prefix = 'translate English to German: '
  assert got == [
    {'inputs': prefix + 'Hello world', 'targets': 'Hallo Welt'},
    {'inputs': prefix + 'Yes', 'targets': 'Ja'},
  ]
  assert list(tasks.examples(task, 'test', limit=1)) == got[:1]
  assert all(set(ex) == {'inputs', 'targets'} for ex in got)


def test_debian_summarize_reader(tmp_path):
  _write_split(tmp_path, 'summarize', 'validation', [('m', 'Long text.', 'S')])
  task = tasks.get_task('debian_summarize', data_dir=str(tmp_path))
  assert list(tasks.examples(task, 'validation')) == [
    {'inputs': 'summarize: Long text.', 'targets': 'S'}
  ]


def test_debian_reader_uses_env_data_dir(tmp_path, monkeypatch):
  _write_split(tmp_path, 'ende', 'train', [('x', 'One', 'Eins')], header=False)
  monkeypatch.setenv(debian.DATA_DIR_ENV, str(tmp_path))
  got = list(tasks.examples('debian_ende', 'train'))
  assert got == [
    {'inputs': 'translate English to German: One', 'targets': 'Eins'}
  ]


def test_debian_reader_rejects_malformed_rows(tmp_path):
  path = _write_split(tmp_path, 'ende', 'test', [('only', 'two')])
  task = tasks.get_task('debian_ende', data_dir=str(tmp_path))
  with pytest.raises(ValueError, match=f'{path}:2'):
    list(tasks.examples(task, 'test'))


def test_missing_debian_data_says_how_to_build(tmp_path):
  task = tasks.get_task('debian_ende', data_dir=str(tmp_path / 'none'))
  with pytest.raises(FileNotFoundError) as err:
    next(tasks.examples(task, 'test'))
  build = f'spec-decode data build --out_dir {tmp_path / "none"}'
  assert build in str(err.value)


def test_reads_what_the_builder_writes(tmp_path):
  lists = tmp_path / 'lists'
  lists.mkdir()
  stanza = (
    'Package: p{i}\nDescription-md5: {i:032x}\n'
    'Description-{lang}: {syn}\n {body}\n'
  )
  en = '\n'.join(
    stanza.format(i=i, lang='en', syn=f'tool {i}', body=f'Tool {i} works.')
    for i in range(20)
  )
  de = '\n'.join(
    stanza.format(
      i=i, lang='de', syn=f'Werkzeug {i}', body=f'Werkzeug {i} geht.'
    )
    for i in range(20)
  )
  (lists / 'm_i18n_Translation-en').write_text(en, encoding='utf-8')
  (lists / 'm_i18n_Translation-de').write_text(de, encoding='utf-8')
  out = tmp_path / 'data'
  manifest = debian.build(str(out), str(lists))
  for name, kind in (
    ('debian_ende', 'ende'),
    ('debian_summarize', 'summarize'),
  ):
    task = tasks.get_task(name, data_dir=str(out))
    got = [ex for s in tasks.SPLITS for ex in tasks.examples(task, s)]
    assert len(got) == sum(manifest['counts'][kind].values())
  ende = tasks.get_task('debian_ende', data_dir=str(out))
  pairs = {
    ex['inputs']: ex['targets']
    for s in tasks.SPLITS
    for ex in tasks.examples(ende, s)
  }
  assert len(pairs) == 40
  assert pairs['translate English to German: Tool 7 works.'] == (
    'Werkzeug 7 geht.'
  )


def test_synthetic_task_is_deterministic():
  task = tasks.get_task('synthetic_tiny')
  first = list(tasks.examples(task, 'validation'))
  again = list(tasks.examples(tasks.get_task('synthetic_tiny'), 'validation'))
  assert first == again
  assert len(first) == tasks.SYNTHETIC_SIZES['validation']
  assert len({ex['inputs'] for ex in first}) > len(first) // 2
  test = list(tasks.examples(task, 'test'))
  assert test != first
  for ex in first:
    source = ex['inputs'].removeprefix(tasks.TRANSLATE_EN_DE_PREFIX)
    assert ex['inputs'].startswith(tasks.TRANSLATE_EN_DE_PREFIX)
    assert ex['targets'] == tasks.fake_translation(source)
    assert len(source.split()) == len(ex['targets'].split())
    assert 5 <= len(source.split()) <= 12


def test_synthetic_prefix_does_not_depend_on_size():
  small = tasks.synthetic_task('ende', sizes={'train': 5})
  big = tasks.synthetic_task('ende', sizes={'train': 50})
  assert list(tasks.examples(small, 'train')) == list(
    itertools.islice(tasks.examples(big, 'train'), 5)
  )
  with pytest.raises(ValueError, match='Unknown split'):
    list(tasks.examples(small, 'test'))


def test_synthetic_summarize_targets_the_first_sentence():
  for ex in tasks.examples('synthetic_tiny_summarize', 'test', limit=10):
    source = ex['inputs'].removeprefix(tasks.SUMMARIZE_PREFIX)
    assert ex['inputs'].startswith('summarize: ')
    assert source.startswith(ex['targets'])
    assert len(source) > len(ex['targets'])


def test_metric_of_a_task_scores_its_references():
  for name in ('synthetic_tiny', 'synthetic_tiny_summarize'):
    task = tasks.get_task(name)
    refs = [ex['targets'] for ex in tasks.examples(task, 'test')]
    scores = quality.compute(task.metric, refs, refs)
    for value in scores.values():
      assert value == pytest.approx(100.0)


def test_tfds_task_constructs_without_tensorflow():
  task = tasks.get_task('wmt_t2t_ende_v003', data_dir='/nonexistent')
  assert callable(task.split_reader)
  try:
    import tensorflow_datasets  # noqa: F401
  except ImportError:
    with pytest.raises(ImportError, match='tensorflow-datasets'):
      next(tasks.examples(task, 'test'))

"""`spec-decode train pair` rehearsed on the CPU, and its pieces.

The rehearsal is the GPU job's own command at toy sizes (`--tiny`): a
data pack of synthetic Debian-shaped splits, both training stages as child
processes, the models returned as tar parts within the device tool's
limits (at most 8 files of at most 16 MiB, at most 2 folders down), then
reassembled here, loaded with `sd.Model.load` and decoded.
"""

import json
import os
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest

import spec_decode as sd
from spec_decode.data import pack as pack_lib
from spec_decode.data import tasks
from spec_decode.train import pair_job
from spec_decode.train import parts

SIZES = {'train': 96, 'validation': 16, 'test': 8}


def _fake_data(root):
  """A `spec-decode data build` directory of synthetic pairs."""
  for kind in ('ende', 'summarize'):
    os.makedirs(root / kind)
    for split in SIZES:
      rows = tasks.synthetic_reader(kind, SIZES)(split)
      with open(root / kind / f'{split}.tsv', 'w') as f:
        f.write('id\tsource\ttarget\n')
        for i, (source, target) in enumerate(rows):
          f.write(f'{kind}-{split}-{i}\t{source}\t{target}\n')
  (root / 'manifest.json').write_text('{"builder": "test"}')
  return root


def test_pack_holds_the_train_splits_and_is_deterministic(tmp_path):
  data = _fake_data(tmp_path / 'debian')
  one, two = tmp_path / 'a.tar.xz', tmp_path / 'b.tar.xz'
  assert pack_lib.main(['--data_dir', str(data), '--out', str(one)]) == 0
  pack_lib.pack(str(data), str(two))
  assert one.read_bytes() == two.read_bytes()
  with tarfile.open(one) as tar:
    names = sorted(tar.getnames())
  assert names == [
    'debian/ende/train.tsv',
    'debian/ende/validation.tsv',
    'debian/manifest.json',
    'debian/pack.json',
    'debian/summarize/train.tsv',
    'debian/summarize/validation.tsv',
  ]
  data_dir = pack_lib.unpack(str(one), str(tmp_path / 'x'))
  task = tasks.get_task('debian_summarize', data_dir)
  assert len(list(tasks.examples(task, 'validation', None))) == 16
  info = json.loads((tmp_path / 'x' / 'debian' / 'pack.json').read_text())
  assert info['files']['ende/train.tsv']['examples'] == 96


def test_pack_says_how_to_build_missing_data(tmp_path, capsys):
  assert pack_lib.main(['--data_dir', str(tmp_path), '--out', 'x']) == 1
  assert 'spec-decode data build' in capsys.readouterr().err


def _stage(root, name, size):
  stage = root / name
  (stage / 'model' / 'params').mkdir(parents=True)
  (stage / 'model' / 'config.json').write_text('{}')
  (stage / 'model' / 'params' / 'w').write_bytes(os.urandom(size))
  (stage / 'train_log.jsonl').write_text('{"step": 1}\n')
  (stage / 'checkpoints').mkdir()
  (stage / 'checkpoints' / 'big').write_bytes(b'0' * 1000)
  return str(stage)


def test_parts_split_join_and_check(tmp_path):
  stages = {
    'target_gpu': _stage(tmp_path, 'target_gpu', 40000),
    'draft_gpu': _stage(tmp_path, 'draft_gpu', 30000),
  }
  out = tmp_path / 'out'
  out.mkdir()
  written = parts.write_parts(stages, str(out), part_bytes=16384, max_parts=10)
  assert written['models'] == ['target_gpu', 'draft_gpu']
  assert len(written['parts']) == -(-written['tar_bytes'] // 16384) > 2
  assert all(p['bytes'] <= 16384 for p in written['parts'])
  (out / 'summary.json').write_text(json.dumps({'outputs': written}))
  models = parts.reassemble(str(out), str(tmp_path / 'runs'))
  for name, path in models.items():
    want = tmp_path / name / 'model' / 'params' / 'w'
    got = open(os.path.join(path, 'params', 'w'), 'rb').read()
    assert got == want.read_bytes()
    assert not os.path.exists(os.path.join(path, '..', 'checkpoints'))
  with pytest.raises(ValueError, match='exists'):
    parts.reassemble(str(out), str(tmp_path / 'runs'))
  part = out / written['parts'][1]['name']
  part.write_bytes(b'x' + part.read_bytes()[1:])
  with pytest.raises(ValueError, match='sha256'):
    parts.reassemble(str(out), str(tmp_path / 'runs'), force=True)
  # Too many parts for the machine: the last stage is left out.
  few = parts.write_parts(stages, str(out), part_bytes=16384, max_parts=4)
  assert (few['models'], few['left_out']) == (['target_gpu'], ['draft_gpu'])
  none = parts.write_parts(stages, str(tmp_path), part_bytes=16384, max_parts=1)
  assert (none['models'], none['parts']) == ([], [])


def _child(tmp_path, code):
  script = tmp_path / 'child.py'
  script.write_text(code)
  return [sys.executable, str(script)]


@pytest.mark.parametrize('loop_started', [False, True])
def test_a_stage_past_its_end_is_stopped(tmp_path, monkeypatch, loop_started):
  monkeypatch.setattr(pair_job, 'KILL_GRACE_S', 0.5)
  code = (
    'import signal, sys, time\n'
    'signal.signal(signal.SIGTERM, lambda *a: sys.exit(130))\n'
    + (
      "print('train: 5 parameters; starting at step 0 of 9', flush=True)\n"
      if loop_started
      else ''
    )
    + 'time.sleep(60)\n'
  )
  job = pair_job.Job(str(tmp_path / 'out'), 10.0)
  record = {}
  t = time.time()
  code = pair_job.run_child(
    job, 'stage', _child(tmp_path, code), time.time() + 0.5, record
  )
  assert time.time() - t < 10
  if loop_started:
    # SIGTERM, which the training loop answers by exporting.
    assert (code, record['killed']) == (130, 'SIGTERM')
    assert 'loop_started_s' in record
  else:
    assert record['killed'] == 'before its loop' and code < 0
  job.log.close()


def test_the_tiny_rehearsal_end_to_end(tmp_path):
  """The GPU command itself (`launch_gpu.sh train`) at toy sizes."""
  data = _fake_data(tmp_path / 'debian')
  pack = tmp_path / 'demo_train.tar.xz'
  pack_lib.pack(str(data), str(pack))
  out = tmp_path / 'out'
  env = dict(
    os.environ,
    OUT=str(out),
    PY=sys.executable,
    PLATFORM='cpu',
    PACK=str(pack),
    BUDGET='180',
    FLAGS=f'--tiny --work_dir {tmp_path / "work"}',
  )
  root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  job = subprocess.run(
    ['bash', 'launch_gpu.sh', 'train'], cwd=root, env=env, timeout=400
  )
  assert job.returncode == 0
  # What the device tool returns: at most 8 files of at most 16 MiB, at
  # most 2 folders down.
  files = [os.path.join(d, f) for d, _, names in os.walk(out) for f in names]
  assert 3 <= len(files) <= 8
  assert all(os.path.getsize(f) <= 16 * 2**20 for f in files)
  assert all(os.path.relpath(f, out).count(os.sep) <= 2 for f in files)
  summary = json.loads((out / 'summary.json').read_text())
  assert summary['status'] == 'done'
  for name in ('target', 'draft'):
    stage = summary['stages'][name]
    assert (stage['stopped'], stage['step'], stage['exported']) == (
      'done',
      6,
      True,
    )
    assert np.isfinite(stage['validation_loss'])
    assert stage['started_s'] < stage['loop_started_s'] < stage['ended_s']
  assert summary['outputs']['models'] == ['target_gpu', 'draft_gpu']

  models = parts.reassemble(str(out), str(tmp_path / 'runs'))
  assert (tmp_path / 'runs' / 'pair_summary.json').is_file()
  target = sd.Model.load(models['target_gpu'])
  draft = sd.Model.load(models['draft_gpu'])
  assert target.config.emb_dim == draft.config.emb_dim == 32
  vocab = target.vocabulary
  enc = np.asarray(
    [
      vocab.encode(tasks.TRANSLATE_EN_DE_PREFIX + 'the package')
      + [vocab.eos_id]
    ],
    np.int32,
  )
  plain = sd.generate(target, enc, max_decode_len=8)
  spec = sd.generate(target, enc, draft=draft, gamma=2, max_decode_len=8)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)

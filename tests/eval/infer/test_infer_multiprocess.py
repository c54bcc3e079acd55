"""`spec-decode infer` over two processes (4 host devices each, one 2 x 4
mesh: NUM_PARTITIONS=2) writes the same predictions as one process with one
device, and only process 0 writes. Starting JAX in three processes takes
minutes on two cores: marked `multiprocess` (`make test-slow`), as the
eval's multi-process tests (tests/eval/test_multiprocess_eval.py)."""

import os
import subprocess
import sys

import _process_util as process_util
import pytest

from spec_decode.eval.infer import run as infer_lib

COMMAND = [sys.executable, '-m', 'spec_decode.main', 'infer']


def _flags(pair, out, *extra):
  return process_util.smoke_flags(
    pair, out, '--gin.CHECKPOINT_PERIOD=1', '--gin.PROVENANCE=True', *extra
  )


def _lines(out):
  path = os.path.join(
    out, infer_lib.predictions_file('synthetic_tiny', 'predict')
  )
  with open(path, encoding='utf-8') as f:
    return f.read()


@pytest.mark.multiprocess
def test_two_processes_write_the_one_process_predictions(tmp_path):
  pair = process_util.tiny_pair(str(tmp_path / 'pair'))
  single = str(tmp_path / 'single')
  proc = subprocess.run(
    [*COMMAND, *_flags(pair, single)],
    env=process_util.env(1),
    cwd=process_util.REPO,
    capture_output=True,
    text=True,
    timeout=process_util.RUN_TIMEOUT_SECONDS,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  outs = [str(tmp_path / 'p0'), str(tmp_path / 'p1')]
  codes, logs = process_util.finish(
    process_util.start_pair(
      COMMAND, lambda i: _flags(pair, outs[i], '--gin.NUM_PARTITIONS=2')
    )
  )
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  # Byte for byte: text, order and each token's provenance.
  assert _lines(outs[0]) == _lines(single)
  assert _lines(single).count('\n') == 10
  # Only process 0 writes (each was given its own directory, as on hosts
  # with their own disks).
  assert not os.path.exists(outs[1]) or not os.listdir(outs[1])

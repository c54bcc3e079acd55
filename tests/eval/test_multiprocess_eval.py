"""Partitioned and multi-process eval runs, as real `spec-decode eval` runs.

The device count of a process is fixed when JAX starts, so every run here is
a subprocess: `spec-decode eval` with `--xla_force_host_platform_device_count`
host devices. The models are a tiny random target and a draft close to it,
written as checkpoints to a temporary directory, so that both are read
straight into their shards.

* `test_partitioned_run_equals_unsharded`: NUM_PARTITIONS=4 on 8 devices (a
  2 x 4 mesh) gives the same records and results as the one-device run.
* The `multiprocess` tests run two processes of 4 host devices each, joined
  by a coordinator on 127.0.0.1 (gloo collectives): the same results as one
  process, only process 0 writes, and each process read only its share of
  the examples (the rows its devices hold: 6 and 4 of 10); a process killed
  mid-run makes the other stop with JAX's "another task died" message
  within the heartbeat timeout, and rerunning both resumes; SIGTERM to the
  coordinator (process 0) ends it at once with a message and the other
  stops within the heartbeat timeout too.

Every one of these starts JAX several times and takes one to three minutes on
two cores, so all are marked `multiprocess`: `make test` leaves them out
(`-m "not multiprocess"`), `make test-slow` runs them.
"""

import json
import os
import signal
import subprocess
import sys
import time

import _process_util as process_util
import pytest

from spec_decode.eval import report
from spec_decode.eval import run as eval_lib
from spec_decode.eval import t5x_run_cli

REPO = process_util.REPO
HEARTBEAT_SECONDS = process_util.HEARTBEAT_SECONDS
# A killed peer is noticed after the heartbeat timeout; what is left is the
# survivor's start-up and shutdown on a loaded machine.
DEATH_DEADLINE_SECONDS = 120
RUN_TIMEOUT_SECONDS = process_util.RUN_TIMEOUT_SECONDS
# Figures that depend on the mesh, not on the decoded tokens.
MESH_KEYS = ('mesh', 'num_processes', 'memory')


@pytest.fixture(scope='module')
def pair(tmp_path_factory):
  """Checkpoints of a tiny target and a draft close to it."""
  return process_util.tiny_pair(str(tmp_path_factory.mktemp('pair')))


def _flags(pair, out, *extra):
  return process_util.smoke_flags(
    pair, out, '--gin.TIMING_REPEATS=1', '--gin.TIMING_ROUNDS=1', *extra
  )


_env = process_util.env


def _eval_command(flags):
  return [sys.executable, '-m', 'spec_decode.main', 'eval', *flags]


def _results(out):
  with open(os.path.join(out, eval_lib.RESULTS_FILE), encoding='utf-8') as f:
    results = json.load(f)
  return results


def _records(out):
  with open(os.path.join(out, eval_lib.EXAMPLES_FILE), encoding='utf-8') as f:
    return [report.strip_timings(json.loads(line)) for line in f]


def _tokens_figures(results):
  """results.json without timings and mesh figures."""
  stripped = report.strip_timings(results)
  return {k: v for k, v in stripped.items() if k not in MESH_KEYS}


@pytest.fixture(scope='module')
def single_runs(pair, tmp_path_factory):
  """One process with 8 host devices: unsharded, then NUM_PARTITIONS=4."""
  root = tmp_path_factory.mktemp('single')
  plain, sharded = str(root / 'unsharded'), str(root / 'sharded')
  partitioned = _flags(pair, sharded, '--gin.NUM_PARTITIONS=4')
  script = (
    'from spec_decode.eval import cli\n'
    f'assert cli.main({_flags(pair, plain)!r}) == 0\n'
    f'assert cli.main({partitioned!r}) == 0\n'
  )
  proc = subprocess.run(
    [sys.executable, '-c', script],
    env=_env(8),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=RUN_TIMEOUT_SECONDS,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return plain, sharded


@pytest.mark.multiprocess
def test_partitioned_run_equals_unsharded(single_runs):
  plain, sharded = single_runs
  a, b = _results(plain), _results(sharded)
  assert a['mesh'] == {'data': 1, 'model': 1} and a['num_processes'] == 1
  assert b['mesh'] == {'data': 2, 'model': 4} and b['num_processes'] == 1
  assert _records(plain) == _records(sharded)
  assert _tokens_figures(a) == _tokens_figures(b)
  # Bytes per device: the target's weights split 4 ways (a few small
  # tensors stay whole), the draft replicated; caches split by rows and
  # heads.
  one, four = a['memory'], b['memory']
  assert one['target_params'] / 4 <= four['target_params']
  assert four['target_params'] < one['target_params'] / 3
  assert four['draft_params'] == one['draft_params']
  assert four['target_cache'] < one['target_cache']
  # Not vacuous: the draft is close to the target but not equal to it.
  assert 0.0 < a['alpha'] < 1.0 and a['exact_match_fraction'] == 1.0


def test_t5x_partitioner_bindings_set_the_mesh_macros():
  out = t5x_run_cli.translate([
    'partitioning.PjitPartitioner.num_partitions = 4',
    'partitioning.PjitPartitioner.model_parallel_submesh = (1, 1, 2, 2)',
  ])  # fmt: skip
  assert out == [
    'NUM_PARTITIONS = 4',
    'MODEL_PARALLEL_SUBMESH = (1, 1, 2, 2)',
  ]


# -- two processes ----------------------------------------------------------


def _start_pair(pair, outs, *extra):
  """Two `spec-decode eval` processes (4 host devices each), one mesh."""
  return process_util.start_pair(
    [sys.executable, '-m', 'spec_decode.main', 'eval'],
    lambda i: _flags(pair, outs[i], '--gin.NUM_PARTITIONS=2', *extra),
  )


_finish = process_util.finish


@pytest.mark.multiprocess
def test_two_processes_give_the_single_process_results(
  pair, single_runs, tmp_path
):
  plain, _ = single_runs
  outs = [str(tmp_path / 'p0'), str(tmp_path / 'p1')]
  codes, logs = _finish(_start_pair(pair, outs))
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  # Only process 0 writes (each process was given its own directory, as
  # on hosts with their own disks).
  assert not os.path.exists(outs[1]) or not os.listdir(outs[1])
  one, two = _results(plain), _results(outs[0])
  assert two['mesh'] == {'data': 4, 'model': 2} and two['num_processes'] == 2
  assert _records(plain) == _records(outs[0])
  for key in ('exact_match_fraction', 'alpha', 'quality', 'num_examples'):
    assert one[key] == two[key], key
  assert _tokens_figures(one) == _tokens_figures(two)
  # Each read its share: batch rows 0-1 (process 0) and 2-3 (process 1) of
  # 4, i.e. examples 0, 1, 4, 5, 8, 9 and 2, 3, 6, 7.
  for p, (rows, count) in enumerate((([0, 1], 6), ([2, 3], 4))):
    share = f'process {p} of 2 read {count} of 10 examples (batch rows {rows}'
    assert share in logs[p], logs[p][-3000:]


def _pause_file(tmp_path):
  """After each batch both processes sleep len(records) seconds: time to
  stop one while the run is under way."""
  pause = tmp_path / 'pause.gin'
  pause.write_text(
    'from __gin__ import dynamic_registration\n'
    'import time\n'
    'from spec_decode.eval import run as spec_eval\n'
    'spec_eval.evaluate.on_batch_done = @time.sleep\n'
  )
  return f'--gin_file={pause}'


def _wait_for_a_batch(procs, examples):
  deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
  while not (os.path.exists(examples) and os.path.getsize(examples)):
    assert time.monotonic() < deadline and procs[0].poll() is None
    time.sleep(0.2)


@pytest.mark.multiprocess
def test_sigterm_to_the_coordinator_ends_both_and_a_rerun_resumes(
  pair, single_runs, tmp_path
):
  plain, _ = single_runs
  outs = [str(tmp_path / 'p0'), str(tmp_path / 'p1')]
  procs = _start_pair(pair, outs, _pause_file(tmp_path))
  examples = os.path.join(outs[0], eval_lib.EXAMPLES_FILE)
  _wait_for_a_batch(procs, examples)
  procs[0].send_signal(signal.SIGTERM)
  sent = time.monotonic()
  try:
    procs[0].wait(timeout=HEARTBEAT_SECONDS * 2)
  except subprocess.TimeoutExpired:
    pass  # Asserted below, after both are stopped.
  exited = time.monotonic() - sent
  codes, logs = _finish(procs, timeout=DEATH_DEADLINE_SECONDS)
  assert time.monotonic() - sent < DEATH_DEADLINE_SECONDS
  # The coordinator exits at once, saying so; the other fails (not hangs).
  assert exited < HEARTBEAT_SECONDS * 2
  assert codes[0] == 128 + signal.SIGTERM, logs[0][-3000:]
  assert 'process 0 of 2 got SIGTERM and exits now' in logs[0]
  assert codes[1] != 0, logs[1][-3000:]
  with open(examples, encoding='utf-8') as f:
    first = f.readlines()
  assert 0 < len(first) < 10
  codes, logs = _finish(_start_pair(pair, outs))
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert _records(outs[0]) == _records(plain)


@pytest.mark.multiprocess
def test_a_killed_process_stops_the_other_and_a_rerun_resumes(
  pair, single_runs, tmp_path
):
  plain, _ = single_runs
  outs = [str(tmp_path / 'p0'), str(tmp_path / 'p1')]
  procs = _start_pair(pair, outs, _pause_file(tmp_path))
  examples = os.path.join(outs[0], eval_lib.EXAMPLES_FILE)
  _wait_for_a_batch(procs, examples)
  procs[1].send_signal(signal.SIGKILL)
  killed = time.monotonic()
  codes, logs = _finish(procs, timeout=DEATH_DEADLINE_SECONDS)
  assert time.monotonic() - killed < DEATH_DEADLINE_SECONDS
  assert codes[0] != 0 and codes[1] == -signal.SIGKILL
  assert 'another task died' in logs[0], logs[0][-3000:]
  with open(examples, encoding='utf-8') as f:
    first = f.readlines()
  assert 0 < len(first) < 10

  codes, logs = _finish(_start_pair(pair, outs))
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  with open(examples, encoding='utf-8') as f:
    # Resumed: the lines written before the kill are kept, timings and all.
    assert f.readlines()[: len(first)] == first
  assert _records(outs[0]) == _records(plain)
  assert _tokens_figures(_results(outs[0])) == _tokens_figures(_results(plain))

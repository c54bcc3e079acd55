"""`spec-decode train pair`: the demo pair trained on a GPU in one go.

  spec-decode train pair --out_dir $OUT [--pack .gpu/demo_train.tar.xz]
  spec-decode train pair --tiny --out_dir /tmp/pair    # CPU rehearsal

One command for a lent GPU (`make train-gpu`, docs/accelerator.md): it
unpacks the training splits from a pack (`spec-decode data pack`), trains
the demo target (`configs/train_demo_target_gpu.gin`), distils the draft
from it (`configs/train_demo_draft_gpu.gin`, the target just trained as
the teacher) and writes into `--out_dir`:

  summary.json       rewritten after every event: per stage the steps,
                     losses, validation loss and perplexity, how it stopped,
                     seconds (start, first step, end) and the command; the
                     parts below with their sha256
  pair.log           this job's and both stages' output
  models.tar.00, ... both exported models (with their config.gin and
                     train_log.jsonl) in one tar, split into parts of at
                     most 15 MiB (`parts.py`; `spec-decode train
                     pair-unpack` reassembles them)

Each stage is `spec-decode train` in a child process (one GPU client at a
time; a stage that fails or hangs cannot take the job with it). Time: the
job has `--budget_s` seconds from its start. The target's stage ends at
`--target_s`, the draft's at the budget less `PACK_MARGIN_S`. A stage's
training loop gets `lm.train.deadline` = its end less `EXPORT_MARGIN_S`:
a capped run stops there, checkpoints, validates and exports its model in
time. A child still running `KILL_GRACE_S` after its stage's end gets
SIGTERM (which a loop still running answers by exporting) and SIGKILL as
long after (`make train-gpu`'s `timeout` is the budget plus 45 s); one
that has not reached its loop by the stage's end is killed at once. The
steps (`--target_steps`, `--draft_steps`) are chosen to end before the
caps on an H100 (docs/accelerator.md), so the learning rate decays as
planned; the caps are for a slower machine.

`--tiny` rehearses all of it on the CPU at toy sizes (a 1-layer model,
one small bucket, 128 examples a task, 6 steps a stage) in well under two
minutes; `tests/train/test_pair_job.py` runs it end to end.
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any
from typing import TextIO

from spec_decode import paths
from spec_decode.data import pack as pack_lib
from spec_decode.train import parts

SUMMARY_FILE = 'summary.json'
LOG_FILE = 'pair.log'
TARGET_GIN = 'configs/train_demo_target_gpu.gin'
DRAFT_GIN = 'configs/train_demo_draft_gpu.gin'
# The stages' model directories; the names the tar and `pair-unpack` keep
# (runs/demo/target_gpu/model is the draft config's default teacher).
TARGET_DIR = 'target_gpu'
DRAFT_DIR = 'draft_gpu'
# Seconds a stage keeps after its loop's deadline: the final checkpoint,
# validation and export.
EXPORT_MARGIN_S = 25.0
# Seconds after a stage's end before its child gets SIGTERM, and again
# before SIGKILL.
KILL_GRACE_S = 20.0
# Seconds the job keeps at its end to write the parts.
PACK_MARGIN_S = 10.0
# (budget_s, target_s, target_steps, draft_steps, draft_examples).
GPU_DEFAULTS = (540.0, 315.0, 2800, 1500, 30000)
TINY_DEFAULTS = (180.0, 90.0, 6, 6, 128)
# Both stages on the GPU: validation every 500 steps, so that the eval
# step compiles inside the loop (before the deadline), not after it.
GPU_BINDINGS = ('lm.train.eval_every = 500',)
# Toy sizes for the CPU rehearsal (both stages), after the gin files.
TINY_BINDINGS = (
  'config.T5Config.emb_dim = 32',
  'config.T5Config.num_heads = 2',
  'config.T5Config.head_dim = 16',
  'config.T5Config.mlp_dim = 64',
  'config.T5Config.num_encoder_layers = 1',
  'config.T5Config.num_decoder_layers = 1',
  'lm.train.buckets = ((64, 32, 8),)',
  'lm.train.train_examples = 128',
  'lm.train.eval_examples = 16',
  'lm.train.warmup_steps = 2',
  'lm.train.log_every = 2',
  'lm.train.eval_every = 0',
)
_LOOP_START = re.compile(r'^train: .*; (starting|resuming) at step \d+ of')
_CAPPED = re.compile(r'^train: .* reached at step \d+')
_CLOSING = re.compile(r'^train: step \d+.*; model in ')


class Job:
  """The run's clock, its summary and its log (both in `out_dir`)."""

  def __init__(self, out_dir: str, budget_s: float):
    self.out_dir = out_dir
    self.t0 = time.time()
    self.budget_s = budget_s
    os.makedirs(out_dir, exist_ok=True)
    self.log: TextIO = open(
      os.path.join(out_dir, LOG_FILE), 'a', encoding='utf-8'
    )
    self.summary: dict[str, Any] = {'status': 'running', 'stages': {}}
    self.lock = threading.Lock()

  def now(self) -> float:
    """Seconds since the job started."""
    return round(time.time() - self.t0, 2)

  def say(self, line: str, echo: bool = True) -> None:
    """Writes a line to the log (and to stdout)."""
    with self.lock:
      self.log.write(line.rstrip('\n') + '\n')
      self.log.flush()
      if echo:
        print(line.rstrip('\n'), flush=True)

  def save(self) -> None:
    """Rewrites summary.json (atomically)."""
    self.summary['seconds'] = self.now()
    path = os.path.join(self.out_dir, SUMMARY_FILE)
    with open(path + '.tmp', 'w') as f:
      json.dump(self.summary, f, indent=1)
    os.replace(path + '.tmp', path)


def _device() -> str:
  """The GPU's name from nvidia-smi (without touching JAX), else `cpu`."""
  if os.environ.get('JAX_PLATFORMS', '') == 'cpu' or not shutil.which(
    'nvidia-smi'
  ):
    return 'cpu'
  try:
    out = subprocess.run(
      ['nvidia-smi', '--query-gpu=name,memory.total', '--format=csv,noheader'],
      capture_output=True,
      text=True,
      timeout=20,
      check=False,
    ).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return 'unknown'
  return out or 'unknown'


def _stage_command(
  gin_file: str, model_dir: str, steps: int, bindings: Sequence[str]
) -> list[str]:
  return [
    sys.executable,
    '-m',
    'spec_decode.main',
    'train',
    f'--gin_file={gin_file}',
    f'--model_dir={model_dir}',
    f'--gin.TRAIN_STEPS={steps}',
    *(f'--gin_bindings={b}' for b in bindings),
  ]


def run_child(
  job: Job,
  name: str,
  argv: Sequence[str],
  end: float,
  record: dict[str, Any],
) -> int:
  """Runs a stage's child until it exits or its time is up.

  The child's output goes to the log and stdout as it comes; `record`
  gets `loop_started_s` when the child prints its loop's opening line and
  `stopped` = `time` when the loop reports its deadline. A child that has
  not started its loop at `end` (a `time.time()`) is killed; one still
  running `KILL_GRACE_S` later gets SIGTERM, and SIGKILL after as long.

  Args:
    job: the job (clock, log).
    name: the stage's name in the log.
    argv: the child's command.
    end: when the stage should be over.
    record: the stage's summary record (updated).

  Returns:
    The child's exit code (negative: the signal that ended it).
  """
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  proc = subprocess.Popen(
    list(argv),
    cwd=paths.REPO_DIR,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    errors='replace',
  )

  def read():
    for line in proc.stdout:
      if _LOOP_START.match(line):
        record['loop_started_s'] = job.now()
        record['intro'] = line.strip()
      elif _CAPPED.match(line.strip()):
        record['capped_at_s'] = job.now()
      elif _CLOSING.match(line):
        record['closing'] = line.strip()
      job.say(f'[{name}] {line}')

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  termed = None
  while proc.poll() is None:
    now = time.time()
    if 'loop_started_s' not in record and now > end:
      job.say(f'pair: {name} has not started training by its end; killing')
      record['killed'] = 'before its loop'
      proc.kill()
    elif termed is None and now > end + KILL_GRACE_S:
      job.say(f'pair: {name} still running {KILL_GRACE_S:.0f} s after its end')
      record['killed'] = 'SIGTERM'
      proc.send_signal(signal.SIGTERM)
      termed = now
    elif termed is not None and now > termed + KILL_GRACE_S:
      record['killed'] = 'SIGKILL'
      proc.kill()
    time.sleep(0.2)
  reader.join(timeout=10)
  return proc.returncode


def _read_log(model_dir: str) -> list[dict[str, Any]]:
  path = os.path.join(model_dir, 'train_log.jsonl')
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def stage_results(
  job: Job, model_dir: str, record: dict[str, Any], returncode: int
) -> None:
  """Fills a stage's record from its `train_log.jsonl` and export."""
  log = _read_log(model_dir)
  steps = [r for r in log if 'loss' in r]
  vals = [
    (r['step'], r['validation_loss']) for r in log if 'validation_loss' in r
  ]
  record['returncode'] = returncode
  record['step'] = log[-1]['step'] if log else 0
  if steps:
    record['train_loss'] = steps[-1]['loss']
    record['train_nll'] = steps[-1].get('nll')
    record['first_step_record_s'] = round(steps[0]['time'] - job.t0, 2)
    if len(steps) > 1:
      span = steps[-1]['time'] - steps[0]['time']
      record['steps_per_s'] = round(
        (steps[-1]['step'] - steps[0]['step']) / max(span, 1e-9), 2
      )
      record['tokens_per_s'] = steps[-1].get('tokens_per_s')
  if vals:
    record['validation_loss'] = vals[-1][1]
    record['validation_perplexity'] = round(math.exp(min(vals[-1][1], 50.0)), 3)
    record['validations'] = vals
  model = os.path.join(model_dir, 'model')
  record['exported'] = os.path.isfile(os.path.join(model, 'config.json'))
  if record['exported']:
    record['model_bytes'] = sum(
      os.path.getsize(os.path.join(d, f))
      for d, _, files in os.walk(model)
      for f in files
    )
  if record.get('killed') in ('before its loop', 'SIGKILL'):
    record['stopped'] = 'killed'
  elif returncode == 130:
    record['stopped'] = 'interrupted'
  elif returncode != 0:
    record['stopped'] = 'failed'
  elif 'capped_at_s' in record:
    record['stopped'] = 'time'
  else:
    record['stopped'] = 'done'


def run_stage(
  job: Job,
  name: str,
  gin_file: str,
  model_dir: str,
  steps: int,
  bindings: Sequence[str],
  end_s: float,
) -> dict[str, Any]:
  """Trains one model in a child process; returns its summary record."""
  deadline = job.t0 + end_s - EXPORT_MARGIN_S
  bindings = [*bindings, f'lm.train.deadline = {deadline:.2f}']
  argv = _stage_command(gin_file, model_dir, steps, bindings)
  record: dict[str, Any] = {
    'gin_file': gin_file,
    'train_steps': steps,
    'bindings': bindings,
    'started_s': job.now(),
    'deadline_s': round(end_s - EXPORT_MARGIN_S, 2),
    'end_s': round(end_s, 2),
  }
  job.summary['stages'][name] = record
  job.save()
  job.say(f'pair: {name}: {" ".join(argv[2:])}')
  code = run_child(job, name, argv, job.t0 + end_s, record)
  record['ended_s'] = job.now()
  record['seconds'] = round(record['ended_s'] - record['started_s'], 2)
  stage_results(job, model_dir, record, code)
  job.save()
  job.say(
    f'pair: {name} {record["stopped"]} at step {record["step"]} after '
    f'{record["seconds"]:.0f} s; validation loss '
    f'{record.get("validation_loss")}; exported {record["exported"]}'
  )
  return record


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog='spec-decode train pair',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument('--out_dir', required=True, help='where results go')
  parser.add_argument(
    '--pack', default=pack_lib.DEFAULT_OUT, help='`spec-decode data pack`'
  )
  parser.add_argument(
    '--work_dir', default=None, help='data and model dirs (default: a tmp dir)'
  )
  parser.add_argument('--tiny', action='store_true', help='CPU rehearsal')
  for flag, text in (
    ('--budget_s', 'seconds for the whole job (9 minutes; tiny 3)'),
    ('--target_s', "when the target's stage ends (tiny 90)"),
    ('--target_steps', 'target train steps (2800; tiny 6)'),
    ('--draft_steps', 'draft train steps (1500; tiny 6)'),
    ('--draft_examples', 'train inputs the teacher decodes (30000; tiny 128)'),
  ):
    parser.add_argument(flag, type=float, default=None, help=text)
  parser.add_argument(
    '--target_binding', action='append', default=[], help='a gin binding'
  )
  parser.add_argument(
    '--draft_binding', action='append', default=[], help='a gin binding'
  )
  parser.add_argument(
    '--part_mib', type=float, default=15.0, help='largest part (MiB)'
  )
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the job; returns 0 when both models were exported."""
  args = _parser().parse_args(argv)
  defaults = TINY_DEFAULTS if args.tiny else GPU_DEFAULTS
  budget_s, target_s, target_steps, draft_steps, draft_examples = (
    default if given is None else given
    for given, default in zip(
      (
        args.budget_s,
        args.target_s,
        args.target_steps,
        args.draft_steps,
        args.draft_examples,
      ),
      defaults,
      strict=True,
    )
  )
  job = Job(args.out_dir, budget_s)
  work = args.work_dir or tempfile.mkdtemp(prefix='spec_decode_pair_')
  job.summary.update(
    job='the demo pair (spec-decode train pair)',
    tiny=args.tiny,
    started=time.strftime('%Y-%m-%dT%H:%M:%S%z', time.localtime(job.t0)),
    budget_s=budget_s,
    device=_device(),
    work_dir=work,
  )
  job.save()
  try:
    return _run(
      job,
      args,
      work,
      target_s,
      (int(target_steps), int(draft_steps), int(draft_examples)),
    )
  except Exception as e:  # Recorded for the summary, then raised.
    job.summary.update(status='failed', error=f'{type(e).__name__}: {e}')
    job.say(f'pair: failed: {type(e).__name__}: {e}')
    raise
  finally:
    job.save()
    job.log.close()


def _run(
  job: Job,
  args: argparse.Namespace,
  work: str,
  target_s: float,
  sizes: tuple[int, int, int],
) -> int:
  """Unpacks, trains both stages and writes the parts; an exit code."""
  target_steps, draft_steps, draft_examples = sizes
  pack_path = paths.resolve(args.pack)
  t = job.now()
  data_dir = pack_lib.unpack(pack_path, os.path.join(work, 'data'))
  job.summary['pack'] = {
    'path': args.pack,
    'bytes': os.path.getsize(pack_path),
    'unpack_s': round(job.now() - t, 2),
  }
  job.say(
    f'pair: unpacked {args.pack} into {data_dir} in {job.now() - t:.1f} s'
  )
  common = [
    f'lm.train.data_dir = {data_dir!r}',
    'lm.train.progress = False',
    *(TINY_BINDINGS if args.tiny else GPU_BINDINGS),
  ]
  target_dir = os.path.join(work, TARGET_DIR)
  draft_dir = os.path.join(work, DRAFT_DIR)
  target = run_stage(
    job,
    'target',
    TARGET_GIN,
    target_dir,
    target_steps,
    [
      *common,
      f'lm.train.checkpoint_every = {target_steps}',
      *args.target_binding,
    ],
    target_s,
  )
  stages = {TARGET_DIR: target_dir}
  if target['exported']:
    draft = run_stage(
      job,
      'draft',
      DRAFT_GIN,
      draft_dir,
      draft_steps,
      [
        *common,
        f'lm.train.checkpoint_every = {draft_steps}',
        f'lm.train.train_examples = {draft_examples}',
        f'TEACHER_PATH = {os.path.join(target_dir, "model")!r}',
        *args.draft_binding,
      ],
      job.budget_s - PACK_MARGIN_S,
    )
    if draft['exported']:
      stages[DRAFT_DIR] = draft_dir
  else:
    job.summary['stages']['draft'] = {'skipped': 'the target was not exported'}
  exported = {
    name: path
    for name, path in stages.items()
    if os.path.isfile(os.path.join(path, 'model', 'config.json'))
  }
  if exported:
    t = job.now()
    out = parts.write_parts(
      exported, job.out_dir, part_bytes=int(args.part_mib * 2**20)
    )
    out['seconds'] = round(job.now() - t, 2)
    job.summary['outputs'] = out
    job.say(
      f'pair: {len(out["parts"])} parts of {out["tar_bytes"] / 2**20:.1f} MiB '
      f'({", ".join(out["models"])}) in {job.out_dir}'
    )
  both = len(exported) == 2
  job.summary['status'] = (
    'done' if both else 'partial' if exported else 'failed'
  )
  job.save()
  return 0 if both else 1

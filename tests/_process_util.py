"""Runs of the command line in subprocesses over several host devices or
processes: the tiny checkpoint pair they load, their environment, a free
coordinator port and collecting their output (the eval and infer
multi-process tests)."""

import os
import socket
import subprocess

import jax
import numpy as np

import spec_decode as sd
from spec_decode.eval import run as eval_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEARTBEAT_SECONDS = 5
RUN_TIMEOUT_SECONDS = 480


def tiny_pair(root) -> tuple[str, str]:
  """Checkpoints of a tiny target and a draft close to it, under `root`."""
  vocab = eval_lib.task_vocabulary('synthetic_tiny', vocab_size=64)
  config = sd.T5Config.from_gin(
    os.path.join(REPO, 'gin/models/t5_1_1/tiny.gin'), vocab_size=64
  )
  target = sd.Model.init(config, seed=0, vocabulary=vocab)
  rng = np.random.default_rng(1)
  draft = target.with_params(
    jax.tree.map(
      lambda x: np.asarray(x) + 0.05 * rng.standard_normal(x.shape),
      target.params,
    )
  )
  target.save(os.path.join(root, 'target'))
  draft.save(os.path.join(root, 'draft'))
  return os.path.join(root, 'target'), os.path.join(root, 'draft')


def smoke_flags(pair, out, *extra) -> list[str]:
  """`configs/smoke_synthetic.gin` on the `tiny_pair` checkpoints: 10
  validation examples in batches of 4 (the last has 2 rows) into `out`."""
  target, draft = pair
  return [
    '--gin_file=smoke_synthetic',
    f'--gin.CHECKPOINT_PATH={target!r}',
    f'--gin.DRAFT_CHECKPOINT={draft!r}',
    '--gin.TARGET_MODEL_GIN=None',
    '--gin.DRAFT_GIN_FILE=None',
    '--gin.BATCH_SIZE=4',
    '--gin.NUM_EXAMPLES=10',
    '--gin.SPLIT="validation"',
    f'--output_dir={out}',
    '--no_progress',
    *extra,
  ]


def env(devices, **extra):
  """A subprocess's environment: the CPU with `devices` host devices, the
  multi-process variables only where given."""
  out = dict(os.environ)
  out.update(
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
    PYTHONUNBUFFERED='1',
    **{k: str(v) for k, v in extra.items()},
  )
  for name in (
    'JAX_COORDINATOR_ADDRESS',
    'JAX_NUM_PROCESSES',
    'JAX_PROCESS_ID',
  ):
    if name not in extra:
      out.pop(name, None)
  return out


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def start_pair(command, flags_of) -> list[subprocess.Popen]:
  """Two processes of 4 host devices each joined on one mesh: `command`
  (the argv before the flags) with `flags_of(i)` for process i."""
  port = free_port()
  procs = []
  for i in range(2):
    process_env = env(
      4,
      JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}',
      JAX_NUM_PROCESSES=2,
      JAX_PROCESS_ID=i,
      SPEC_DECODE_HEARTBEAT_TIMEOUT=HEARTBEAT_SECONDS,
    )
    procs.append(
      subprocess.Popen(
        [*command, *flags_of(i)],
        env=process_env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
    )
  return procs


def finish(procs, timeout=RUN_TIMEOUT_SECONDS):
  """Each process's exit code and output; kills what is still running."""
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=timeout)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [p.returncode for p in procs], outputs

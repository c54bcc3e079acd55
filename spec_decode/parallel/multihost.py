"""Multi-host runs (TPU pods): start-up, per-host input slices, gathering.

On a pod slice every host (process) runs the same program. Each host

  1. calls `initialize()` before anything else touches JAX (it connects the
     processes with `jax.distributed.initialize()`; on one host it does
     nothing),
  2. reads only its slice of each global batch (`local_batch_slice`) and
     turns it into one global array sharded on the mesh's `data` axis
     (`global_batch`, `jax.make_array_from_process_local_data`),
  3. decodes (one jitted program over all hosts' devices), and
  4. gathers the results once per batch (`to_host`:
     `multihost_utils.process_allgather` when the array spans hosts).

Everything here also works in a single process, where local means global.

Anywhere (not only on a TPU VM) the processes find each other through the
environment: `JAX_COORDINATOR_ADDRESS` (`host:port` of process 0),
`JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`. On CPU, `initialize` selects
gloo collectives first (XLA:CPU has no cross-process collectives without
them). A process that dies is noticed by the others through the
coordination service's heartbeats: they stop with JAX's "another task
died" message after `SPEC_DECODE_HEARTBEAT_TIMEOUT` seconds (default
JAX's 100) instead of waiting for it forever.

A process that is sent SIGTERM (or SIGINT) in a multi-process run exits at
once (exit code 128 + the signal), saying so: JAX's preemption notifier
would otherwise swallow SIGTERM and a graceful exit would wait in
`jax.distributed.shutdown` for peers that are blocked in a collective with
it. Files written so far stay valid (eval runs append whole lines and
replace JSON files atomically), so a rerun resumes; the other processes
stop after the heartbeat timeout, as if it had been killed.

Eval runs (`eval/run.py`) also use `feeds_rows` (the batch rows whose
input this process must provide), `rows_to_global` (those rows -> one
global array), `gather_max` and `broadcast_json` (small values agreed
once per run) and `allgather_bytes` (what process 0 must write).
"""

import json
import logging
import os
import signal
import threading
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from spec_decode.core.placement import is_global  # noqa: F401 (public here)
from spec_decode.core.placement import local_data  # noqa: F401
from spec_decode.core.placement import to_host  # noqa: F401

# Set (to 1) by `launch_tpu.sh` on every worker of a TPU VM.
MULTIHOST_ENV = 'SPEC_DECODE_MULTIHOST'
# Seconds without a peer's heartbeat before the others stop.
HEARTBEAT_ENV = 'SPEC_DECODE_HEARTBEAT_TIMEOUT'
# The environment of a start anywhere (what jax.distributed reads).
COORDINATOR_ENV = 'JAX_COORDINATOR_ADDRESS'
NUM_PROCESSES_ENV = 'JAX_NUM_PROCESSES'
PROCESS_ID_ENV = 'JAX_PROCESS_ID'

_log = logging.getLogger(__name__)


def _requested(coordinator_address: str | None) -> bool:
  """Whether the environment asks for a multi-process start."""
  if coordinator_address or os.environ.get(COORDINATOR_ENV):
    return True
  if os.environ.get(MULTIHOST_ENV, '').lower() in ('1', 'true', 'yes'):
    return True
  # Cloud TPU runtimes list the hosts of a slice; one host needs nothing.
  hosts = os.environ.get('TPU_WORKER_HOSTNAMES', '')
  return len([h for h in hosts.split(',') if h.strip()]) > 1


def is_initialized() -> bool:
  """Whether `jax.distributed` is up in this process."""
  is_init = getattr(jax.distributed, 'is_initialized', None)
  if is_init is not None:
    return bool(is_init())
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  return distributed.global_state.client is not None


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  enabled: bool | None = None,
) -> bool:
  """Connects the hosts of a pod; a no-op on a single host.

  Must run before the first JAX computation. Calls
  `jax.distributed.initialize` (which finds the coordinator, the process
  count and this process's id from the TPU metadata when neither the
  arguments nor `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and
  `JAX_PROCESS_ID` give them) when
  `enabled`, or, with `enabled=None`, when any of these is set: a
  coordinator address (argument or `JAX_COORDINATOR_ADDRESS`),
  `SPEC_DECODE_MULTIHOST=1`, or a `TPU_WORKER_HOSTNAMES` listing more than
  one host. Calling it again is harmless.

  Args:
    coordinator_address: `host:port` of process 0, if not auto-detected.
    num_processes: number of processes, if not auto-detected.
    process_id: this process's id, if not auto-detected.
    enabled: force (True) or skip (False) the distributed start.

  Returns:
    True when `jax.distributed` is initialized afterwards.

  Raises:
    ValueError: `JAX_NUM_PROCESSES` or `SPEC_DECODE_HEARTBEAT_TIMEOUT` is
      set and not an int >= 1, or `JAX_PROCESS_ID` not an int >= 0 (checked
      first, whether or not the start is multi-process, so that a typo is
      an error rather than a silent single-host run).
  """
  # Read before `enabled` is decided: a bad value fails on one host too.
  env_processes = _env_int(NUM_PROCESSES_ENV, minimum=1)
  env_id = _env_int(PROCESS_ID_ENV, minimum=0)
  heartbeat = _env_int(HEARTBEAT_ENV, minimum=1)
  if enabled is None:
    enabled = _requested(coordinator_address)
  if not enabled:
    return False
  if is_initialized():
    return True
  coordinator_address = coordinator_address or os.environ.get(COORDINATOR_ENV)
  if num_processes is None:
    num_processes = env_processes
  if process_id is None:
    process_id = env_id
  # Cross-process collectives of XLA:CPU (a no-op for accelerators).
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    **({} if heartbeat is None else {'heartbeat_timeout_seconds': heartbeat}),
  )
  _exit_on_termination_signals()
  _log.info(
    'process %d of %d, %d local devices of %d',
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
  return True


_TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _terminate(signum: int) -> None:
  """Ends this process now (no atexit: no distributed shutdown)."""
  name = signal.Signals(signum).name
  message = (
    f'\nspec-decode: process {jax.process_index()} of '
    f'{jax.process_count()} got {name} and exits now; the other processes '
    'stop when their heartbeat timeout notices. Finished batches are '
    'saved: rerun the same command on every host to resume.\n'
  )
  try:  # No flush of sys.stdout: another thread may hold its lock.
    os.write(2, message.encode())
  finally:
    os._exit(128 + signum)  # pylint: disable=protected-access


def _exit_on_termination_signals() -> None:
  """SIGTERM and SIGINT end the process at once (see the docstring).

  The Python handler runs only when the main thread next runs Python code,
  which a long device computation or a collective waiting for a dead peer
  can delay indefinitely; the wakeup fd is written by the C-level handler
  at once, and a watcher thread acts on it.
  """
  if threading.current_thread() is not threading.main_thread():
    _log.warning('not the main thread: signals keep their handlers')
    return
  read_end, write_end = os.pipe()
  os.set_blocking(write_end, False)
  signal.set_wakeup_fd(write_end)
  for signum in _TERMINATION_SIGNALS:
    signal.signal(signum, lambda n, _: _terminate(n))

  def watch():
    while True:
      data = os.read(read_end, 1)
      if data and data[0] in _TERMINATION_SIGNALS:
        _terminate(data[0])

  threading.Thread(target=watch, name='signal-watch', daemon=True).start()


def _env_int(name: str, minimum: int) -> int | None:
  """The int in environment variable `name` (None when unset or empty)."""
  value = os.environ.get(name, '').strip()
  if not value:
    return None
  try:
    number = int(value)
  except ValueError:
    number = None
  if number is None or number < minimum:
    raise ValueError(f'${name} must be an int >= {minimum}, got {value!r}')
  return number


def local_batch_slice(
  global_batch: int,
  process_index: int | None = None,
  process_count: int | None = None,
) -> slice:
  """The rows of a global batch this host feeds, as a contiguous slice.

  Hosts feed equal consecutive blocks in process order, which is how
  `jax.make_array_from_process_local_data` assembles a batch sharded on
  `data` when each host's devices hold consecutive rows (true for meshes
  built by `Partitioner` on TPU slices and on CPU).

  Raises:
    ValueError: `global_batch` does not split evenly over the hosts.
  """
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if global_batch % count:
    raise ValueError(
      f'global batch {global_batch} does not split over '
      f'{count} hosts; pad it to a multiple of {count}'
    )
  per_host = global_batch // count
  return slice(index * per_host, (index + 1) * per_host)


def global_batch(
  partitioner, local_rows: Any, global_batch_size: int | None = None
) -> jax.Array:
  """This host's rows `[b, ...]` -> the global array `[B, ...]` on `data`.

  Args:
    partitioner: a `spec_decode.Partitioner` (its mesh and batch rule).
    local_rows: this host's rows (numpy), e.g.
      `full_batch[local_batch_slice(B)]` or rows read from this host's data
      shard.
    global_batch_size: B; default `b * process_count()`.

  Returns:
    A `jax.Array` of the global shape, batch sharded on `data`, each host's
    devices holding the rows that host fed.
  """
  local_rows = np.asarray(local_rows)
  shape = None
  if global_batch_size is not None:
    shape = (global_batch_size,) + local_rows.shape[1:]
  return jax.make_array_from_process_local_data(
    partitioner.batch_sharding(local_rows.ndim), local_rows, shape
  )


def feeds_rows(partitioner, batch: int) -> np.ndarray:
  """Which rows of a `[batch, ...]` input this process provides, `[batch]`.

  A process provides the rows its devices hold on the mesh's `data` axis
  (all of them in a single process, or when the `data` axis has one
  device per process group that spans every process).
  """
  sharding = partitioner.batch_sharding(2)
  mine = np.zeros(batch, bool)
  for index in sharding.addressable_devices_indices_map((batch, 1)).values():
    mine[index[0]] = True
  return mine


def rows_to_global(partitioner, rows: np.ndarray) -> jax.Array:
  """A `[B, ...]` host array -> the global array, batch on `data`.

  Only the rows `feeds_rows` marks are read; the others may hold anything
  (another process provides them).
  """
  rows = np.asarray(rows)
  return jax.make_array_from_callback(
    rows.shape, partitioner.batch_sharding(rows.ndim), lambda i: rows[i]
  )


def gather_max(values: np.ndarray) -> np.ndarray:
  """The elementwise maximum of `values` over all processes."""
  values = np.asarray(values)
  if jax.process_count() == 1:
    return values
  return np.asarray(multihost_utils.process_allgather(values)).max(axis=0)


def allgather_bytes(data: bytes) -> list[bytes]:
  """Every process's `data`, in process order, on every process."""
  if jax.process_count() == 1:
    return [data]
  sizes = np.asarray(
    multihost_utils.process_allgather(np.array([len(data)], np.int64))
  ).reshape(-1)
  buffer = np.zeros(max(int(sizes.max()), 1), np.uint8)
  buffer[: len(data)] = np.frombuffer(data, np.uint8)
  gathered = np.asarray(multihost_utils.process_allgather(buffer))
  return [
    gathered[p, : int(n)].astype(np.uint8).tobytes()
    for p, n in enumerate(sizes)
  ]


def broadcast_json(obj: Any) -> Any:
  """Process 0's `obj` (a JSON value) on every process."""
  if jax.process_count() == 1:
    return obj
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.int64(data.size)))
  buffer = np.zeros(size, np.uint8)
  if jax.process_index() == 0:
    buffer[:] = data
  out = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
  return json.loads(out.astype(np.uint8).tobytes().decode())

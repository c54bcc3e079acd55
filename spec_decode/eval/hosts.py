"""An eval run over several processes: who feeds which rows, who writes.

Under `jax.distributed` (`parallel/multihost.py`) every process runs the
same eval run on one global mesh. `Hosts` says what falls to this process:

* Rows and examples. Batch `k` holds examples `k*B .. k*B+B-1` (B = the
  batch size) in order, as in a single process. A process feeds the rows
  its devices hold on the mesh's `data` axis (`multihost.feeds_rows`), so
  its share of the split is the examples that land in those rows (`owns`:
  example `i` is in row `i mod B`): it reads only those (their text, their
  features, their ids; `eval/load/task_data.py`), as T5X's hosts each read their
  shard of the input. Processes whose devices hold the same rows (a `model`
  axis that spans processes) read the same share. The input widths (each
  batch is padded to its longest row, bucketed) are agreed once per run:
  `agreed_lengths` takes the maximum of every process's known lengths.
* Outputs. `sd.generate` returns the whole batch on every process, so the
  outputs and per-example statistics are everywhere; what process 0 alone
  (`writer`) lacks to write examples.jsonl, the predictions and the scores
  (the other shares' inputs, references and features) is gathered to it
  once (`gather_examples`). It writes run_state.json, examples.jsonl and
  the results, and what it read back (how many examples a resumed run has
  done, an auto-γ choice, the final results) is sent to the others
  (`multihost.broadcast_json`), so that all take the same steps.

In a single process everything is local and nothing is exchanged.
"""

import pickle
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

import spec_decode as sd
from spec_decode.core import placement as placement_lib
from spec_decode.eval import decoding
from spec_decode.eval import settings as settings_lib
from spec_decode.parallel import multihost


class Hosts:
  """This process's share of an eval run.

  Attributes:
    partitioner: the models' mesh (None: one device, one process).
    count: number of processes.
    index: this process's index.
    writer: whether this process writes the run's files (process 0).
    mine: `[batch_size]` bool, the batch rows this process feeds.
  """

  def __init__(self, target: Any, draft: Any, batch_size: int):
    """Reads the mesh from the models.

    Raises:
      ValueError: several processes but unsharded models, or a batch that
        does not split over the mesh's `data` axis.
    """
    import jax  # pylint: disable=g-import-not-at-top

    self.partitioner = placement_lib.placement_of(target, draft)
    self.count = jax.process_count()
    self.index = jax.process_index()
    self.writer = self.index == 0
    if self.count > 1:
      if self.partitioner is None:
        raise ValueError(
          f'{self.count} processes need sharded models: load them with '
          'a partitioner (gin: spec_eval.partitioner, NUM_PARTITIONS)'
        )
      if batch_size % self.partitioner.data_size:
        raise ValueError(
          f'batch size {batch_size} does not split over the '
          f'{self.partitioner.data_size} rows of the data axis'
        )
      self.mine = multihost.feeds_rows(self.partitioner, batch_size)
    else:
      self.mine = np.ones(batch_size, bool)
    self.batch_size = batch_size

  @property
  def mesh(self) -> dict[str, int]:
    """`{'data': D, 'model': M}` (one device: 1 and 1)."""
    p = self.partitioner
    return {
      'data': p.data_size if p else 1,
      'model': p.model_size if p else 1,
    }

  def owns(self, i: int) -> bool:
    """Whether this process feeds the example at position `i` of the
    run (batches are consecutive positions)."""
    return bool(self.mine[i % self.batch_size])

  def gather_examples(self, *columns: list[Any]) -> None:
    """Fills the writer's `columns` (per-example lists, None: another
    process's) with every process's; the others' are left as they are."""
    if self.count == 1:
      return
    mine = {
      i: [c[i] for c in columns]
      for i in range(len(columns[0]))
      if columns[0][i] is not None
    }
    # Between processes of one run: pickle carries the seqio features.
    parts = multihost.allgather_bytes(pickle.dumps(mine))
    if not self.writer:
      return
    for part in parts:
      for i, values in pickle.loads(part).items():
        for column, value in zip(columns, values, strict=True):
          column[i] = value
    missing = [i for i, ex in enumerate(columns[0]) if ex is None]
    if missing:
      raise RuntimeError(f'no process read examples {missing[:10]}')

  def report_share(self, read: int, total: int) -> None:
    """Says (on stderr) how many of the examples this process read."""
    if self.count == 1:
      return
    rows = np.flatnonzero(self.mine).tolist()
    print(
      f'spec-decode eval: process {self.index} of {self.count} read '
      f'{read} of {total} examples (batch rows {rows} of '
      f'{self.batch_size})',
      file=sys.stderr,
      flush=True,
    )

  def agreed_lengths(self, token_lists: Sequence[list[int] | None]):
    """`[N]` input lengths of every example (0 where unknown everywhere)."""
    lengths = np.array(
      [0 if t is None else len(t) for t in token_lists], np.int32
    )
    if self.count == 1:
      return lengths
    return multihost.gather_max(lengths)

  def batch(
    self,
    token_lists: Sequence[list[int] | None],
    lengths: np.ndarray,
    indices: Sequence[int],
    settings: settings_lib.EvalSettings,
  ) -> tuple[Any, np.ndarray]:
    """Encoder tokens `[B, S]` (a global array with several processes) and
    the rows' seeds (`decoding.batch_arrays`)."""
    # Another process's row: its length (so that the width agrees) but
    # not its ids, which this process never reads (`rows_to_global`).
    rows = {
      i: token_lists[i]
      if token_lists[i] is not None
      else [sd.EOS_ID] * int(lengths[i])
      for i in indices
    }
    enc, seeds = decoding.batch_arrays(rows, indices, settings)
    if self.count > 1:
      enc = multihost.rows_to_global(self.partitioner, enc)
    return enc, seeds

  def share(self, value: Any) -> Any:
    """The writer's `value` (a JSON value) on every process."""
    if self.count == 1:
      return value
    return multihost.broadcast_json(value if self.writer else None)

"""The target's own greedy outputs: the training data of Medusa heads.

Inputs are decoded with plain greedy decoding in fixed-shape batches
(one compilation per input length) and cached in an `.npz` file written
every few batches and on Ctrl-C, so an interrupted or resumed run never
decodes an input twice (`spec_decode.train.heads` caches per split under
its `model_dir`).
"""

import os
from collections.abc import Sequence

import numpy as np

from spec_decode.chain import generation
from spec_decode.data import tasks as tasks_lib
from spec_decode.models import t5_model
from spec_decode.train import common


def greedy_outputs(
  target: t5_model.Model,
  inputs: Sequence[np.ndarray],
  input_lens: Sequence[int],
  max_decode_len: int,
  batch_size: int,
  cache_file: str | None = None,
  progress: bool = True,
  save_every: int = 10,
) -> list[np.ndarray | None]:
  """The target's greedy output for each input (None: input too long).

  Inputs are decoded in batches of `batch_size` rows padded to the smallest
  of `input_lens` that holds them (one compilation per length). With a
  `cache_file`, finished outputs are written there every `save_every`
  batches and on Ctrl-C, and read back first, so no input is decoded twice.

  Args:
    target: the model.
    inputs: encoder token arrays, each ending with EOS.
    input_lens: the encoder lengths to pad to.
    max_decode_len: output tokens per row at most (a longer output is cut,
      without EOS).
    batch_size: rows per decode.
    cache_file: the `.npz` cache, or None.
    progress: show a tqdm bar.
    save_every: batches between cache writes.

  Returns:
    Per input, its output tokens (EOS included when reached), or None.
  """
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

  n = len(inputs)
  outputs = np.zeros((n, max_decode_len), np.int32)
  lengths = np.zeros((n,), np.int32)
  done = np.zeros((n,), bool)
  if cache_file and os.path.isfile(cache_file):
    cached = np.load(cache_file)
    if (
      cached['outputs'].shape == outputs.shape
      and cached['num_inputs'] == n
      and np.array_equal(cached['input_digest'], _digest(inputs))
    ):
      outputs, lengths, done = (
        cached['outputs'],
        cached['lengths'],
        cached['done'],
      )
    else:
      print(f'train_heads: {cache_file} is for other inputs; redecoding')
  input_lens = sorted(int(x) for x in input_lens)
  groups = {length: [] for length in input_lens}
  too_long = 0
  for i, x in enumerate(inputs):
    fit = [length for length in input_lens if len(x) <= length]
    if not fit:
      too_long += 1
    elif not done[i]:
      groups[fit[0]].append(i)
  batches = [
    (length, idx[s : s + batch_size])
    for length, idx in groups.items()
    for s in range(0, len(idx), batch_size)
  ]

  def save():
    if cache_file:
      tmp = cache_file + '.tmp.npz'
      np.savez(
        tmp,
        outputs=outputs,
        lengths=lengths,
        done=done,
        num_inputs=n,
        input_digest=_digest(inputs),
      )
      os.replace(tmp, cache_file)

  if batches:
    bar = tqdm.tqdm(
      total=len(batches),
      disable=not progress,
      unit='batch',
      dynamic_ncols=True,
      desc=f'greedy outputs ({int(done.sum())}/{n} cached)',
    )
    try:
      for b, (length, idx) in enumerate(batches):
        enc = np.zeros((batch_size, length), np.int32)
        for row in range(batch_size):
          x = inputs[idx[min(row, len(idx) - 1)]]  # Repeat to fill the batch.
          enc[row, : len(x)] = x
        out = generation.generate(
          target, enc, max_decode_len=max_decode_len, temperature=0.0
        )
        outputs[idx] = out.tokens[: len(idx)]
        lengths[idx] = out.lengths[: len(idx)]
        done[idx] = True
        bar.update(1)
        if (b + 1) % save_every == 0:
          save()
    finally:
      bar.close()
      save()
  return [
    None if not done[i] or lengths[i] == 0 else outputs[i, : lengths[i]].copy()
    for i in range(n)
  ]


def _digest(inputs: Sequence[np.ndarray]) -> np.ndarray:
  """A cheap fingerprint of a list of token arrays (`[4] int64`)."""
  lens = np.asarray([len(x) for x in inputs], np.int64)
  flat = np.concatenate(list(inputs) + [np.zeros(1, np.int32)]).astype(np.int64)
  pos = np.arange(len(flat), dtype=np.int64)
  return np.asarray(
    [len(inputs), lens.sum(), (flat * (pos % 9973 + 1)).sum(), flat.sum()],
    np.int64,
  )


def greedy_dataset(
  target: t5_model.Model,
  task: tasks_lib.Task,
  split: str,
  limit: int | None,
  buckets: Sequence[common.Bucket],
  max_decode_len: int,
  batch_size: int,
  cache_file: str | None,
  progress: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
  """`(inputs, greedy outputs)` pairs of a split (over-long inputs out)."""
  pairs = common.tokenize_split(task, split, target.vocabulary, limit)
  inputs = [x for x, _ in pairs]
  outs = greedy_outputs(
    target,
    inputs,
    sorted({b.input_len for b in buckets}),
    max_decode_len,
    batch_size,
    cache_file,
    progress,
  )
  return [(x, y) for x, y in zip(inputs, outs, strict=True) if y is not None]

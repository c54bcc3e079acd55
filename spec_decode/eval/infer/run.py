"""Infer runs: a task split or a file of inputs decoded speculatively only.

`infer` is the library entry point of `spec-decode infer` (the gin wrapper
is `infer/cli.py`), T5X's `infer.py` with a draft. One run:

1. reads its examples: a task split as the eval run reads it (a built-in
   task, or a seqio task or mixture with its preprocessors;
   `eval/load/task_data.py`), or a text or JSONL file (`infer/inputs.py`);
2. decodes them in batches with the draft only (`infer/decode.py`: chains
   of γ, γ = 'auto', trees, beam search; greedy or sampled with seed +
   example index), on the models' mesh and over several processes as the
   eval run does (`eval/hosts.py`: each process feeds its rows, process 0
   writes);
3. writes every `checkpoint_period` batches a chunk (`infer/chunks.py`),
   so that a rerun resumes after the last chunk written, and at the end
   T5X's `{task}-{mode}.jsonl-00000-of-00001` per (sub)task and
   `infer_summary.json`: examples and tokens per second, target calls,
   tokens per call, alpha, the share of outputs without EOS; with
   `page_examples`, examples.html draws the first predictions as the
   paper's Figure 1 (`infer/page.py`).

A tqdm bar shows examples/s, tokens/s and alpha as it goes.
"""

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from spec_decode.eval import decoding
from spec_decode.eval import hosts as hosts_lib
from spec_decode.eval.infer import chunks as chunks_lib
from spec_decode.eval.infer import decode as decode_lib
from spec_decode.eval.infer import inputs as inputs_lib
from spec_decode.eval.infer import page as page_lib
from spec_decode.eval.infer import settings as settings_lib
from spec_decode.eval.load import models as models_lib
from spec_decode.eval.load import task_data
from spec_decode.t5 import vocab as vocab_lib

InferSettings = settings_lib.InferSettings
load_model = models_lib.load_model
partitioner = models_lib.partitioner
task_vocabulary = models_lib.task_vocabulary
SUMMARY_FILE = chunks_lib.SUMMARY_FILE
predictions_file = chunks_lib.predictions_file


def infer(
  target: Any,
  draft: Any,
  settings: settings_lib.InferSettings,
  *,
  output_dir: str,
  overwrite: bool = False,
  progress: bool = True,
  on_chunk_done: Callable[[int], None] | None = None,
) -> dict[str, Any]:
  """Decodes the settings' inputs speculatively; writes T5X's files.

  Args:
    target: the target model (with a `vocabulary`, or set
      `settings.vocabulary`).
    draft: the draft (same vocabulary); None decodes plainly with the
      target alone (the same files; `spec-decode bench infer` compares
      the two).
    settings: what to decode and how.
    output_dir: where the files go (`infer/chunks.py`).
    overwrite: replace a run with other settings in `output_dir`.
    progress: show a tqdm progress bar.
    on_chunk_done: called with the number of examples written after each
      chunk (tests use it to interrupt a run).

  Returns:
    The summary (infer_summary.json's contents).

  Raises:
    ValueError: no vocabulary, vocabularies that differ, an empty split
      or file, a bad input line (`bad_lines='fail'`), or `output_dir`
      holding a run with other settings.
  """
  s = settings
  vocab = models_lib.as_vocabulary(s.vocabulary) or getattr(
    target, 'vocabulary', None
  )
  draft_vocab = getattr(draft, 'vocabulary', None)
  vocab_lib.check_compatible(vocab, draft_vocab)
  hosts = hosts_lib.Hosts(target, draft, s.batch_size)
  if s.input_file is not None:
    data = inputs_lib.load(s, vocab, hosts.owns)
  else:
    data = task_data.load(s, vocab, hosts.owns)
  vocab_lib.check_compatible(data.vocabulary, draft_vocab)
  total = len(data.examples)
  hosts.report_share(data.num_read, total)
  lengths = hosts.agreed_lengths(data.token_lists)
  hosts.gather_examples(data.examples, data.features)
  identity = {
    **s.identity(),
    'num_examples': total,
    'target': models_lib.fingerprint(target),
    'draft': models_lib.fingerprint(draft),
    'vocabulary': data.vocabulary.digest,
  }
  identity = json.loads(json.dumps(identity))
  opened = None
  if hosts.writer:
    try:
      state = chunks_lib.open_dir(output_dir, identity, overwrite)
      opened = {
        'state': state,
        'done': chunks_lib.chunks_done(output_dir),
      }
    except ValueError as e:
      opened = {'error': str(e)}
  opened = hosts.share(opened)
  if 'error' in opened:
    raise ValueError(opened['error'])
  state = opened['state']
  if state[chunks_lib.STATE_KEY]['complete']:
    return hosts.share(
      chunks_lib.read_summary(output_dir) if hosts.writer else None
    )
  per_chunk = s.checkpoint_period * s.batch_size
  decoder = decode_lib.Decoder(target, draft, s)
  counts = _Counts()
  bar = _bar(total, opened['done'] * per_chunk, progress and hosts.writer)
  try:
    for chunk, start in enumerate(range(0, total, per_chunk)):
      if chunk < opened['done']:
        continue
      stop = min(start + per_chunk, total)
      rows = []
      for indices in decoding.batches(start, stop, s.batch_size):
        rows.extend(_batch(decoder, data, hosts, lengths, indices, counts))
        bar.update(len(indices))
        bar.set_postfix(**counts.postfix())
      if hosts.writer:
        chunks_lib.write_chunk(output_dir, chunk, rows)
      if on_chunk_done is not None:
        on_chunk_done(stop)
  finally:
    bar.close()
  summary = None
  if hosts.writer:
    rows = chunks_lib.read_chunks(output_dir, -(-total // per_chunk))
    summary = _summary(rows, counts, s, hosts)
    if s.page_examples:
      page_lib.write(output_dir, rows, data.decode, summary)
    chunks_lib.merge(output_dir, rows, s.mode, summary, state)
    summary = chunks_lib.read_summary(output_dir)
  return hosts.share(summary)


@dataclasses.dataclass
class _Counts:
  """This run's decoding so far (a resumed run's part only)."""

  examples: int = 0
  tokens: int = 0
  seconds: float = 0.0
  beta_sum: float = 0.0
  tested: int = 0

  def postfix(self) -> dict[str, str]:
    return {
      'tok_s': f'{self.tokens / max(self.seconds, 1e-9):.1f}',
      'alpha': f'{self.beta_sum / max(self.tested, 1):.3f}',
    }


def _bar(total: int, initial: int, enabled: bool) -> Any:
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

  return tqdm.tqdm(
    total=total,
    initial=initial,
    unit='ex',
    desc='infer',
    disable=not enabled,
    dynamic_ncols=True,
  )


def _batch(
  decoder: decode_lib.Decoder,
  data: task_data.TaskData,
  hosts: hosts_lib.Hosts,
  lengths: Any,
  indices: list[int],
  counts: _Counts,
) -> list[dict[str, Any]]:
  """Decodes one batch; returns its chunk rows (the writer's; the others
  get none) and adds it to `counts`."""
  s = decoder.settings
  enc, seeds = hosts.batch(data.token_lists, lengths, indices, s)
  out, seconds = decoder(enc, seeds)
  scores = decoder.scores(enc, out) if s.mode == 'predict_with_aux' else None
  counts.seconds += seconds
  rows = []
  for r, i in enumerate(indices):
    tokens = decode_lib.row_tokens(out, r)
    stats = decode_lib.row_stats(out, r, tokens, s.max_decode_len)
    counts.examples += 1
    counts.tokens += stats['tokens']
    counts.beta_sum += stats['beta_sum']
    counts.tested += stats['tested']
    if not hosts.writer:
      continue
    feature = data.features[i]
    provenance = decoding.row_provenance(out, r, tokens)
    obj = decode_lib.line(
      feature['pretokenized'],
      data.decode(tokens),
      tokens,
      s,
      None if scores is None else scores[r],
      provenance,
    )
    row = {
      'index': i,
      'task': feature['subtask'],
      'line': obj,
      **stats,
      'seconds': seconds / len(indices),
    }
    if i < s.page_examples:  # examples.html draws it (`infer/page.py`).
      row['page'] = {
        'input': data.examples[i]['inputs'],
        'tokens': tokens,
        **provenance,
      }
    rows.append(row)
  return rows


def _summary(
  rows: list[dict[str, Any]],
  counts: _Counts,
  s: settings_lib.InferSettings,
  hosts: hosts_lib.Hosts,
) -> dict[str, Any]:
  """infer_summary.json: the whole run's counts, and the throughput of
  the part decoded by this process's run (a resumed run's last part)."""
  n = len(rows)
  tokens = sum(r['tokens'] for r in rows)
  calls = sum(r['calls'] for r in rows)
  seconds = sum(r['seconds'] for r in rows)
  tested = sum(r['tested'] for r in rows)
  return {
    'examples': n,
    'tokens': tokens,
    'seconds': seconds,
    'examples_per_second': n / seconds if seconds else None,
    'tokens_per_second': tokens / seconds if seconds else None,
    'target_calls': calls,
    'tokens_per_call': tokens / calls if calls else None,
    'alpha': sum(r['beta_sum'] for r in rows) / tested if tested else None,
    'no_eos_fraction': sum(r['ran_out'] for r in rows) / n,
    'this_run': {
      'examples': counts.examples,
      'seconds': counts.seconds,
      'examples_per_second': (
        counts.examples / counts.seconds if counts.seconds else None
      ),
    },
    'mode': s.mode,
    'gamma': s.gamma_value,
    'tree': s.tree,
    'decode_method': s.method,
    'batch_size': s.batch_size,
    'max_decode_len': s.max_decode_len,
    'mesh': hosts.mesh,
    'num_processes': hosts.count,
  }

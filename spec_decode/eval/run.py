"""Eval runs: a task split decoded plainly and speculatively, side by side.

`evaluate` is the library entry point of `spec-decode eval` (the gin wrapper
lives in `eval/cli.py`; this module has no gin decorators). Its settings are
one `EvalSettings` (`eval/settings.py`), checked when built, before anything
loads or compiles. One run:

1. reads the first `num_examples` examples of a task split (a fixed subset):
   a built-in task's `prefix + source` tokenized with the target's
   vocabulary, or a seqio task's or mixture's examples as its preprocessors
   make them (`eval/task_data.py`);
2. decodes every batch twice with the same per-example seeds (seed + example
   index): plainly with the target, then speculatively with the draft, for
   each γ of the run. Each new input shape is decoded once untimed first
   (compilation), so walltimes exclude compile time (`eval/decoding.py`);
3. measures c (draft step time / target step time) and v (target time for
   γ + 1 tokens / for 1 token) with `costs.measure` (a drafter that is not
   a language model is timed through `propose`);
4. reports quality (BLEU or ROUGE; a seqio task's own metrics) of both
   decodes, exactness (the fraction of examples whose speculative tokens
   equal the plain ones), alpha,
   the accepted-length histogram, per-position acceptance, calls, the
   measured speedup and the predictions of Theorem 3.8 and of
   E[tokens] / (γc + v), as in the paper's Table 4 (`eval/report.py`).

`gamma` is an int, a list of ints (a sweep: every γ is decoded and speedup
against γ is plotted; the top-level fields describe the first γ), or
`'auto'` (a calibration pass on a few batches measures α, c and v(k) and
`theory.choose_gamma` picks γ; the choice is reported).

Output directory (`eval/records.py`; the numbers and the report come from
`eval/report.py`):
  results.json           every figure (`TIMING_KEYS` mark the timing ones)
  summary.md             the Markdown report (also printed)
  examples.jsonl         one line per example: input, reference, plain and
                         speculative outputs, acceptance counts, timings
  run_state.json         the run's settings (and an auto-γ choice)
  accepted_histogram.png, speedup_vs_gamma.png (sweeps)
  <task>-predict.jsonl-00000-of-00001
                         as T5X's infer writes them: per example `inputs`
                         (the `*_pretokenized` features), `prediction` (the
                         speculative output of the first γ), `targets` and
                         `plain_prediction`; one file per subtask

Crash safety: each batch's lines are appended to examples.jsonl (flushed and
fsynced) as soon as the batch is decoded. A rerun with the same output
directory and settings resumes after the last complete batch; the results
are computed from examples.jsonl, so they are the same as those of an
uninterrupted run (timings excluded). Different settings in an existing
directory are refused unless `overwrite=True`.

This module also re-exports the names gin files and callers use through it
(`spec_eval.EvalSettings`, `spec_eval.load_model`, the file names, ...).
"""

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from spec_decode import theory
from spec_decode.data import seqio_data
from spec_decode.eval import decoding
from spec_decode.eval import hosts as hosts_lib
from spec_decode.eval import loading
from spec_decode.eval import records as records_lib
from spec_decode.eval import report
from spec_decode.eval import settings as settings_lib
from spec_decode.eval import task_data
from spec_decode.parallel import memory
from spec_decode.t5 import vocab as vocab_lib

EvalSettings = settings_lib.EvalSettings
parse_gamma = settings_lib.parse_gamma
load_model = loading.load_model
partitioner = loading.partitioner
task_vocabulary = loading.task_vocabulary
RESULTS_FILE = records_lib.RESULTS_FILE
SUMMARY_FILE = records_lib.SUMMARY_FILE
EXAMPLES_FILE = records_lib.EXAMPLES_FILE
STATE_FILE = records_lib.STATE_FILE
HISTOGRAM_PLOT = records_lib.HISTOGRAM_PLOT
SWEEP_PLOT = records_lib.SWEEP_PLOT
TIMING_KEYS = report.TIMING_KEYS
strip_timings = report.strip_timings


def evaluate(
  target: Any,
  draft: Any,
  settings: settings_lib.EvalSettings,
  *,
  output_dir: str,
  overwrite: bool = False,
  progress: bool = True,
  print_summary: bool = True,
  on_batch_done: Callable[[int], None] | None = None,
) -> dict[str, Any]:
  """Decodes a task split plainly and speculatively and writes the report.

  Args:
    target: the target model (any language model with a `vocabulary`).
    draft: the draft (same vocabulary).
    settings: what to decode and how (task, γ, sampling, lengths, ...).
    output_dir: where the files go (see the module docstring).
    overwrite: replace a run with other settings in `output_dir`.
    progress: show a tqdm progress bar.
    print_summary: print the Markdown summary at the end.
    on_batch_done: called with the number of completed examples after each
      batch is saved (tests use it to interrupt a run).

  Returns:
    The contents of results.json.

  Raises:
    ValueError: no vocabulary, vocabularies that differ (draft, target or a
      seqio task), an empty split, or `output_dir` holding a run with other
      settings.
  """
  s = settings
  vocab = loading.as_vocabulary(s.vocabulary) or getattr(
    target, 'vocabulary', None
  )
  draft_vocab = getattr(draft, 'vocabulary', None)
  vocab_lib.check_compatible(vocab, draft_vocab)
  hosts = hosts_lib.Hosts(target, draft, s.batch_size)
  extra = s.calibration_batches * s.batch_size if s.gamma == 'auto' else 0
  data = task_data.load(s, vocab, extra, hosts.owns)
  vocab_lib.check_compatible(data.vocabulary, draft_vocab)
  exs = data.examples
  hosts.report_share(data.num_read, len(exs) + len(data.calibration_tokens))
  lengths = hosts.agreed_lengths(data.token_lists + data.calibration_tokens)
  # Process 0 writes every example's text and scores them all.
  hosts.gather_examples(exs, data.features)
  identity = run_identity(s, len(exs), target, draft, data.vocabulary)
  if data.source != seqio_data.BUILTIN:
    identity['task_source'] = data.source
  path = os.path.join(output_dir, EXAMPLES_FILE)
  opened = None
  if hosts.writer:
    try:
      state = records_lib.prepare_dir(output_dir, identity, overwrite)
      records = records_lib.read_records(path, s.batch_size, len(exs))
      opened = {'state': state, 'done': len(records)}
    except ValueError as e:
      opened = {'error': str(e)}
  opened = hosts.share(opened)
  if 'error' in opened:
    raise ValueError(opened['error'])
  state = opened['state']
  if not hosts.writer:  # Process 0 holds the earlier records.
    records = [None] * opened['done']
  decode = decoding.Decoder(target, draft, s)

  if s.gamma == 'auto':
    if 'gamma_choice' not in state:
      state['gamma_choice'] = hosts.share(
        _calibrate(decode, data, hosts, lengths)
      )
      if hosts.writer:
        records_lib.save_state(output_dir, state)
    gammas = [int(state['gamma_choice']['gamma'])]
  else:
    gammas = list(s.gamma)

  _run_batches(
    decode,
    data,
    hosts,
    lengths,
    records,
    gammas,
    path if hosts.writer else None,
    progress and hosts.writer,
    on_batch_done,
  )

  costs = decode.costs([g + 1 for g in gammas], gammas[0])
  results = None
  if hosts.writer:
    results = report.results(
      records, gammas, data.score, s.batch_size, costs, data.metric
    )
    results.update(
      **s.reported(),
      task_source=data.source,
      exact_algorithm=s.exact_algorithm,
      target=loading.describe(target, s.target_name),
      draft=loading.describe(draft, s.draft_name),
      gamma_mode=(
        'auto'
        if 'gamma_choice' in state
        else 'sweep'
        if len(gammas) > 1
        else 'fixed'
      ),
      gamma_choice=state.get('gamma_choice'),
      mesh=hosts.mesh,
      num_processes=hosts.count,
      memory=memory.decode_bytes(
        target,
        draft,
        s.batch_size,
        max(s.max_input_len, 1),
        s.max_decode_len,
        max(gammas),
      ),
    )
    summary = report.summary_markdown(results)
    records_lib.write_results(output_dir, results, summary)
    records_lib.write_predictions(
      output_dir, data.subtasks, data.pretokenized, records, gammas[0]
    )
    if print_summary:
      print(summary)
  return hosts.share(results)


def run_identity(
  s: settings_lib.EvalSettings,
  num_examples: int,
  target: Any,
  draft: Any,
  vocab: vocab_lib.Vocabulary,
) -> dict[str, Any]:
  """What run_state.json records: a rerun must match it to resume.

  Every setting that changes a decoded token is in it (`s.reported()`:
  task, split, sampling, decode method and, for beam search, its beams and
  brevity penalty, lengths, seed, ...), so that a resumed directory never
  mixes outputs of two settings.
  """
  identity = {
    **s.reported(),
    'num_examples': num_examples,
    'gamma': s.gamma if s.gamma == 'auto' else list(s.gamma),
    'target': loading.fingerprint(target),
    'draft': loading.fingerprint(draft),
    'vocabulary': vocab.digest,
  }
  return json.loads(json.dumps(identity))


def _run_batches(
  decode: decoding.Decoder,
  data: task_data.TaskData,
  hosts: hosts_lib.Hosts,
  lengths: np.ndarray,
  records: list[dict[str, Any] | None],
  gammas: list[int],
  path: str | None,
  progress: bool,
  on_batch_done: Callable[[int], None] | None,
) -> None:
  """Decodes the batches after `records`; appends to them and to `path`
  (None: this process does not write)."""
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

  exs, to_text = data.examples, data.decode
  done = len(records)
  batch_size = decode.settings.batch_size
  bar = tqdm.tqdm(
    total=len(exs),
    initial=done,
    unit='ex',
    desc='eval',
    disable=not progress,
    dynamic_ncols=True,
  )
  totals = {'beta': 0.0, 'tested': 0, 'tokens': 0, 'seconds': 0.0}
  try:
    for indices in decoding.batches(done, len(exs), batch_size):
      enc, seeds = hosts.batch(
        data.token_lists, lengths, indices, decode.settings
      )
      plain, plain_s = decode(enc, seeds)
      specs = {g: decode(enc, seeds, g) for g in gammas}
      if not hosts.writer:  # It lacks the other shares' text: process 0
        records.extend([None] * len(indices))  # builds the records.
        if on_batch_done is not None:
          on_batch_done(len(records))
        continue
      new = []
      for r, i in enumerate(indices):
        tokens = plain.tokens[r, : plain.lengths[r]].tolist()
        rec = {
          'index': i,
          'input': exs[i]['inputs'],
          'reference': exs[i]['targets'],
          'input_tokens': int(lengths[i]),
          'plain': to_text(tokens),
          'plain_tokens': tokens,
          'plain_seconds': plain_s / len(indices),
          **decoding.plain_row_record(plain, r),
          'speculative': {},
        }
        for g, (out, secs) in specs.items():
          st = out.tokens[r, : out.lengths[r]].tolist()
          row = decoding.row_spec_record(out.stats, r, st, g)
          rec['speculative'][str(g)] = dict(
            text=to_text(st),
            tokens=st,
            exact=decoding.same_output(plain, out, r),
            seconds=secs / len(indices),
            **row,
          )
          if g == gammas[0]:
            totals['beta'] += row['beta_sum']
            totals['tested'] += row['tested']
            totals['tokens'] += len(st)
        new.append(rec)
      totals['seconds'] += specs[gammas[0]][1]
      if path is not None:
        records_lib.append_records(path, new)
      records.extend(new)
      bar.update(len(indices))
      bar.set_postfix(
        alpha=f'{totals["beta"] / max(totals["tested"], 1):.3f}',
        tok_s=f'{totals["tokens"] / max(totals["seconds"], 1e-9):.1f}',
      )
      if on_batch_done is not None:
        on_batch_done(len(records))
  finally:
    bar.close()


def _calibrate(
  decode: decoding.Decoder,
  data: task_data.TaskData,
  hosts: hosts_lib.Hosts,
  lengths: np.ndarray,
) -> dict[str, Any]:
  """Auto-γ: α from a few speculative batches, c and v(k), then γ.

  The calibration examples follow the evaluated ones in the split when the
  split has them (else the first evaluated batches are reused); they only
  choose γ and are not part of the results.
  """
  s = decode.settings
  n_eval = len(data.token_lists)
  token_lists = data.token_lists + data.calibration_tokens
  if len(token_lists) > n_eval:
    cal = decoding.batches(n_eval, len(token_lists), s.batch_size)
  else:
    cal = decoding.batches(0, n_eval, s.batch_size)
  cal = cal[: s.calibration_batches]
  beta_sum, tested = 0.0, 0
  for indices in cal:
    enc, seeds = hosts.batch(token_lists, lengths, indices, s)
    out, _ = decode(enc, seeds, s.calibration_gamma, timed=False)
    for r in range(len(indices)):
      st = out.tokens[r, : out.lengths[r]].tolist()
      row = decoding.row_spec_record(out.stats, r, st, s.calibration_gamma)
      beta_sum += row['beta_sum']
      tested += row['tested']
  alpha = min(max(beta_sum / max(tested, 1), 0.0), 1.0)
  costs = decode.costs(range(1, s.max_auto_gamma + 2), s.calibration_gamma)
  choice = theory.choose_gamma(
    alpha, costs['c'], costs['v_of_k'], max_gamma=s.max_auto_gamma
  )
  return {
    'gamma': int(choice.gamma),
    'alpha': alpha,
    'calibration': {
      'examples': sum(len(b) for b in cal),
      'gamma': s.calibration_gamma,
      'c': costs['c'],
      'v_of_k': {str(k): v for k, v in costs['v_of_k'].items()},
      'predicted_improvement': float(choice.improvement),
    },
  }

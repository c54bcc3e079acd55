"""Eval runs: a task split decoded plainly and speculatively, side by side.

`evaluate` is the library entry point of `spec-decode eval` (the gin wrapper
lives in `eval/cli.py`; this module has no gin decorators). Its settings are
one `EvalSettings` (`eval/settings.py`), checked when built, before anything
loads or compiles. One run:

1. reads the first `num_examples` examples of a task split (a fixed subset):
   a built-in task's `prefix + source` tokenized with the target's
   vocabulary, or a seqio task's or mixture's examples as its preprocessors
   make them (`eval/load/task_data.py`);
2. decodes every batch plainly with the target and speculatively with the
   draft (for each γ of the run), with the same per-example seeds (seed +
   example index), and with the draft alone; each new input shape is
   decoded once untimed first (compilation), so walltimes exclude compile
   time (`eval/decoding.py`);
3. times those decodes and the batch's cost probes (a target call on 1
   and on γ+1 tokens, a draft step, each on its own at the batch's shapes)
   in `timing_rounds` rounds of rotating order (`eval/rounds.py`): the
   speedup is the median of the rounds' ratios, and c and v, timed apart
   from the loops, give a prediction that can miss the measurement;
4. reports quality (BLEU or ROUGE; a seqio task's own metrics) of both
   decodes, exactness (the fraction of examples whose speculative tokens
   equal the plain ones), the outputs that ran to max_decode_len without
   EOS and every figure apart for them and the rest (`eval/report/outcomes.py`),
   alpha,
   the accepted-length histogram, per-position acceptance, calls, the
   measured speedup and the predictions of Theorem 3.8 and of
   E[tokens] / (γc + v), as in the paper's Table 4 (`eval/report/`).

`gamma` is an int, a list of ints (a sweep: every γ is decoded and speedup
against γ is plotted; the top-level fields describe the first γ), or
`'auto'`: the speculative side is `sd.generate(gamma='auto')`, whose
finish-time policy picks each iteration's γ in {0, ..., max_auto_gamma} inside
the compiled loop from the rows' running acceptance and a cost model
measured once and cached on disk (`policy/finish_time.py`,
`policy/loop_costs.py`). Nothing is decoded to choose γ and the policy never
sees the draws it decodes with. Its records are keyed `'auto'`; the report
gives the iterations run at each γ and the cost model(s) used (run_state.json
keeps them, so a resumed run reports them too). Each batch's policy starts
from the acceptance estimate of the batches before it (`policy/carried.py`;
the first from the policy's prior), never from its own draws; where that
estimate says no γ >= 1 can pay, the batch runs plain decoding's program
outright. run_state.json keeps the estimate (`gamma_policy.acceptance`), so
a resumed run carries on from it.

Output directory (`eval/records.py`; the numbers and the report come from
`eval/report/`):
  results.json           every figure (`TIMING_KEYS` mark the timing ones)
  summary.md             the Markdown report (also printed)
  examples.jsonl         one line per example: input, reference, plain and
                         speculative outputs, acceptance counts, timings,
                         each speculative token's provenance
  examples.html          every example with the paper's Figure 1 colouring
                         (`eval/report/pages.py`), the plots
  run_state.json         the run's settings (and auto-γ's cost models)
  accepted_histogram.png, position_acceptance.png, speedup_vs_gamma.png
                         (sweeps), linked from summary.md
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
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from spec_decode.data import seqio_data
from spec_decode.eval import decoding
from spec_decode.eval import hosts as hosts_lib
from spec_decode.eval import records as records_lib
from spec_decode.eval import report
from spec_decode.eval import rounds as rounds_lib
from spec_decode.eval import settings as settings_lib
from spec_decode.eval.load import models as models_lib
from spec_decode.eval.load import task_data
from spec_decode.eval.report import outcomes
from spec_decode.eval.report import pages
from spec_decode.parallel import memory
from spec_decode.policy import carried
from spec_decode.t5 import vocab as vocab_lib

EvalSettings = settings_lib.EvalSettings
parse_gamma = settings_lib.parse_gamma
load_model = models_lib.load_model
partitioner = models_lib.partitioner
task_vocabulary = models_lib.task_vocabulary
RESULTS_FILE = records_lib.RESULTS_FILE
SUMMARY_FILE = records_lib.SUMMARY_FILE
EXAMPLES_FILE = records_lib.EXAMPLES_FILE
STATE_FILE = records_lib.STATE_FILE
PAGE_FILE = records_lib.PAGE_FILE
HISTOGRAM_PLOT = records_lib.HISTOGRAM_PLOT
POSITION_PLOT = records_lib.POSITION_PLOT
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
  vocab = models_lib.as_vocabulary(s.vocabulary) or getattr(
    target, 'vocabulary', None
  )
  draft_vocab = getattr(draft, 'vocabulary', None)
  vocab_lib.check_compatible(vocab, draft_vocab)
  hosts = hosts_lib.Hosts(target, draft, s.batch_size)
  data = task_data.load(s, vocab, hosts.owns)
  vocab_lib.check_compatible(data.vocabulary, draft_vocab)
  exs = data.examples
  hosts.report_share(data.num_read, len(exs))
  lengths = hosts.agreed_lengths(data.token_lists)
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
  auto = s.gamma == 'auto'
  gammas = list(s.gammas)
  carried_json = state.get('gamma_policy', {}).get('acceptance')
  if auto and carried_json and not s.beam:  # A resumed run carries on.
    decode.acceptance = carried.AcceptanceEstimate.from_json(carried_json)

  def batch_done(done: int) -> None:
    decode.finish_batch()
    if auto and hosts.writer and _merge_cost_models(state, decode):
      records_lib.save_state(output_dir, state)
    if on_batch_done is not None:
      on_batch_done(done)

  _run_batches(
    decode,
    data,
    hosts,
    lengths,
    records,
    gammas,
    path if hosts.writer else None,
    progress and hosts.writer,
    batch_done,
  )

  # c and v for the report's predictions are timed apart from the loops:
  # by each batch's probes, in the rounds beside its decodes
  # (`rounds.Probes`). Beam search (no chain prediction) and records of an
  # older run have none: they are timed after the decodes
  # (`policy.timing.measure`), for 'auto' at the γs the policy ran.
  apart = hosts.share(
    not all('probe' in rec for rec in records) if hosts.writer else None
  )
  costs = None
  if apart:
    ran = hosts.share(_gammas_run(records) if auto and hosts.writer else None)
    ks = [g + 1 for g in (ran if auto else gammas)]
    costs = decode.costs(ks, max(ran or [1]) if auto else gammas[0])
  results = None
  if hosts.writer:
    results = report.results(
      records,
      gammas,
      data.score,
      s.batch_size,
      costs,
      data.metric,
      s.max_decode_len,
    )
    results.update(
      **s.reported(),
      task_source=data.source,
      exact_algorithm=s.exact_algorithm,
      target=models_lib.describe(target, s.target_name),
      draft=models_lib.describe(draft, s.draft_name),
      gamma_mode='auto' if auto else 'sweep' if len(gammas) > 1 else 'fixed',
      gamma_policy=state.get('gamma_policy') if auto else None,
      mesh=hosts.mesh,
      num_processes=hosts.count,
      memory=memory.decode_bytes(
        target,
        draft,
        s.batch_size,
        max(s.max_input_len, 1),
        s.max_decode_len,
        s.max_auto_gamma if auto else max(gammas),
      ),
    )
    summary = report.summary_markdown(results)
    records_lib.write_results(output_dir, results, summary)
    pages.write(output_dir, results, records, data.decode)
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
  mixes outputs of two settings. An auto-γ run adds its policy and
  `max_auto_gamma` (a directory of the former calibrated auto-γ, which
  lacks them, is refused rather than resumed).
  """
  identity = {
    **s.reported(),
    'num_examples': num_examples,
    'gamma': s.gamma if s.gamma == 'auto' else list(s.gamma),
    'target': models_lib.fingerprint(target),
    'draft': models_lib.fingerprint(draft),
    'vocabulary': vocab.digest,
  }
  if s.gamma == 'auto':
    identity['gamma_policy'] = 'finish_time'
    identity['max_auto_gamma'] = s.max_auto_gamma
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
  max_len = decode.settings.max_decode_len
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
      done_rows = len(indices)
      batch = _decode_batch(decode, enc, seeds, gammas, done_rows)
      plain, specs, alone = batch['plain'], batch['specs'], batch['alone']
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
          'plain_ran_out': outcomes.ran_out(tokens, max_len),
          **_seconds('plain_seconds', batch['plain_seconds'], done_rows),
          **decoding.plain_row_record(plain, r),
          'speculative': {},
        }
        if batch['probe'] is not None:
          rec['probe'] = batch['probe']
        if alone is not None:  # The draft's own decode: its step time.
          rec['draft_alone_tokens'] = int(alone.lengths[r])
          rec.update(
            _seconds('draft_alone_seconds', batch['alone_seconds'], done_rows)
          )
        for g, out in specs.items():
          st = out.tokens[r, : out.lengths[r]].tolist()
          row = decoding.row_spec_record(out.stats, r)
          rec['speculative'][str(g)] = dict(
            text=to_text(st),
            tokens=st,
            exact=decoding.same_output(plain, out, r),
            ran_out=outcomes.ran_out(st, max_len),
            **_seconds('seconds', batch['spec_seconds'][g], done_rows),
            **row,
            **decoding.row_provenance(out, r, st),
          )
          if g == gammas[0]:
            totals['beta'] += row['beta_sum']
            totals['tested'] += row['tested']
            totals['tokens'] += len(st)
        new.append(rec)
      totals['seconds'] += statistics.median(batch['spec_seconds'][gammas[0]])
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


def _decode_batch(
  decode: decoding.Decoder,
  enc: np.ndarray,
  seeds: np.ndarray,
  gammas: list[Any],
  rows: int,
) -> dict[str, Any]:
  """A batch decoded plainly, speculatively at each γ and by the draft
  alone, with the cost probes, in `timing_rounds` rotating rounds
  (`rounds.run_rounds`; round 0 starts with the plain decode, whose
  outputs place the probes).

  Returns:
    `{'plain', 'specs': {γ: output}, 'alone'` (None: no draft-alone
    decode), `'plain_seconds'`, `'spec_seconds': {γ: [R]}`,
    `'alone_seconds'` (seconds per round, whole batch), `'probe'` (the
    records' probe entry; None for beam search)}.
  """
  first = {}

  def plain():
    out = decode(enc, seeds)
    first.setdefault('plain', out[0])
    return out

  runs = {'plain': plain}
  for gamma in gammas:
    runs[f'speculative {gamma}'] = lambda gamma=gamma: decode(
      enc, seeds, gamma=gamma
    )
  if decode.decodes_draft_alone:
    runs['draft alone'] = lambda: decode.draft_alone(enc, seeds)
  probes = decode.probes(enc, gammas)
  if probes is not None:
    runs.update(
      probes.runs(
        lambda: np.mean(np.asarray(first['plain'].lengths)[:rows]) / 2
      )
    )
  outputs, seconds = rounds_lib.run_rounds(runs, decode.settings.timing_rounds)
  alone = 'draft alone' in outputs
  return {
    'plain': outputs['plain'],
    'specs': {g: outputs[f'speculative {g}'] for g in gammas},
    'alone': outputs['draft alone'] if alone else None,
    'plain_seconds': seconds['plain'],
    'spec_seconds': {g: seconds[f'speculative {g}'] for g in gammas},
    'alone_seconds': seconds['draft alone'] if alone else None,
    'probe': None if probes is None else probes.record(seconds),
  }


def _seconds(key: str, rounds: list[float], rows: int) -> dict[str, Any]:
  """A row's share of a batch's seconds: `key` the median over rounds,
  `key_rounds` each round's (a batch's seconds split evenly over its
  rows: at batch 1, the example's own)."""
  per_row = [s / rows for s in rounds]
  return {key: statistics.median(per_row), f'{key}_rounds': per_row}


def _gammas_run(records: list[dict[str, Any]]) -> list[int]:
  """The γs an auto run's rows ran at least one iteration at."""
  return sorted(
    {
      g
      for rec in records
      for g, n in enumerate(
        rec['speculative'][decoding.AUTO]['gamma_iterations']
      )
      if n
    }
  )


def _merge_cost_models(state: dict[str, Any], decode: decoding.Decoder) -> bool:
  """Adds the auto decodes' cost models to `state['gamma_policy']`, and
  the acceptance estimate carried to the next batch (`'acceptance'`:
  `policy.carried`; a resumed run starts from it).

  A resumed run keeps the models of the part before (each says whether it
  was measured or read from the cost cache); a model seen again is kept
  once (`decoding.add_cost_model`). Returns whether `state` changed.
  """
  policy = state.setdefault(
    'gamma_policy',
    {
      'policy': 'finish_time',
      'max_gamma': decode.settings.max_auto_gamma,
      'cost_models': [],
    },
  )
  before = json.dumps(policy, sort_keys=True)
  for model in decode.cost_models:
    decoding.add_cost_model(policy['cost_models'], model)
  if decode.acceptance is not None:
    policy['acceptance'] = decode.acceptance.to_json()
  return json.dumps(policy, sort_keys=True) != before

"""Eval runs: a task split decoded plainly and speculatively, side by side.

`evaluate` is the library entry point of `spec-decode eval` (the gin wrapper
lives in `eval_cli`; this module has no gin decorators). One run:

1. reads the first `num_examples` examples of a task split (a fixed subset),
   tokenizes `prefix + source` with the target's vocabulary;
2. decodes every batch twice with the same per-example seeds (seed + example
   index): plainly with the target, then speculatively with the draft, for
   each γ of the run. Each new input shape is decoded once untimed first
   (compilation), so walltimes exclude compile time;
3. measures c (draft step time / target step time) and v (target time for
   γ + 1 tokens / for 1 token) with `costs.measure` (a drafter that is not
   a language model is timed through `propose`);
4. reports quality (BLEU or ROUGE) of both decodes, exactness (the fraction
   of examples whose speculative tokens equal the plain ones), alpha,
   the accepted-length histogram, per-position acceptance, calls, the
   measured speedup and the predictions of Theorem 3.8 and of
   E[tokens] / (γc + v), as in the paper's Table 4.

`gamma` is an int, a list of ints (a sweep: every γ is decoded and speedup
against γ is plotted; the top-level fields describe the first γ), or
`'auto'` (a calibration pass on a few batches measures α, c and v(k) and
`theory.choose_gamma` picks γ; the choice is reported).

Output directory (the numbers and the report come from `eval_report`):
  results.json           every figure (`TIMING_KEYS` mark the timing ones)
  summary.md             the Markdown report (also printed)
  examples.jsonl         one line per example: input, reference, plain and
                         speculative outputs, acceptance counts, timings
  run_state.json         the run's settings (and an auto-γ choice)
  accepted_histogram.png, speedup_vs_gamma.png (sweeps)

Crash safety: each batch's lines are appended to examples.jsonl (flushed and
fsynced) as soon as the batch is decoded. A rerun with the same output
directory and settings resumes after the last complete batch; the results
are computed from examples.jsonl, so they are the same as those of an
uninterrupted run (timings excluded). Different settings in an existing
directory are refused unless `overwrite=True`.
"""

import functools
import hashlib
import io
import json
import os
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np

import spec_decode as sd
from spec_decode import theory
from spec_decode.checkpoints import gin_model
from spec_decode.core import costs as costs_lib
from spec_decode.core import verify
from spec_decode.data import tasks as tasks_lib
from spec_decode.eval import report
from spec_decode.t5 import vocab as vocab_lib

RESULTS_FILE = 'results.json'
SUMMARY_FILE = 'summary.md'
EXAMPLES_FILE = 'examples.jsonl'
STATE_FILE = 'run_state.json'
HISTOGRAM_PLOT = report.HISTOGRAM_PLOT
SWEEP_PLOT = report.SWEEP_PLOT
TIMING_KEYS = report.TIMING_KEYS
strip_timings = report.strip_timings
REPO_DIR = os.path.dirname(gin_model.GIN_DIR)

_MIN_BUCKET = 8


# ------------------------------------------------------------ building blocks.


def resolve_path(path: str) -> str:
  """`path` as given if it exists, else relative to the repository root."""
  path = os.path.expanduser(os.fspath(path))
  if os.path.exists(path) or os.path.isabs(path):
    return path
  in_repo = os.path.join(REPO_DIR, path)
  return in_repo if os.path.exists(in_repo) else path


def load_model(
  checkpoint: str | None = None,
  model_gin: str | None = None,
  seed: int = 0,
  vocabulary: Any = None,
  vocab_size: int | None = None,
  dtype: Any = None,
) -> sd.Model:
  """A model from a checkpoint, or with random weights from a gin file.

  Args:
    checkpoint: our orbax directory, a Hugging Face T5 directory or a T5X
      checkpoint; a relative path is also looked up in the repository.
    model_gin: a gin model file (`models/t5_1_1/xxl.gin`): the
      hyperparameters of a T5X checkpoint, or, without a checkpoint, the
      network to initialize randomly (smoke tests).
    seed: seed of the random initialization.
    vocabulary: a `Vocabulary` or a sentencepiece `.model` path; overrides
      the checkpoint's (T5X checkpoints store none).
    vocab_size: embedding rows of a random model (default: the vocabulary's
      size).
    dtype: parameter storage dtype of a loaded checkpoint.

  Returns:
    The `Model`.

  Raises:
    FileNotFoundError: the checkpoint does not exist.
    ValueError: neither a checkpoint nor a gin file, or no vocabulary size.
  """
  vocab = _as_vocabulary(vocabulary)
  if checkpoint:
    path = resolve_path(checkpoint)
    if not os.path.exists(path):
      raise FileNotFoundError(f'checkpoint not found: {checkpoint}')
    return sd.Model.load(
      path, gin_file=model_gin, vocabulary=vocab, dtype=dtype
    )
  if not model_gin:
    raise ValueError('load_model needs a checkpoint or a model_gin file')
  if vocab_size is None:
    if vocab is None:
      raise ValueError(
        f'{model_gin}: a random model needs a vocabulary or a vocab_size'
      )
    vocab_size = vocab.vocab_size
  config = gin_model.config_from_gin(model_gin, vocab_size=int(vocab_size))
  return sd.Model.init(config, seed=seed, vocabulary=vocab)


def _as_vocabulary(vocabulary: Any) -> vocab_lib.Vocabulary | None:
  if vocabulary is None or isinstance(vocabulary, vocab_lib.Vocabulary):
    return vocabulary
  return vocab_lib.Vocabulary.from_file(resolve_path(vocabulary))


def task_vocabulary(
  task: str = 'synthetic_tiny',
  split: str = 'train',
  vocab_size: int = 64,
  extra_ids: int = 0,
) -> vocab_lib.Vocabulary:
  """A small sentencepiece vocabulary trained on a task split (smoke runs).

  Training is deterministic and cached per argument tuple, so target and
  draft built from the same arguments share one vocabulary.
  """
  return _train_vocabulary(task, split, int(vocab_size), int(extra_ids))


@functools.lru_cache(maxsize=8)
def _train_vocabulary(task, split, vocab_size, extra_ids):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  texts = []
  for ex in tasks_lib.examples(task, split):
    texts += [ex['inputs'], ex['targets']]
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(texts),
    model_writer=model,
    vocab_size=vocab_size,
    model_type='unigram',
    character_coverage=1.0,
    pad_id=0,
    eos_id=1,
    unk_id=2,
    bos_id=-1,
    hard_vocab_limit=False,
    num_threads=1,
    minloglevel=2,
  )
  return vocab_lib.Vocabulary(
    model.getvalue(), extra_ids=extra_ids, name=f'{task}/{split}'
  )


def describe(model: Any, name: str | None = None) -> str:
  """A short label: `name`, else the size of a T5 `Model`."""
  if name:
    return name
  cfg = getattr(model, 'config', None)
  params = getattr(model, 'params', None)
  if cfg is None or params is None:
    return type(model).__name__
  import jax  # pylint: disable=g-import-not-at-top

  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  return (
    f'T5 {n / 1e6:.1f}M (d{cfg.emb_dim}, '
    f'{cfg.num_encoder_layers}+{cfg.num_decoder_layers}L)'
  )


def _fingerprint(model: Any) -> dict[str, Any]:
  """Identifies a model or drafter: a T5 config, else a digest of leaves."""
  cfg = getattr(model, 'config', None)
  vocab = getattr(model, 'vocabulary', None)
  out = {
    'type': type(model).__name__,
    'config': cfg.to_dict() if hasattr(cfg, 'to_dict') else None,
    'vocabulary': getattr(vocab, 'digest', None),
  }
  if out['config'] is None:
    import jax  # pylint: disable=g-import-not-at-top

    leaves, tree = jax.tree.flatten(model)
    digest = hashlib.sha1(str(tree).encode())
    for leaf in leaves:
      if hasattr(leaf, 'dtype') and jax.dtypes.issubdtype(
        leaf.dtype, jax.dtypes.prng_key
      ):
        leaf = jax.random.key_data(leaf)
      digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    out['digest'] = digest.hexdigest()
  return out


def parse_gamma(gamma: Any) -> list[int] | str:
  """`'auto'`, or a non-empty list of distinct ints >= 1 (order kept)."""
  if isinstance(gamma, str):
    if gamma.strip().lower() == 'auto':
      return 'auto'
    gamma = [int(g) for g in gamma.replace(',', ' ').split()]
  elif isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool):
    gamma = [int(gamma)]
  try:
    gammas = list(dict.fromkeys(int(g) for g in gamma))
  except (TypeError, ValueError):
    gammas = []
  if not gammas or min(gammas) < 1:
    raise ValueError(
      f"gamma must be an int >= 1, a list of them or 'auto', got {gamma!r}"
    )
  return gammas


def _bucket(n: int, max_len: int) -> int:
  b = _MIN_BUCKET
  while b < n:
    b *= 2
  return min(b, max_len)


def measure_costs(
  target: Any,
  draft: Any,
  ks: Sequence[int],
  batch: int,
  repeats: int,
  sampling: dict[str, Any] | None = None,
  gamma: int = 4,
) -> dict[str, Any]:
  """c and v(k) (`costs.measure`); a drafter is timed proposing `gamma`.

  Returns:
    `{'c', 'v_of_k': {k: v(k)}, 'target_step_seconds',
    'draft_step_seconds'}`, v(1) = 1.
  """
  settings = sd.DecodeSettings(
    max_decode_len=1, sampler=sd.Sampler(**(sampling or {})), gamma=gamma
  )
  return costs_lib.measure(target, draft, ks, batch, repeats, settings)


class _Decoder:
  """Runs and times `sd.generate`, compiling each new shape untimed first."""

  def __init__(
    self, target, draft, sampling, max_decode_len, verifier, dynamic_gamma=0.0
  ):
    self.target = target
    self.draft = draft
    self.kwargs = dict(sampling, max_decode_len=max_decode_len)
    self.verifier = verifier
    self.dynamic_gamma = dynamic_gamma
    self._seen = set()

  def kwargs_sampling(self) -> dict[str, Any]:
    return {k: self.kwargs[k] for k in ('temperature', 'top_k', 'top_p')}

  def __call__(
    self,
    enc: np.ndarray,
    seeds: np.ndarray,
    gamma: int | None = None,
    timed: bool = True,
  ):
    kw = dict(self.kwargs, seed=seeds)
    if gamma is not None:
      kw.update(
        draft=self.draft,
        gamma=gamma,
        verifier=self.verifier,
        dynamic_gamma=self.dynamic_gamma or False,
      )
    key = (enc.shape, gamma)
    if timed and key not in self._seen:
      sd.generate(self.target, enc, **kw)  # Warm-up: compile.
    self._seen.add(key)
    t0 = time.perf_counter()
    out = sd.generate(self.target, enc, **kw)
    return out, time.perf_counter() - t0


def _batch_arrays(token_lists, indices, batch_size, max_input_len, seed):
  """Encoder tokens `[batch_size, S]` and row seeds; short batches repeat
  their last row (its results are dropped)."""
  rows = [token_lists[i] for i in indices]
  seeds = [seed + i for i in indices]
  while len(rows) < batch_size:
    rows.append(rows[-1])
    seeds.append(seeds[-1])
  width = _bucket(max(len(r) for r in rows), max_input_len)
  enc = np.zeros((batch_size, width), np.int32)
  for b, r in enumerate(rows):
    enc[b, : len(r)] = r
  return enc, np.asarray(seeds, np.int64)


def _row_spec_record(
  stats: sd.SpecStats, r: int, tokens: list[int], gamma: int
) -> dict[str, Any]:
  """Per-example acceptance counts of row `r` of a speculative batch.

  `position_tries[i]` / `position_accepts[i]`: iterations that tested /
  accepted draft token i. `SpecStats` exposes per-row histograms and alpha
  but not per-row position counts; until it does (`row_position_tries`,
  `row_position_accepts`, `row_beta_sum`, used when present) they are
  derived from the histogram, counting the last iteration's tokens dropped
  after EOS or at max_decode_len as tested (at most one per example).
  """
  hist = np.asarray(stats.row_accepted_histogram[r], np.int64)
  iterations = int(stats.row_iterations[r])
  tries = getattr(stats, 'row_position_tries', None)
  accepts = getattr(stats, 'row_position_accepts', None)
  if tries is not None and accepts is not None:
    tries = np.asarray(tries[r], np.int64)
    accepts = np.asarray(accepts[r], np.int64)
    tested = int(tries.sum())
  else:
    n = np.arange(gamma + 1)
    tries = np.array([hist[i:].sum() for i in range(gamma)], np.int64)
    accepts = np.array([hist[i + 1 :].sum() for i in range(gamma)], np.int64)
    dropped = int((hist * (n + 1)).sum()) - len(tokens)
    tested = max(int((hist * np.minimum(n + 1, gamma)).sum()) - dropped, 0)
  beta_sums = getattr(stats, 'row_beta_sum', None)
  alpha = float(stats.row_alpha[r])
  beta_sum = float(beta_sums[r]) if beta_sums is not None else alpha * tested
  return {
    'iterations': iterations,
    'accepted_histogram': hist.tolist(),
    'position_tries': tries.tolist(),
    'position_accepts': accepts.tolist(),
    'tested': tested,
    'beta_sum': beta_sum,
    'alpha': alpha,
    'proposed': (
      int(stats.row_proposed[r])
      if getattr(stats, 'row_proposed', None) is not None
      else gamma * iterations
    ),
  }


# ------------------------------------------------------------ files, resume.


def _write_json(path: str, obj: Any) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(obj, f, indent=2, ensure_ascii=False)
    f.write('\n')
  os.replace(tmp, path)


def _read_records(
  path: str, batch_size: int, total: int
) -> list[dict[str, Any]]:
  """Complete batches of `examples.jsonl`; the file is cut back to them.

  A crash can leave a partial last line or a partial batch: both are
  dropped (and truncated away) so that the rerun redoes whole batches.
  """
  if not os.path.exists(path):
    return []
  records, offsets, offset = [], [0], 0
  with open(path, 'rb') as f:
    for line in f:
      if not line.endswith(b'\n'):
        break
      try:
        rec = json.loads(line)
      except ValueError:
        break
      if rec.get('index') != len(records):
        break
      records.append(rec)
      offset += len(line)
      offsets.append(offset)
  keep = min(len(records), total)
  if keep < total:
    keep = keep // batch_size * batch_size
  with open(path, 'r+b') as f:
    f.truncate(offsets[keep])
  return records[:keep]


def _append_records(path: str, records: list[dict[str, Any]]) -> None:
  text = ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records)
  with open(path, 'a', encoding='utf-8') as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


def _prepare_dir(
  output_dir: str, settings: dict[str, Any], overwrite: bool
) -> dict[str, Any]:
  """Creates or reopens the output directory; returns the stored state."""
  os.makedirs(output_dir, exist_ok=True)
  state_path = os.path.join(output_dir, STATE_FILE)
  if os.path.exists(state_path) and not overwrite:
    with open(state_path, encoding='utf-8') as f:
      state = json.load(f)
    if state.get('settings') == settings:
      return state
    old = state.get('settings', {})
    diff = sorted(
      k for k in set(old) | set(settings) if old.get(k) != settings.get(k)
    )
    raise ValueError(
      f'{output_dir} holds a run with other settings (differing: '
      f'{", ".join(diff)}); choose another output directory, or overwrite '
      'it (--overwrite / overwrite=True)'
    )
  for name in (
    EXAMPLES_FILE,
    RESULTS_FILE,
    SUMMARY_FILE,
    HISTOGRAM_PLOT,
    SWEEP_PLOT,
  ):
    path = os.path.join(output_dir, name)
    if os.path.exists(path):
      os.remove(path)
  state = {'settings': settings}
  _write_json(state_path, state)
  return state


# ------------------------------------------------------------------ the run.


def evaluate(
  *,
  target: Any,
  draft: Any,
  task: str,
  output_dir: str,
  split: str = 'test',
  num_examples: int | None = 100,
  batch_size: int = 1,
  gamma: Any = 4,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
  max_decode_len: int = 64,
  max_input_len: int = 512,
  seed: int = 0,
  lenience: float = 1.0,
  dynamic_gamma: float = 0.0,
  vocabulary: Any = None,
  data_dir: str | None = None,
  target_name: str | None = None,
  draft_name: str | None = None,
  timing_repeats: int = 5,
  calibration_batches: int = 4,
  calibration_gamma: int = 4,
  max_auto_gamma: int = 8,
  overwrite: bool = False,
  progress: bool = True,
  print_summary: bool = True,
  on_batch_done: Callable[[int], None] | None = None,
) -> dict[str, Any]:
  """Decodes a task split plainly and speculatively and writes the report.

  Args:
    target: the target model (any language model with a `vocabulary`).
    draft: the draft (same vocabulary).
    task: a `tasks.task_names()` name.
    output_dir: where the files go (see the module docstring).
    split: the split to read.
    num_examples: the first this many examples (None: the whole split).
    batch_size: rows per decode (the paper: 1).
    gamma: an int, a list of ints (sweep) or 'auto'.
    temperature: 0 is greedy.
    top_k: 0 keeps every id.
    top_p: 1.0 keeps every id.
    max_decode_len: output tokens per example at most (EOS included).
    max_input_len: inputs are cut to this many tokens (EOS included).
    seed: example i is decoded with seed `seed + i`, plainly and
      speculatively alike.
    lenience: 1.0 is Algorithm 1; below 1 (appendix A.5) the output is no
      longer the target's distribution, and the run is labelled not exact.
    dynamic_gamma: 0 (fixed gamma) or a draft-confidence threshold in
      (0, 1): gamma is then the most tokens an iteration proposes (see
      `generate`); exact either way.
    vocabulary: a `Vocabulary` or `.model` path, when the target has none.
    data_dir: the task's data directory (None: its default).
    target_name: label of the target in the report.
    draft_name: label of the draft in the report.
    timing_repeats: repeats of each step-time measurement (medians).
    calibration_batches: batches decoded by the auto-γ calibration.
    calibration_gamma: γ of the calibration decodes.
    max_auto_gamma: largest γ auto-γ considers.
    overwrite: replace a run with other settings in `output_dir`.
    progress: show a tqdm progress bar.
    print_summary: print the Markdown summary at the end.
    on_batch_done: called with the number of completed examples after each
      batch is saved (tests use it to interrupt a run).

  Returns:
    The contents of results.json.
  """
  vocab = _as_vocabulary(vocabulary) or getattr(target, 'vocabulary', None)
  if vocab is None:
    raise ValueError('the target has no vocabulary; pass vocabulary=')
  vocab_lib.check_compatible(vocab, getattr(draft, 'vocabulary', None))
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}')
  gammas = parse_gamma(gamma)
  task_obj = tasks_lib.get_task(task, data_dir)
  exs = list(tasks_lib.examples(task_obj, split, limit=num_examples))
  if not exs:
    raise ValueError(f'{task}/{split} has no examples')
  token_lists = [
    vocab.encode(ex['inputs'])[: max_input_len - 1] + [sd.EOS_ID] for ex in exs
  ]
  sampling = dict(
    temperature=float(temperature), top_k=int(top_k), top_p=float(top_p)
  )
  exact_algorithm = float(lenience) == 1.0
  verifier = verify.ExactVerifier(lenience=float(lenience))
  settings = {
    'task': task,
    'split': split,
    'num_examples': len(exs),
    'batch_size': int(batch_size),
    'gamma': gammas,
    **sampling,
    'max_decode_len': int(max_decode_len),
    'max_input_len': int(max_input_len),
    'seed': int(seed),
    'lenience': float(lenience),
    'dynamic_gamma': float(dynamic_gamma or 0.0),
    'target': _fingerprint(target),
    'draft': _fingerprint(draft),
    'vocabulary': vocab.digest,
  }
  settings = json.loads(json.dumps(settings))
  state = _prepare_dir(output_dir, settings, overwrite)
  decode = _Decoder(
    target,
    draft,
    sampling,
    int(max_decode_len),
    verifier,
    float(dynamic_gamma or 0.0),
  )
  batches = [
    list(range(s, min(s + batch_size, len(exs))))
    for s in range(0, len(exs), batch_size)
  ]

  if gammas == 'auto':
    if 'gamma_choice' not in state:
      state['gamma_choice'] = _calibrate(
        decode,
        target,
        draft,
        task_obj,
        split,
        vocab,
        token_lists,
        batches,
        batch_size,
        max_input_len,
        seed,
        calibration_batches,
        calibration_gamma,
        max_auto_gamma,
        timing_repeats,
      )
      _write_json(os.path.join(output_dir, STATE_FILE), state)
    gammas = [int(state['gamma_choice']['gamma'])]

  path = os.path.join(output_dir, EXAMPLES_FILE)
  records = _read_records(path, batch_size, len(exs))
  _run_batches(
    decode,
    exs,
    token_lists,
    batches,
    records,
    gammas,
    vocab,
    batch_size,
    max_input_len,
    seed,
    path,
    progress,
    on_batch_done,
  )

  costs = measure_costs(
    target,
    draft,
    [g + 1 for g in gammas],
    batch_size,
    timing_repeats,
    sampling,
    gammas[0],
  )
  results = report.results(
    records, gammas, task_obj.metric, batch_size, costs
  )
  results.update(
    task=task,
    split=split,
    batch_size=int(batch_size),
    temperature=float(temperature),
    top_k=int(top_k),
    top_p=float(top_p),
    max_decode_len=int(max_decode_len),
    max_input_len=int(max_input_len),
    seed=int(seed),
    lenience=float(lenience),
    dynamic_gamma=float(dynamic_gamma or 0.0),
    exact_algorithm=exact_algorithm,
    target=describe(target, target_name),
    draft=describe(draft, draft_name),
    gamma_mode=(
      'auto'
      if 'gamma_choice' in state
      else 'sweep'
      if len(gammas) > 1
      else 'fixed'
    ),
    gamma_choice=state.get('gamma_choice'),
  )
  _write_json(os.path.join(output_dir, RESULTS_FILE), results)
  summary = report.summary_markdown(results)
  with open(os.path.join(output_dir, SUMMARY_FILE), 'w', encoding='utf-8') as f:
    f.write(summary)
  report.write_plots(results, output_dir)
  if print_summary:
    print(summary)
  return results


def _run_batches(
  decode,
  exs,
  token_lists,
  batches,
  records,
  gammas,
  vocab,
  batch_size,
  max_input_len,
  seed,
  path,
  progress,
  on_batch_done,
):
  """Decodes the batches after `records` and appends their records."""
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top

  done = len(records)
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
    for indices in batches[done // batch_size :]:
      enc, seeds = _batch_arrays(
        token_lists, indices, batch_size, max_input_len, seed
      )
      plain, plain_s = decode(enc, seeds)
      specs = {g: decode(enc, seeds, g) for g in gammas}
      new = []
      for r, i in enumerate(indices):
        tokens = plain.tokens[r, : plain.lengths[r]].tolist()
        rec = {
          'index': i,
          'input': exs[i]['inputs'],
          'reference': exs[i]['targets'],
          'input_tokens': len(token_lists[i]),
          'plain': vocab.decode(tokens),
          'plain_tokens': tokens,
          'plain_seconds': plain_s / len(indices),
          'speculative': {},
        }
        for g, (out, secs) in specs.items():
          st = out.tokens[r, : out.lengths[r]].tolist()
          row = _row_spec_record(out.stats, r, st, g)
          rec['speculative'][str(g)] = dict(
            text=vocab.decode(st),
            tokens=st,
            exact=st == tokens,
            seconds=secs / len(indices),
            **row,
          )
          if g == gammas[0]:
            totals['beta'] += row['beta_sum']
            totals['tested'] += row['tested']
            totals['tokens'] += len(st)
        new.append(rec)
      totals['seconds'] += specs[gammas[0]][1]
      _append_records(path, new)
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
  decode,
  target,
  draft,
  task_obj,
  split,
  vocab,
  token_lists,
  batches,
  batch_size,
  max_input_len,
  seed,
  calibration_batches,
  calibration_gamma,
  max_gamma,
  repeats,
):
  """Auto-γ: α from a few speculative batches, c and v(k), then γ.

  The calibration examples follow the evaluated ones in the split when the
  split has them (else the first evaluated batches are reused); they only
  choose γ and are not part of the results.
  """
  n_eval = len(token_lists)
  wanted = calibration_batches * batch_size
  extra = list(tasks_lib.examples(task_obj, split, limit=n_eval + wanted))
  if len(extra) > n_eval:
    token_lists = token_lists + [
      vocab.encode(ex['inputs'])[: max_input_len - 1] + [sd.EOS_ID]
      for ex in extra[n_eval:]
    ]
    batches = [
      list(range(s, min(s + batch_size, len(extra))))
      for s in range(n_eval, len(extra), batch_size)
    ]
  beta_sum, tested = 0.0, 0
  cal = batches[:calibration_batches]
  for indices in cal:
    enc, seeds = _batch_arrays(
      token_lists, indices, batch_size, max_input_len, seed
    )
    out, _ = decode(enc, seeds, calibration_gamma, timed=False)
    for r in range(len(indices)):
      st = out.tokens[r, : out.lengths[r]].tolist()
      row = _row_spec_record(out.stats, r, st, calibration_gamma)
      beta_sum += row['beta_sum']
      tested += row['tested']
  alpha = min(max(beta_sum / max(tested, 1), 0.0), 1.0)
  costs = measure_costs(
    target,
    draft,
    range(1, max_gamma + 2),
    batch_size,
    repeats,
    decode.kwargs_sampling(),
    calibration_gamma,
  )
  choice = theory.choose_gamma(
    alpha, costs['c'], costs['v_of_k'], max_gamma=max_gamma
  )
  return {
    'gamma': int(choice.gamma),
    'alpha': alpha,
    'calibration': {
      'examples': sum(len(b) for b in cal),
      'gamma': int(calibration_gamma),
      'c': costs['c'],
      'v_of_k': {str(k): v for k, v in costs['v_of_k'].items()},
      'predicted_improvement': float(choice.improvement),
    },
  }

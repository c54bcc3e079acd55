"""The Markdown tables `spec-decode bench` prints, from its JSON results.

`to_markdown`: sections 1-6 (`speed.run`); `kernel_markdown`: section 7
(`kernel_sections.kernel_sections`); `profile_markdown`: section 8
(`speed.profile_section`).
"""

from typing import Any

from spec_decode.bench import profile


def kernel_markdown(r: dict[str, Any]) -> str:
  """Sections 1-3 side by side for the kernel settings in `r`."""
  runs = {
    n: s for n, s in r.items() if n in ('on', 'off') and 'skipped' not in s
  }
  lines = [
    '## Small-K CPU kernel on vs off',
    '',
    f'kernel: {r["info"]}; copy bandwidth '
    f'{r["copy_bandwidth_gb_s"]:.1f} GB/s; decoder weights '
    f'{r["decoder_weight_bytes_per_step"] / 1e9:.3f} GB/step',
    '',
  ]
  if not runs:
    return '\n'.join(lines + ['(no setting measured)'])
  ks = list(next(iter(runs.values()))['v'])
  lines += [
    '| kernel | step ms | weights GB/s | copy fraction | c | '
    + ' | '.join(f'v({k})' for k in ks)
    + ' |',
    '|---|---|---|---|---|' + '---|' * len(ks),
  ]
  for n, s in runs.items():
    lines.append(
      f'| {n} | {s["plain_step_seconds"] * 1e3:.1f} | '
      f'{s["plain_weight_read_gb_s"]:.1f} | '
      f'{s["copy_bandwidth_fraction"]:.0%} | {s["c"]:.3f} | '
      + ' | '.join(f'{x:.2f}' for x in s['v'].values())
      + ' |'
    )
  lines += [
    '',
    '| kernel | alpha | gamma | alpha measured | measured | '
    'measured (loop) | predicted E/(γc+v) |',
    '|---|---|---|---|---|---|---|',
  ]
  for n, s in runs.items():
    for a, x in s['speedup'].items():
      lines.append(
        f'| {n} | {a} | {x["gamma"]} | '
        f'{x["alpha_measured"]:.3f} | {x["measured"]:.2f}x | '
        f'{x.get("measured_loop", 0):.2f}x | {x["predicted"]:.2f}x |'
      )
  return '\n'.join(lines)


def profile_markdown(p: dict[str, Any]) -> str:
  """Section 8 as Markdown: per-iteration split, kinds, costliest thunks."""
  gammas = [k for k in p if k != 'alpha']
  lines = [
    f'## Where an iteration goes (profile, alpha {p["alpha"]}, batch 1)',
    '',
    'Decodes traced with the JAX profiler (the median one shown); each XLA '
    'thunk mapped to its HLO instruction (`spec_decode.bench.profile`). ms '
    'per iteration; '
    '"alone": the same calls timed in a compiled loop of their own; setup: '
    'encoders and cache allocation, once per decode.',
    '',
    '| γ | iterations | iteration ms | loop ms | target (alone) | '
    'draft model (alone) | draft other | verify/commit | idle | setup ms | '
    'thunks | copied KB |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for g in gammas:
    x = p[g]
    s = x['split_ms']
    copied = sum(x['hlo']['copy_bytes_per_iteration'].values()) / 1e3
    lines.append(
      f'| {g} | {x["iterations"]} | {x["ms_per_iteration"]:.1f} | '
      f'{x["loop_ms_per_iteration"]:.1f} | '
      f'{s["target"]:.1f} ({x["target_alone_ms"]:.1f}) | '
      f'{s["draft model"]:.1f} ({x["draft_model_alone_ms"]:.1f}) | '
      f'{s["draft other"]:.2f} | {s["loop"]:.2f} | {s["idle"]:.2f} | '
      f'{x["setup_ms"]:.0f} | {x["hlo"]["thunks_per_iteration"]} | '
      f'{copied:.0f} |'
    )
  lines += [
    '',
    '| γ | scope | ' + ' | '.join(profile.KINDS) + ' |',
    '|---|---|' + '---|' * len(profile.KINDS),
  ]
  for g in gammas:
    for scope in profile.SCOPES:
      kinds = p[g]['kinds_ms'].get(scope)
      if not kinds:
        continue
      lines.append(
        f'| {g} | {scope} | '
        + ' | '.join(f'{kinds.get(k, 0.0):.2f}' for k in profile.KINDS)
        + ' |'
      )
  g = gammas[-1]
  lines += [
    '',
    f'Costliest thunks at γ = {g} (ms per iteration):',
    '',
    '| ms | scope | kind | shape | op |',
    '|---|---|---|---|---|',
  ]
  for t in p[g]['top'][:8]:
    lines.append(
      f'| {t["ms"]:.2f} | {t["scope"]} | {t["kind"]} | {t["shape"]} | '
      f'`{t["op_name"][-60:]}` |'
    )
  return '\n'.join(lines)


def _no_eos_line(r: dict[str, Any]) -> str:
  """What the controlled rows decode: outputs without EOS, counted."""
  if 'plain_no_eos' not in r:
    return 'Outputs without EOS: not counted by this run.'
  rows = [(r['plain_no_eos'], r['plain_rows'])] + [
    (b['no_eos'], int(k))
    for k, b in r.get('batch', {}).items()
    if 'no_eos' in b
  ]
  n, total = sum(x for x, _ in rows), sum(t for _, t in rows)
  return (
    f'Outputs without EOS (ran to max_decode_len): {n} of {total} rows '
    '(this section and "Batch size"). The random-weight target rarely emits '
    'EOS, so these decodes run their full length by design; acceptance is '
    "set by the controlled draft, not by the text's repetitions (the eval "
    'reports such outputs apart).'
  )


def to_markdown(r: dict[str, Any]) -> str:
  lines = [
    '## Plain decoding efficiency',
    '',
    '| copy GB/s | weight GB/step | step ms | weights GB/s | fraction |',
    '|---|---|---|---|---|',
    f'| {r["copy_bandwidth_gb_s"]:.1f} | '
    f'{r["decoder_weight_bytes_per_step"] / 1e9:.3f} | '
    f'{r["plain_step_seconds"] * 1e3:.1f} | '
    f'{r["plain_weight_read_gb_s"]:.1f} | '
    f'{r["copy_bandwidth_fraction"]:.0%} |',
    '',
    '## v(k) = target time(k tokens) / time(1 token)',
    '',
    '| k | ' + ' | '.join(r['v']) + ' |',
    '|---|' + '---|' * len(r['v']),
    '| v | ' + ' | '.join(f'{x:.2f}' for x in r['v'].values()) + ' |',
    '',
    f'c (draft step / target step) = {r["c"]:.3f}',
    '',
    '## Speculative vs plain (controlled acceptance, batch 1)',
    '',
    _no_eos_line(r),
    '',
    '| alpha | gamma | alpha measured | tokens/call | measured | '
    'predicted E/(γc+v) | ratio | measured (loop) | ratio (loop) | '
    'Thm 3.8 (v=1) | setup ms | iteration ms | model calls ms | other ms | '
    'model calls in context ms | predicted in context | ratio (loop, in '
    'context) |',
    '|' + '---|' * 17,
  ]
  for a, s in r['speedup'].items():
    lines.append(
      f'| {a} | {s["gamma"]} | {s["alpha_measured"]:.3f} | '
      f'{s["tokens_per_call"]:.2f} | {s["measured"]:.2f}x | '
      f'{s["predicted"]:.2f}x | {s["ratio"]:.2f} | '
      f'{s.get("measured_loop", 0):.2f}x | {s.get("ratio_loop", 0):.2f} | '
      f'{s["predicted_v1"]:.2f}x | {s.get("setup_spec_ms", 0):.0f} | '
      f'{s.get("iteration_ms", 0):.1f} | '
      f'{s.get("model_calls_ms", 0):.1f} | {s.get("overhead_ms", 0):.1f} | '
      f'{s.get("model_calls_in_context_ms", 0):.1f} | '
      f'{s.get("predicted_in_context", 0):.2f}x | '
      f'{s.get("ratio_loop_in_context", 0):.2f} |'
    )
  lines += [
    '',
    '"measured (loop)": the decode loops alone, the setup before them '
    '(encoders, caches; "setup ms" for the speculative run) subtracted; '
    'iteration ms excludes it too. "model calls ms": γ draft steps and one '
    'target call over γ+1 tokens, each timed alone; "in context": the same '
    'calls back to back in one compiled loop, as decoding runs them (each '
    "model's weights evicted from the CPU cache by the other's); "
    '"predicted in context" = E[tokens] x target step / that time.',
  ]
  lines += [
    '',
    '## Batch size (alpha = 0.8)',
    '',
    '| batch | plain tok/s | speculative tok/s | speedup |',
    '|---|---|---|---|',
  ]
  for b, s in r['batch'].items():
    lines.append(
      f'| {b} | {s["plain_tokens_per_s"]:.1f} | '
      f'{s["speculative_tokens_per_s"]:.1f} | '
      f'{s["speedup"]:.2f}x |'
    )
  if r.get('batch_policy'):
    lines += ['', policy_markdown(r['batch_policy'])]
  pairs = r.get('hf_pairs', {})
  skipped = [p['skipped'] for p in pairs.values() if 'skipped' in p]
  if skipped:
    lines += ['', f'Peer run skipped: {skipped[0]}']
  elif pairs:
    lines += [
      '',
      '## Peer: Hugging Face transformers (PyTorch CPU), batch 1',
      '',
      '| pair | target/draft decoder layers | c | alpha | gamma | | '
      'plain tok/s | speculative tok/s | speedup | ours / transformers '
      'speculative tok/s | same greedy tokens |',
      '|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    for name, hf in pairs.items():
      head = (
        f'| {name} | {hf["target_decoder_layers"]}/{hf["draft_layers"]} | '
        f'{hf["c"]:.3f} | {hf["alpha"]:.2f} | {hf["gamma"]} |'
      )
      lines += [
        f'{head} ours | {hf["ours_plain_tokens_per_s"]:.1f} | '
        f'{hf["ours_tokens_per_s"]:.1f} | {hf["ours_speedup"]:.2f}x | '
        f'{hf["ratio"]:.2f} | {hf["same_tokens_as_hf"]} |',
        f'{head} transformers | {hf["hf_plain_tokens_per_s"]:.1f} | '
        f'{hf["hf_tokens_per_s"]:.1f} | {hf["hf_speedup"]:.2f}x | | '
        f'assisted = greedy: {hf["hf_assisted_equals_hf_greedy"]} |',
      ]
  lines += [
    '',
    f'First plain call (compile + run): '
    f'{r["compile_seconds_plain"]:.1f}s; recompilations after '
    f'warm-up: {r["recompilations"]}',
  ]
  return '\n'.join(lines)


def policy_markdown(rows: list[dict[str, Any]]) -> str:
  """Section 4b: gamma='auto' against plain and each fixed gamma."""
  gammas = list(rows[0]['fixed_tok_s']) if rows else []
  lines = [
    "## gamma='auto' by batch size (controlled alpha, greedy)",
    '',
    '| batch | alpha | plain tok/s | '
    + ' | '.join(f'γ={g}' for g in gammas)
    + ' | auto tok/s | auto/plain | auto/best fixed (γ) | auto iterations '
    'per γ | carried/plain | carried/best fixed |',
    '|' + '---|' * (len(gammas) + 9),
  ]
  for row in rows:
    used = ', '.join(
      f'{g}:{n}' for g, n in row['auto_gamma_iterations'].items() if n
    )
    lines.append(
      f'| {row["batch"]} | {row["alpha"]} | {row["plain_tok_s"]:.1f} | '
      + ' | '.join(f'{row["fixed_tok_s"][g]:.1f}' for g in gammas)
      + f' | {row["auto_tok_s"]:.1f} | {row["auto_vs_plain"]:.2f} | '
      f'{row["auto_vs_best_fixed"]:.2f} ({row["best_fixed_gamma"]}) | '
      f'{used} | {_carried(row, "plain")} | {_carried(row, "best_fixed")} |'
    )
  return '\n'.join(lines)


def _carried(row: dict[str, Any], versus: str) -> str:
  """A carried-estimate ratio of a `policy_markdown` row ('-' in rows
  written before it was measured)."""
  value = row.get(f'auto_carried_vs_{versus}')
  return '-' if value is None else f'{value:.2f}'

"""`accel.md`: the Markdown tables of an `accel.json` document."""

from typing import Any


def _f(x: Any, digits: int = 2) -> str:
  if x is None:
    return '-'
  if isinstance(x, float):
    return f'{x:.{digits}f}'
  return str(x)


def _gb(x: Any) -> str:
  return '-' if x is None else f'{x / 1e9:.0f}'


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
  out = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  out += ['| ' + ' | '.join(_f(c) for c in r) + ' |' for r in rows]
  return out + ['']


def _identity(name: str, s: dict[str, Any]) -> list[str]:
  return [f'### Greedy identity, {name}', ''] + _table(
    ['dtype', 'matmul precision', 'f32 attn logits', 'gamma', 'rows',
     'identical', 'share'],
    [[s.get('dtype'), s.get('matmul_precision'),
      s.get('float32_attention_logits'), s.get('gamma'), s.get('rows'),
      s.get('identical_rows'), s.get('share_identical')]],
  )  # fmt: skip


def _sizes(sizes: dict[str, Any]) -> list[str]:
  lines = ['### Targets with their drafts (batch 1, greedy)', '']
  rows = []
  for name, s in sizes.items():
    v = s.get('v', {})
    one = s.get('step', {}).get('1', {})
    rows.append([
      s.get('target', name), s.get('draft', 'T5 v1.1 small'),
      s.get('target_step_ms'), one.get('bound_ms'), one.get('bound_share'),
      s.get('c'), v.get('2'), v.get('4'), v.get('8'), v.get('16'),
    ])  # fmt: skip
  lines += _table(
    ['target', 'draft', 'step ms', 'bound ms', 'bound/step', 'c', 'v(2)',
     'v(4)', 'v(8)', 'v(16)'], rows,
  )  # fmt: skip
  for name, s in sizes.items():
    t2 = s.get('paper_table2')
    if t2:
      lines += [
        f"{name}: the paper's Table 2 setting (alpha {t2['alpha']}, gamma "
        f'{t2["gamma"]}): measured {t2["measured"]:.2f}x, Theorem 3.8 from '
        f"this device's c and v({t2['gamma'] + 1}) at the measured alpha "
        f'{t2["alpha_measured"]:.2f}: {t2["predicted"]:.2f}x (TPU-v4, c '
        f'{t2["paper_c"]}: expected {t2["paper_expected"]}x, measured '
        f'{t2["paper_measured"]}x).',
        '',
      ]
  rows = []
  for name, s in sizes.items():
    for alpha, r in s.get('speedup', {}).items():
      rows.append([
        name, alpha, r['gamma'], r['alpha_measured'], r['measured'],
        r['predicted'], r['tokens_per_call'], r['same_as_plain'],
      ])  # fmt: skip
  if rows:
    lines += ['Controlled acceptance: measured speedup against Theorem 3.8 '
              'with the measured c and v(gamma + 1).', '']  # fmt: skip
    lines += _table(
      ['target', 'alpha', 'gamma', 'alpha meas.', 'measured', 'predicted',
       'tokens/call', 'same as plain'], rows,
    )  # fmt: skip
  return lines


def _batching(rows: list[dict[str, Any]]) -> list[str]:
  return ['### XXL/small by batch: plain, gamma=auto, best fixed', ''] + _table(
    ['batch', 'alpha', 'plain tok/s', 'auto tok/s', 'best fixed tok/s',
     'best gamma', 'auto/plain', 'auto/best'],
    [[r['batch'], r['alpha'], r['plain_tok_s'], r['auto_tok_s'],
      r['best_fixed_tok_s'], r['best_fixed_gamma'], r['auto_vs_plain'],
      r['auto_vs_best_fixed']] for r in rows],
  )  # fmt: skip


def _trees(t: dict[str, Any]) -> list[str]:
  lines = ['### XXL: scoring a tree of n nodes against a chain', '']
  lines += _table(
    ['n', 'v_tree(n)', 'v_chain(n + 1)'],
    [[n, v, t['v_chain'].get(str(int(n) + 1))] for n, v in t['v_tree'].items()],
  )
  if t.get('controlled'):
    lines += _table(
      ['config', 'verified', 'tokens/call', 'tokens/s', 'same as plain'],
      [[r['config'], r['verified'], r['tokens_per_call'],
        r['tokens_per_second'], r['same_as_plain']]
       for r in t['controlled']],
    )  # fmt: skip
  return lines


def _beam(rows: list[dict[str, Any]]) -> list[str]:
  return ['### XXL/small beam search, speculative against plain', ''] + _table(
    ['source', 'beams', 'gamma', 'speedup', 'steps/call', 'expected',
     'exact rows'],
    [[r['source'], r['num_beams'], r['gamma'], r['speedup'],
      r['steps_per_call'], r.get('expected_steps_per_call'),
      r['exact_rows']] for r in rows],
  )  # fmt: skip


def markdown(doc: dict[str, Any]) -> str:
  meta = doc['meta']
  lines = [
    '## spec-decode bench accel',
    '',
    f'Device: {meta.get("device")}; jax {meta.get("jax")}; '
    f'{"tiny (CPU rehearsal)" if meta.get("tiny") else "real sizes"}; '
    f'{meta.get("elapsed_seconds")} s of a {meta.get("budget")} s budget.',
    '',
  ]
  s = doc['sections']
  for key in (
    'identity_bfloat16',
    'identity_bfloat16_f32_attention',
    'identity_float32',
  ):
    if key in s:
      lines += _identity(key.split('_', 1)[1], s[key])
  if 'sizes' in s:
    lines += _sizes(s['sizes'])
  if s.get('batching'):
    lines += _batching(s['batching'])
  if s.get('trees'):
    lines += _trees(s['trees'])
  if s.get('beam'):
    lines += _beam(s['beam'])
  smoke = s.get('smoke')
  if smoke:
    measured = _gb(smoke.get('bandwidth_measured'))
    nominal = _gb(smoke.get('bandwidth_nominal'))
    lines[3:3] = [
      f'Smoke: {smoke.get("versions")}; bandwidth {measured} GB/s measured '
      f'(a copy), {nominal} GB/s nominal.',
      '',
    ]
  if doc['skipped']:
    lines += ['Skipped:', '']
    lines += [
      f'- {x["section"]}/{x["item"]}: {x["why"]}' for x in doc['skipped']
    ]
    lines += ['']
  for e in doc['errors']:
    lines += [f'Error in {e["section"]}: {e["error"]}', '']
  if doc.get('running'):
    r = doc['running']
    lines += [f'Stopped while running {r["section"]}/{r["item"]} (started at '
              f'{r["at"]} s, predicted {r["predicted"]} s).', '']  # fmt: skip
  elif not doc.get('finished'):
    lines += ['Not finished.', '']
  return '\n'.join(lines) + '\n'

"""Where a speculative iteration's time goes: a trace of the compiled loop.

`profile_iteration` runs the jitted speculative loop under the JAX profiler
(a few decodes; the one with the median loop time is reported). XLA:CPU
records one trace event per executed thunk (a fusion, a dot, a kernel
call), named after its HLO instruction, so every event maps back to the
optimized HLO, where the instruction's name stack says which part of the
loop issued it. The target and the draft are wrapped in
`jax.named_scope`s (`_Scoped`, through the protocols only), so the time per
iteration splits by scope:

  target       the target's score call over G+1 tokens;
  draft model  the draft's score calls (G per iteration for a model draft);
  draft other  the rest of the drafter's proposal (sampling, argmax);
  loop         the rest of the while body: verification, commit, counters;
  idle         loop walltime not covered by any thunk (executor overhead,
               thread hand-offs, a core taken by another process);
  setup        outside the loop, once per decode: encoders, cross-attention
               keys and values, cache allocation (not per iteration);

and by kind: `kernel` (the small-M FFI matmul), `dot` (XLA dots), `copy`
(copies and transposes), `cache write` (dynamic-update-slice / scatter),
`reduce` (reductions, argmax), `elementwise` (other fusions). From the HLO
alone it also counts the thunks per iteration and the bytes the while body
copies or transposes per iteration.

Profiler overhead is small (one trace event per thunk); the untraced
walltime is reported next to the traced one.
"""

import collections
import glob
import os
import re
import statistics
import tempfile
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.chain import loops
from spec_decode.core import inputs
from spec_decode.core import model_drafter
from spec_decode.core import sampling
from spec_decode.core.decode_settings import DecodeSettings

SCOPES = ('target', 'draft model', 'draft other', 'loop', 'idle')
KINDS = ('kernel', 'dot', 'copy', 'cache write', 'reduce', 'elementwise')
_CONTROL = ('while', 'call', 'conditional')
_DTYPE_BYTES = {
  'pred': 1,
  's8': 1,
  'u8': 1,
  'bf16': 2,
  'f16': 2,
  's16': 2,
  'u16': 2,
  'f32': 4,
  's32': 4,
  'u32': 4,
  'f64': 8,
  's64': 8,
  'u64': 8,
}
_INSTR = re.compile(r'^(ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$')
_COMP = re.compile(r'^(ENTRY )?%?([\w.\-]+) \(.*\{$')


@flax.struct.dataclass(kw_only=True)
class _Scoped:
  """A language model or drafter whose calls run in `jax.named_scope(name)`.

  Forwards the language-model protocol (`score`, `score_with_features`,
  `rollback`, `init_state`) or the drafter protocol (`propose`,
  `init_draft`), whichever `inner` implements.
  """

  inner: Any
  name: str = flax.struct.field(pytree_node=False)

  def __getattr__(self, attr):
    if attr in ('inner', 'name') or attr.startswith('__'):
      raise AttributeError(attr)
    value = getattr(self.inner, attr)
    if attr in ('score', 'score_with_features', 'propose'):

      def scoped(*args, **kwargs):
        with jax.named_scope(self.name):
          return value(*args, **kwargs)

      return scoped
    return value


def _scoped_drafter(draft) -> Any:
  """The drafter for `draft`, in scope 'draft'; a model's calls in 'dmodel'."""
  drafter = model_drafter.as_drafter(draft)
  if isinstance(drafter, model_drafter.ModelDrafter):
    drafter = drafter.replace(model=_Scoped(inner=drafter.model, name='dmodel'))
  return _Scoped(inner=drafter, name='draft')


# --------------------------------------------------------------------------
# Optimized HLO.


def _bytes(shape: str) -> int:
  total = 0
  for dtype, dims in re.findall(r'\b([a-z]+\d*)\[([\d,]*)\]', shape):
    if dtype in _DTYPE_BYTES:
      n = 1
      for d in filter(None, dims.split(',')):
        n *= int(d)
      total += n * _DTYPE_BYTES[dtype]
  return total


def _parse_hlo(text: str):
  """Computations `{name: [instruction dicts]}` and the entry's name."""
  comps, entry, cur = {}, None, None
  for line in text.splitlines():
    if not line.startswith(' '):
      m = _COMP.match(line)
      if m:
        cur = m.group(2)
        comps[cur] = []
        if m.group(1):
          entry = cur
        continue
      if line.startswith('}'):
        cur = None
      continue
    m = _INSTR.match(line.strip())
    if cur is not None and m:
      name = re.search(r'op_name="([^"]*)"', line)
      comps[cur].append(
        dict(
          name=m.group(2),
          shape=m.group(3),
          op=m.group(4),
          line=line,
          op_name=name.group(1) if name else '',
          calls=_called(line),
        )
      )
  return comps, entry


def _called(line: str) -> list[str]:
  """Computations an instruction line calls (fusion, loop, branch...)."""
  names = re.findall(r'\b(?:calls|body|condition|to_apply)=%?([\w.\-]+)', line)
  for group in re.findall(r'\b(?:calls|branch_computations)=\{([^}]*)\}', line):
    names.extend(c.strip().lstrip('%') for c in group.split(','))
  return names


def _kind(ins: dict, comps: dict) -> str:
  op = ins['op']
  if op == 'custom-call':
    return 'kernel' if 'smallm' in ins['line'] else 'dot'
  if op in _CONTROL:
    return 'control'
  if op in ('dot', 'convolution'):
    return 'dot'
  if op in ('dynamic-update-slice', 'scatter'):
    return 'cache write'
  if op in ('copy', 'transpose'):
    return 'copy'
  if op != 'fusion':
    return 'elementwise'
  if re.search(r'__(ynn|xnn|onednn)', ins['line']):
    return 'dot'
  inner = {i['op'] for c in ins['calls'] for i in comps.get(c, ())}
  if inner & {'dot', 'convolution'}:
    return 'dot'
  if inner & {'dynamic-update-slice', 'scatter'}:
    return 'cache write'
  if inner & {'reduce', 'reduce-window'}:
    return 'reduce'
  if inner & {'copy', 'transpose'}:
    return 'copy'
  return 'elementwise'


def _scope(op_name: str) -> str:
  if '/target/' in op_name:
    return 'target'
  if '/dmodel/' in op_name:
    return 'draft model'
  if '/draft/' in op_name:
    return 'draft other'
  return 'loop'


def _main_loop(comps: dict, entry: str) -> dict:
  """The outermost while loop that carries the most bytes.

  Searched in the entry computation and the computations it `call`s (XLA:CPU
  wraps small loops in a call).
  """
  loops, todo = [], [entry]
  while todo:
    for ins in comps[todo.pop()]:
      if ins['op'] == 'while':
        loops.append(ins)
      elif ins['op'] == 'call':
        todo.extend(c for c in ins['calls'] if c in comps)
  if not loops:
    raise ValueError('no while loop in the compiled program')
  return max(loops, key=lambda i: _bytes(i['shape']))


def _reachable(comps: dict, roots) -> set:
  seen, todo = set(), list(roots)
  while todo:
    c = todo.pop()
    if c in seen or c not in comps:
      continue
    seen.add(c)
    for ins in comps[c]:
      todo.extend(ins['calls'])
  return seen


def hlo_instructions(text: str) -> dict:
  """`{instruction: dict(scope, kind, bytes, in_loop, shape, op_name)}`.

  `in_loop`: issued by the main while loop's body (directly or from a
  computation it calls); `scope`: as in the module docstring, from the name
  stack; an instruction without one (XLA drops it on some fusions and
  copies) takes it from its fused instructions, else from its operands.
  """
  comps, entry = _parse_hlo(text)
  loop = _main_loop(comps, entry)
  in_loop = _reachable(comps, loop['calls'])
  fused = set()
  for instrs in comps.values():
    for ins in instrs:
      if ins['op'] == 'fusion':
        fused.update(ins['calls'])
  out = {}
  for comp, instrs in comps.items():
    if comp in fused:
      continue
    by_name = {i['name']: i for i in instrs}
    for ins in instrs:
      body = comp in in_loop
      op_name = _op_name(ins, comps, by_name)
      out[ins['name']] = dict(
        scope=_scope(op_name) if body else 'setup',
        kind=_kind(ins, comps),
        bytes=_bytes(ins['shape']),
        in_loop=body,
        shape=ins['shape'].split('{')[0],
        op_name=op_name,
        op=ins['op'],
      )
  out[loop['name']] = dict(
    scope='setup',
    kind='main loop',
    bytes=0,
    in_loop=False,
    shape='',
    op_name='',
    op='while',
  )
  return out


def _op_name(ins: dict, comps: dict, by_name: dict, depth: int = 4) -> str:
  """The instruction's name stack, else its fusion's, else an operand's."""
  if ins['op_name']:
    return ins['op_name']
  for c in ins['calls']:
    name = next((i['op_name'] for i in comps.get(c, ()) if i['op_name']), '')
    if name:
      return name
  if depth == 0:
    return ''
  args = ins['line'].split(f' {ins["op"]}(', 1)[-1]
  for operand in re.findall(r'%([\w.\-]+)', args):
    if operand in by_name and operand != ins['name']:
      name = _op_name(by_name[operand], comps, by_name, depth - 1)
      if name:
        return name
  return ''


def hlo_summary(instrs: dict) -> dict:
  """Thunks, copied bytes and cache writes per iteration, from the HLO.

  Counts each while-body instruction once (instructions of loops nested in
  the body, such as rolled PRNG rounds, once per nested call too).
  """
  body = [
    i
    for i in instrs.values()
    if i['in_loop'] and i['op'] not in ('parameter', 'constant')
  ]
  executed = [
    i
    for i in body
    if i['op'] not in ('get-tuple-element', 'tuple', 'bitcast')
    and i['kind'] != 'control'
  ]
  copies = collections.Counter()
  copy_count = collections.Counter()
  for i in body:
    if i['kind'] == 'copy':
      copies[i['scope']] += i['bytes']
      copy_count[i['scope']] += 1
  writes = [i for i in body if i['kind'] == 'cache write']
  return dict(
    thunks_per_iteration=len(executed),
    nested_loops=sum(1 for i in body if i['op'] == 'while'),
    copy_bytes_per_iteration=dict(copies),
    copies_per_iteration=dict(copy_count),
    cache_writes_per_iteration=len(writes),
    cache_write_bytes_per_iteration=sum(i['bytes'] for i in writes),
  )


# --------------------------------------------------------------------------
# Trace.


def _trace_events(fn, runs: int = 1) -> list[tuple[str, int, int]]:
  """`(name, start_ns, duration_ns)` of XLA thunk events of `runs` calls."""
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp):
      for _ in range(runs):
        jax.block_until_ready(fn())
    path = glob.glob(os.path.join(tmp, '**', '*.xplane.pb'), recursive=True)
    data = jax.profiler.ProfileData.from_file(path[0])
    events = []
    for plane in data.planes:
      for line in plane.lines:
        if not line.name.startswith('tf_XLA'):
          continue
        events.extend((e.name, e.start_ns, e.duration_ns) for e in line.events)
  return events


def _union_ns(intervals) -> int:
  total, end = 0, None
  for s, e in sorted(intervals):
    if end is None or s > end:
      total += e - s
      end = e
    elif e > end:
      total += e - end
      end = e
  return total


def _split_run(events, instrs: dict, iterations: int) -> dict:
  """One traced decode's milliseconds per iteration by scope and kind."""
  by_scope = collections.Counter()
  by_kind = collections.defaultdict(collections.Counter)
  by_instr = collections.Counter()
  setup_ns, leaf = 0, []
  for name, start, dur in events:
    info = instrs[name]
    if not info['in_loop']:
      setup_ns += dur
      continue
    by_scope[info['scope']] += dur
    by_kind[info['scope']][info['kind']] += dur
    by_instr[name] += dur
    leaf.append((start, start + dur))
  # The loop thunk itself only dispatches (its body runs asynchronously):
  # the loop lasts from the first to the last thunk of its body.
  loop_ns = max(e for _, e in leaf) - min(s for s, _ in leaf) if leaf else 0
  per = lambda ns: ns / iterations / 1e6  # noqa: E731
  split = {s: per(by_scope[s]) for s in SCOPES if s != 'idle'}
  split['idle'] = per(max(loop_ns - _union_ns(leaf), 0))
  top = []
  for name, ns in by_instr.most_common(12):
    info = instrs[name]
    top.append(
      dict(
        instruction=name,
        ms=per(ns),
        scope=info['scope'],
        kind=info['kind'],
        shape=info['shape'],
        op_name=re.sub(r'^.*?/while/body/', '', info['op_name'])[-80:],
      )
    )
  return dict(
    loop_ms_per_iteration=per(loop_ns),
    split_ms=split,
    kinds_ms={
      s: {k: per(v) for k, v in by_kind[s].most_common()} for s in by_kind
    },
    setup_ms=setup_ns / 1e6,
    top=top,
  )


def split_events(events, instrs: dict, iterations: int) -> dict:
  """Per-iteration split of the median of the traced decodes in `events`.

  Events are assigned to decodes by the main loop's dispatch events: a
  decode's setup runs before its loop, its loop body after. Returns the
  split (`_split_run`) of the decode with the median loop time, plus
  `loop_ms_all`, the loop time per iteration of every traced decode.
  """
  loop_name = next(n for n, i in instrs.items() if i['kind'] == 'main loop')
  starts = sorted(s for n, s, _ in events if n == loop_name)
  runs = [[] for _ in starts]
  for name, start, dur in events:
    info = instrs.get(name)
    if info is None or info['kind'] in ('control', 'main loop'):
      continue
    # Body thunks belong to the last loop started before them, setup thunks
    # to the first loop started after them.
    k = sum(1 for s in starts if s <= start)
    k = k - 1 if info['in_loop'] else k
    if 0 <= k < len(runs):
      runs[k].append((name, start, dur))
  splits = [_split_run(r, instrs, iterations) for r in runs if r]
  splits.sort(key=lambda x: x['loop_ms_per_iteration'])
  median = dict(splits[len(splits) // 2])
  median['loop_ms_all'] = [x['loop_ms_per_iteration'] for x in splits]
  return median


def profile_iteration(
  target,
  draft,
  encoder_tokens,
  gamma: int,
  max_decode_len: int,
  repeats: int = 3,
  seed: int = 0,
) -> dict[str, Any]:
  """Profiles greedy speculative decoding of `encoder_tokens`.

  Args:
    target: the target language model.
    draft: a draft language model or drafter.
    encoder_tokens: `[B, S]` int32.
    gamma: draft tokens per iteration.
    max_decode_len: output tokens per row at most.
    repeats: decodes timed without the profiler (median reported), and
      decodes traced (the one with the median loop time reported).
    seed: row seed.

  Returns:
    A dict: `iterations`; `ms_per_iteration` (untraced walltime / target
    calls, setup included, as `make bench` divides); from the traced
    decode: `loop_ms_per_iteration` (the while loop's walltime /
    iterations), `split_ms` and `kinds_ms` (per iteration, see the module
    docstring), `setup_ms` (busy time outside the loop, once per decode),
    `top` (the costliest thunks), `loop_ms_all` (every traced decode); and
    `hlo` (`hlo_summary`).
  """
  enc = jnp.asarray(encoder_tokens, jnp.int32)
  settings = DecodeSettings(
    max_decode_len=int(max_decode_len),
    sampler=sampling.Sampler(),
    gamma=int(gamma),
  )
  keys = inputs.row_keys(seed, enc.shape[0])
  tgt = _Scoped(inner=target, name='target')
  drafter = _scoped_drafter(draft)
  run = lambda: loops.speculative_decode_jit(  # noqa: E731
    tgt, drafter, enc, keys, settings=settings
  )
  counters = jax.block_until_ready(run())[2]
  iterations = max(int(counters.iterations.max()), 1)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(run())
    times.append(time.perf_counter() - t0)
  text = (
    loops.speculative_decode_jit.lower(
      tgt, drafter, enc, keys, settings=settings
    )
    .compile()
    .as_text()
  )
  instrs = hlo_instructions(text)
  split = split_events(_trace_events(run, repeats), instrs, iterations)
  return dict(
    gamma=int(gamma),
    iterations=iterations,
    ms_per_iteration=statistics.median(times) / iterations * 1e3,
    **split,
    hlo=hlo_summary(instrs),
  )

"""examples.html: every example of an eval run, coloured as the paper's Fig. 1.

Leviathan et al. (2023), Figure 1: each line is one iteration; green tokens
are draft suggestions the target accepted, red struck-through ones the
suggestions it rejected, blue ones the target's own tokens. The page draws
every example's output that way from the provenance its record keeps
(`core.provenance` codes, `decoding.row_provenance`): accepted draft tokens
green, each rejected draft token struck through in red before the target's
replacement (blue), the bonus token after a fully accepted block violet,
a plain target step (γ 0) grey, and a bar between iterations. Each example
gives its α, tokens per target call and iterations; the page starts with
the run's figures, a legend and the run's plots. For a γ sweep it shows the
first γ's decodes.

Beam-search runs show their own provenance instead: per example, the beam
steps each target call committed (steps per call) and the calls' covered
draft depths; the best beam's text is not coloured (a call commits steps
of several beams).

Token texts come from the run's `decode` (ids -> text): token k's text is
what it adds to the decoded prefix, so sentencepiece's word boundaries show
as spaces.
"""

import html
import os
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from spec_decode.core import provenance as prov
from spec_decode.eval.report import plots

PAGE_FILE = 'examples.html'
# The paper's colours (as light backgrounds, so the text stays readable).
COLORS = {
  'accepted': '#c8f7c5',
  'rejected': '#f7c5c5',
  'replaced': '#c5d8f7',
  'bonus': '#dcc8f5',
  'target': '#e4e4e4',
}
_CLASS = {
  prov.ACCEPTED: 'acc',
  prov.REPLACED: 'rep',
  prov.BONUS: 'bon',
  prov.TARGET: 'tgt',
}
STYLE = f"""
body {{ font-family: sans-serif; margin: 1.2em; max-width: 72em;
  color: #222; }}
h1 {{ font-size: 1.3em; }}
.ex {{ border-top: 1px solid #ccc; padding: 0.5em 0; }}
.meta {{ color: #555; font-size: 0.85em; }}
.src, .ref {{ font-size: 0.9em; color: #444; }}
.out {{ font-family: monospace; font-size: 0.95em; line-height: 1.9;
  white-space: pre-wrap; }}
.out span {{ padding: 0.15em 0; }}
.it {{ border-left: 2px solid #777; margin-left: 1px; padding-left: 1px; }}
.acc {{ background: {COLORS['accepted']}; }}
.rej {{ background: {COLORS['rejected']}; color: #b00000;
  text-decoration: line-through; }}
.rep {{ background: {COLORS['replaced']}; }}
.bon {{ background: {COLORS['bonus']}; }}
.tgt {{ background: {COLORS['target']}; }}
.legend {{ line-height: 2; }}
.legend span {{ padding: 0.1em 0.4em; margin-right: 0.6em;
  white-space: nowrap; }}
img {{ height: 150px; margin-right: 0.5em; }}
.out-mark {{ background: #ffd27f; color: #5a3a00; font-weight: bold;
  padding: 0 0.3em; }}
"""


def token_texts(
  decode: Callable[[list[int]], str], tokens: Sequence[int]
) -> list[str]:
  """What each token adds to the decoded text (EOS: `</s>`)."""
  texts, prev = [], ''
  for k in range(len(tokens)):
    now = decode(list(tokens[: k + 1]))
    if now.startswith(prev) and now != prev:
      texts.append(now[len(prev) :])
    else:  # EOS, or a piece that rewrites the prefix.
      texts.append(decode([tokens[k]]) or '</s>')
    prev = now
  return texts


def _rejected_text(decode, tokens, k: int, token: int) -> str:
  prefix = decode(list(tokens[:k]))
  now = decode(list(tokens[:k]) + [token])
  if now.startswith(prefix) and now != prefix:
    return now[len(prefix) :]
  return decode([token]) or '</s>'


def _span(cls: str, text: str) -> str:
  return f'<span class="{cls}">{html.escape(text)}</span>'


def coloured(
  decode: Callable[[list[int]], str],
  tokens: Sequence[int],
  codes: Sequence[int],
  rejected: dict[int, int],
) -> str:
  """One output as HTML: a `span.it` per iteration, a span per token."""
  texts = token_texts(decode, tokens)
  parts = []
  for k, (text, code) in enumerate(zip(texts, codes, strict=False)):
    if code & prov.START and parts:
      parts.append('</span>')
    if code & prov.START or not parts:
      parts.append('<span class="it">')
    if k in rejected:
      parts.append(_span('rej', _rejected_text(decode, tokens, k, rejected[k])))
    parts.append(_span(_CLASS.get(code & prov.KIND_MASK, 'tgt'), text))
  if parts:
    parts.append('</span>')
  return ''.join(parts)


def legend() -> str:
  items = [
    _span('acc', 'accepted draft token'),
    _span('rej', 'rejected draft token'),
    _span('rep', "target's token after a rejection"),
    _span('bon', 'bonus token (whole block accepted)'),
    _span('tgt', 'plain target step (γ 0)'),
    '<span class="it">&nbsp;</span>a bar starts each iteration (one target '
    'call)',
  ]
  return '<p class="legend">' + ' '.join(items) + '</p>'


def _chain_example(rec, spec, decode) -> str:
  tokens = spec['tokens']
  if 'provenance' in spec:
    out = coloured(
      decode, tokens, spec['provenance'], dict(spec.get('rejected', []))
    )
  else:  # A record of a run from before provenance was kept.
    out = html.escape(spec['text'])
  calls = max(spec['iterations'], 1)
  meta = (
    _ran_out_mark(rec, spec) + f'#{rec["index"]} · α {spec["alpha"]:.2f} · '
    f'{len(tokens) / calls:.2f} tokens per target call · '
    f'{spec["iterations"]} iterations · '
    + ('exact' if spec['exact'] else 'differs from plain decoding')
  )
  plain = ''
  if not spec['exact']:
    plain = f'<div class="ref">plain: {html.escape(rec["plain"])}</div>'
  return (
    f'<div class="ex"><div class="meta">{meta}</div>'
    f'<div class="src">{html.escape(rec["input"])}</div>'
    f'<div class="out">{out}</div>{plain}'
    f'<div class="ref">reference: {html.escape(rec["reference"])}</div>'
    '</div>'
  )


def _beam_example(rec, spec) -> str:
  calls = max(spec['iterations'], 1)
  meta = (
    _ran_out_mark(rec, spec)
    + f'#{rec["index"]} · {spec["steps"]} beam steps in '
    f'{spec["iterations"]} target calls ({spec["steps"] / calls:.2f} steps '
    f'per call; plain beam search: {rec.get("plain_steps", "-")} steps) · '
    f'calls covering 0.. draft depths: {spec["accepted_histogram"]} · '
    + ('exact' if spec['exact'] else 'differs from plain beam search')
  )
  return (
    f'<div class="ex"><div class="meta">{meta}</div>'
    f'<div class="src">{html.escape(rec["input"])}</div>'
    f'<div class="out">{html.escape(spec["text"])}</div>'
    f'<div class="ref">reference: {html.escape(rec["reference"])}</div>'
    '</div>'
  )


def _ran_out_mark(rec, spec) -> str:
  """The marker of an example whose output ran out (no EOS): plain,
  speculative or both."""
  plain = rec.get('plain_ran_out', False)
  speculative = spec.get('ran_out', False)
  if not (plain or speculative):
    return ''
  which = (
    'plain and speculative'
    if plain and speculative
    else 'plain'
    if plain
    else 'speculative'
  )
  return (
    f'<span class="out-mark">NO EOS: {which} output ran to '
    'max_decode_len</span> '
  )


def _ending_head(r: dict[str, Any]) -> str:
  """The page's line on outputs without EOS and the speedup on those that
  end (first γ)."""
  e = r.get('by_ending')
  if not e:
    return ''
  n, ends = e['no_eos'], e['ends']
  text = (
    f'Outputs without EOS (ran to max_decode_len {n["max_decode_len"]}, '
    f'marked NO EOS below): plain {n["plain"]} of {r["num_examples"]}, '
    f'{n["plain_token_share"] * 100:.0f}% of plain output tokens.'
  )
  if ends['examples']:
    lo, hi = ends['speedup_spread']
    predicted = (
      f', predicted {ends["speedup_predicted"]:.2f}x'
      if 'speedup_predicted' in ends
      else ''
    )
    head = (
      f'On the {ends["examples"]} outputs that end: speedup '
      f'{ends["speedup_measured"]:.2f}x (rounds {lo:.2f}-{hi:.2f}x)'
      f'{predicted}, α {ends["alpha"]:.2f}, '
      f'{ends["tokens_per_call"]:.2f} tokens per target call.'
    )
    text = f'<b>{html.escape(head)}</b> {html.escape(text)}'
  else:
    text = html.escape(text)
  return f'<p class="meta">{text}</p>'


def page(
  r: dict[str, Any],
  records: Sequence[dict[str, Any]],
  decode: Callable[[list[int]], str],
) -> str:
  """The page of results `r` and the run's `records` (examples.jsonl)."""
  key = str(r['gammas'][0])
  beam = r.get('decode_method') == 'beam'
  unit = 'steps per call' if beam else 'tokens per target call'
  per_call = r.get('steps_per_call') if beam else r['tokens_per_call']
  head = (
    f'<h1>{html.escape(str(r["task"]))}/{html.escape(str(r["split"]))}: '
    f'{len(records)} examples, γ = {html.escape(key)}</h1>'
    f'<p class="meta">target {html.escape(str(r["target"]))}; draft '
    f'{html.escape(str(r["draft"]))}. <a href="summary.md">summary.md</a>'
    '</p>'
    + _ending_head(r)
    + f'<p class="meta">All {len(records)}: α {r["alpha"]:.2f}; '
    f'{per_call or 0:.2f} {unit}; measured speedup '
    f'{r["speedup_measured"]:.2f}x'
    + (
      ''
      if beam
      else f' (predicted from c and v timed apart: E[tok]/(γc+v) '
      f'{r["speedup_predicted"]:.2f}x)'
    )
    + '.</p>'
  )
  if not beam:
    head += legend()
  if r.get('sweep'):
    head += f'<p class="meta">A γ sweep: the outputs shown are γ = {key}.</p>'
  images = ''.join(
    f'<a href="{n}"><img src="{n}" alt="{n}"></a>' for n in plots.names(r)
  )
  body = ''.join(
    _beam_example(rec, rec['speculative'][key])
    if beam
    else _chain_example(rec, rec['speculative'][key], decode)
    for rec in records
  )
  return (
    '<!DOCTYPE html><html><head><meta charset="utf-8">'
    f'<title>spec_decode: {html.escape(str(r["task"]))}</title>'
    f'<style>{STYLE}</style></head><body>{head}<p>{images}</p>{body}'
    '</body></html>\n'
  )


def summary_links(r: dict[str, Any]) -> list[str]:
  """summary.md's lines linking the plots and this page."""
  beam = r.get('decode_method') == 'beam'
  what = (
    'each example with its beam steps per call'
    if beam
    else "each example's tokens coloured as in the paper's Figure 1"
  )
  return [
    '',
    'Plots: ' + ', '.join(f'[{n}]({n})' for n in plots.names(r)) + '.',
    f'Examples: [{PAGE_FILE}]({PAGE_FILE}), {what}.',
  ]


def write(
  output_dir: str,
  r: dict[str, Any],
  records: Sequence[dict[str, Any]],
  decode: Callable[[list[int]], str],
) -> str:
  """Writes examples.html into `output_dir`; returns its path."""
  return write_page(output_dir, page(r, records, decode))


def write_page(output_dir: str, text: str) -> str:
  """Writes `text` as examples.html into `output_dir` (whole: written
  aside, then renamed); returns its path."""
  path = os.path.join(output_dir, PAGE_FILE)
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    f.write(text)
  os.replace(path + '.tmp', path)
  return path

"""examples.html of an infer run: its first N predictions as the paper's
Figure 1 draws them (`PAGE_EXAMPLES`; the eval run's page, `report/pages`,
draws every example beside its plain decode).

Each prediction's tokens are coloured from the provenance the decode
recorded (accepted draft tokens green, each rejected draft token struck
through in red before the target's replacement in blue, the bonus token
violet, a bar per target call); beam search records none, and its
predictions are shown as text.
"""

import html
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from spec_decode.eval.report import pages

PAGE_FILE = pages.PAGE_FILE


def page(
  rows: Sequence[dict[str, Any]],
  decode: Callable[[list[int]], str],
  summary: dict[str, Any],
) -> str:
  """The page of the rows that carry a `page` entry (the first N)."""
  shown = [r for r in rows if 'page' in r]
  alpha = summary.get('alpha')
  head = (
    f'<h1>spec-decode infer: the first {len(shown)} of '
    f'{summary["examples"]} predictions</h1><p class="meta">'
    + html.escape(
      f'γ {summary["gamma"]}; {summary["tokens_per_call"] or 0:.2f} tokens '
      'per target call'
      + ('' if alpha is None else f'; α {alpha:.2f}')
      + f'; {summary["no_eos_fraction"]:.0%} of predictions without EOS.'
    )
    + '</p>'
    + pages.legend()
  )
  body = []
  for row in shown:
    p = row['page']
    if p.get('provenance'):
      out = pages.coloured(
        decode, p['tokens'], p['provenance'], dict(p.get('rejected', []))
      )
    else:
      out = html.escape(row['line']['prediction'])
    meta = f'#{row["index"]} · {row["calls"]} target calls · ' + (
      'NO EOS: ran to max_decode_len' if row['ran_out'] else 'ends with EOS'
    )
    body.append(
      f'<div class="ex"><div class="meta">{html.escape(meta)}</div>'
      f'<div class="src">{html.escape(p["input"])}</div>'
      f'<div class="out">{out}</div></div>'
    )
  return (
    '<!DOCTYPE html><html><head><meta charset="utf-8">'
    f'<title>spec-decode infer</title><style>{pages.STYLE}</style></head>'
    f'<body>{head}{"".join(body)}</body></html>\n'
  )


def write(
  output_dir: str,
  rows: Sequence[dict[str, Any]],
  decode: Callable[[list[int]], str],
  summary: dict[str, Any],
) -> str:
  """Writes examples.html into `output_dir`; returns its path."""
  return pages.write_page(output_dir, page(rows, decode, summary))

"""Outputs that end and outputs that run out, counted and reported apart.

A decode that reaches `max_decode_len` without EOS usually repeats itself
("X-Bibliothek, die X-Bibliothek, ..."), and a repeating target is easy to
draft: such outputs accept more tokens per call and speed up more than
outputs that end, and they hold many tokens each. A run's overall α and
speedup mix the two; `by_ending` gives each group's own, so a headline can
be the figure on outputs that end, with the share of the rest named.

An example counts as ending for γ `key` when both its plain and its
speculative output end with EOS (under greedy decoding they are the same
output; sampled, either running out makes it a long decode).
"""

from collections.abc import Sequence
from typing import Any

from spec_decode.core.ids import EOS_ID
from spec_decode.eval.report import speedup


def ran_out(tokens: Sequence[int], max_decode_len: int) -> bool:
  """Whether an output reached `max_decode_len` tokens without EOS."""
  return len(tokens) >= max_decode_len and (not tokens or tokens[-1] != EOS_ID)


def counts(
  records: Sequence[dict[str, Any]], key: str, max_decode_len: int
) -> dict[str, Any]:
  """How many outputs ran out, plain and speculative (γ `key`), and their
  share of each side's output tokens."""
  plain = [rec['plain_tokens'] for rec in records]
  spec = [rec['speculative'][key]['tokens'] for rec in records]

  def side(outputs):
    out = [t for t in outputs if ran_out(t, max_decode_len)]
    total = sum(len(t) for t in outputs)
    return len(out), sum(len(t) for t in out) / max(total, 1)

  (n_plain, share_plain), (n_spec, share_spec) = side(plain), side(spec)
  return {
    'max_decode_len': max_decode_len,
    'plain': n_plain,
    'plain_token_share': share_plain,
    'speculative': n_spec,
    'speculative_token_share': share_spec,
  }


def split(
  records: Sequence[dict[str, Any]], key: str, max_decode_len: int
) -> dict[str, list[dict[str, Any]]]:
  """`{'ends': [...], 'runs_out': [...]}`: the records by ending (module
  docstring)."""
  groups = {'ends': [], 'runs_out': []}
  for rec in records:
    out = ran_out(rec['plain_tokens'], max_decode_len) or ran_out(
      rec['speculative'][key]['tokens'], max_decode_len
    )
    groups['runs_out' if out else 'ends'].append(rec)
  return groups


def group_figures(
  records: Sequence[dict[str, Any]], key: str
) -> dict[str, Any]:
  """α, tokens per target call and the measured speedup (median of the
  rounds' ratios, with its spread) of γ `key` over `records`.

  Per row: a row's calls are its own iterations and its seconds its share
  of its batch's (at batch 1, its own decode's).
  """
  if not records:
    return {'examples': 0}
  specs = [rec['speculative'][key] for rec in records]
  tested = sum(s['tested'] for s in specs)
  tokens = sum(len(s['tokens']) for s in specs)
  return {
    'examples': len(records),
    'plain_output_tokens': sum(len(rec['plain_tokens']) for rec in records),
    'output_tokens': tokens,
    'alpha': sum(s['beta_sum'] for s in specs) / max(tested, 1),
    'tokens_per_call': tokens / max(sum(s['iterations'] for s in specs), 1),
    **speedup.speedups(records, key),
  }


def by_ending(
  records: Sequence[dict[str, Any]], key: str, max_decode_len: int
) -> dict[str, Any]:
  """The no-EOS counts (`counts`) and each group's figures
  (`group_figures`): `{'no_eos': {...}, 'ends': {...}, 'runs_out': {...}}`."""
  groups = split(records, key, max_decode_len)
  return {
    'no_eos': counts(records, key, max_decode_len),
    **{name: group_figures(group, key) for name, group in groups.items()},
  }

"""What `verify` (check/pair.py) reports: each check's verdict, and the table.

`PairCheck` is one check, `PairReport` all of them; `exact_check` builds a
deterministic check (greedy identity, zero probability), which passes when
nothing failed. The statistical checks are built in check/statistics.py.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class PairCheck:
  """One check of `verify`.

  Attributes:
    name: what was checked, e.g. 'greedy identity, gamma=3'.
    passed: the verdict.
    sample_size: rows compared (greedy) or sequences sampled.
    statistic: rows that differ / samples with probability 0 / Pearson's
      X^2 / the G statistic.
    p_value: the statistic's tail probability; None for deterministic
      checks.
    false_alarm: the rate at which this check fails an exact pair (0 for
      deterministic checks; the Bonferroni share for statistical ones).
    df: degrees of freedom (statistical checks).
    detail: a short note (the first mismatch, the draft's alpha, ...).
  """

  name: str
  passed: bool
  sample_size: int
  statistic: float
  p_value: float | None
  false_alarm: float
  df: int | None = None
  detail: str = ''


@dataclasses.dataclass(frozen=True)
class PairReport:
  """What `verify` found; `passed` when every check passed.

  Attributes:
    checks: every check, greedy ones first.
    false_alarm: family-wise false-alarm rate of the statistical checks.
  """

  checks: tuple[PairCheck, ...]
  false_alarm: float

  @property
  def passed(self) -> bool:
    return all(c.passed for c in self.checks)

  def table(self) -> str:
    """The verdicts as a Markdown table, with a closing verdict line."""
    rows = [
      '| check | verdict | n | statistic | df | p-value | false-alarm rate |',
      '|---|---|---|---|---|---|---|',
    ]
    for c in self.checks:
      p = '-' if c.p_value is None else f'{c.p_value:.3g}'
      df = '-' if c.df is None else str(c.df)
      stat = f'{c.statistic:.4g}' + (f' ({c.detail})' if c.detail else '')
      rows.append(
        f'| {c.name} | {"pass" if c.passed else "FAIL"} | {c.sample_size} '
        f'| {stat} | {df} | {p} | {c.false_alarm:.3g} |'
      )
    failed = [c.name for c in self.checks if not c.passed]
    tests = sum(c.p_value is not None for c in self.checks)
    rows.append('')
    if failed:
      rows.append(f'FAIL: {len(failed)} of {len(self.checks)} checks failed')
    else:
      rows.append(
        f'PASS: all {len(self.checks)} checks passed (family-wise '
        f'false-alarm rate {self.false_alarm:g}, Bonferroni over {tests} '
        'tests)'
      )
    return '\n'.join(rows)


def exact_check(name, n, failures, detail) -> PairCheck:
  """A deterministic check: passes when nothing failed."""
  return PairCheck(
    name=name,
    passed=not failures,
    sample_size=n,
    statistic=float(failures),
    p_value=None,
    false_alarm=0.0,
    detail=detail,
  )

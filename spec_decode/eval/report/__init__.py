"""The numbers and the report of an eval run (`spec_decode.eval.run`).

figures.py   results.json: acceptance, calls, quality, timings,
             predictions, by ending; `TIMING_KEYS`, `strip_timings`
summary.py   summary.md, the Markdown report
outcomes.py  outputs that end vs outputs that run out (no EOS)
speedup.py   the measured speedup: the median of the timing rounds' ratios
plots.py     the plots (acceptance histogram, per position, speedup vs γ)
pages.py     examples.html: every example coloured as the paper's Figure 1
"""

from spec_decode.eval.report.figures import TIMING_KEYS
from spec_decode.eval.report.figures import results
from spec_decode.eval.report.figures import strip_timings
from spec_decode.eval.report.summary import summary_markdown

__all__ = ['TIMING_KEYS', 'results', 'strip_timings', 'summary_markdown']

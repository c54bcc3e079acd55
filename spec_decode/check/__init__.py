"""Is a target/draft pair exact? The check behind `sd.verify`.

pair.py        `verify`: greedy identity, then the distribution tests per
               sampler, their false-alarm shares fixed before sampling
statistics.py  the distribution tests: teacher forcing, zero probability,
               the PIT chi-square, the enumerated G-test, chi-square tails
report.py      PairCheck, PairReport: each check's verdict and the table
"""

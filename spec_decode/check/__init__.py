"""Is a target/draft pair exact? The check behind `sd.verify`.

pair.py  greedy identity, whole-sequence sampling tests, the report
"""

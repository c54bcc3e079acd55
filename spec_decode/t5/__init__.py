"""T5 as T5X defines it: `T5Config`, the Flax network with T5X's parameter
names, the per-row KV cache, and the sentencepiece vocabulary."""

"""T5 as T5X defines it: `T5Config`, the Flax network with T5X's parameter
names, the per-row KV cache, and the vocabularies.

  config.py    `T5Config`: hyperparameters with T5X's field names
  network.py   the encoder-decoder in Flax linen, T5X's parameter paths
  relpos.py    relative position buckets and biases (per stack or per layer)
  long_attention.py  LongT5's local and transient-global encoder attention
  cache.py     the functional KV cache with a per-row write index (its
               slot layouts are `layers/layout.py`'s)
  vocab.py     the sentencepiece `Vocabulary` with T5's conventions
  byte_vocab.py  ByT5's `ByteVocabulary` (seqio's), the same interface
  gin_file.py  model gin files (ours or T5X's) read as a file format
"""

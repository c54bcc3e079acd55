"""Data: eval and training tasks, their metrics, the offline Debian data.

Nothing here imports seqio or TensorFlow until a seqio or TFDS task is used.

  tasks.py          tasks as text pairs: Debian, TFDS (WMT, CNN/DM), synthetic
  seqio_data.py     any seqio task or mixture as eval data, as T5X reads it
  seqio_tasks.py    our TFDS and Debian tasks registered in seqio
  quality.py        BLEU and ROUGE as T5 computes them
  debian.py         EnDe and summarization from Debian's package descriptions
  demo_slice.py     the demo's evaluation data (data/demo): a slice, manifest
  gettext_pairs.py  English-German pairs from installed gettext catalogues
  spm_trainer.py    trains the demo sentencepiece vocabulary
  pack.py           the splits a GPU training job needs, as one .tar.xz
  cli.py            `spec-decode data`: `build`, `vocab` and `pack`
  build_cli.py      `spec-decode data build`: the Debian splits
"""

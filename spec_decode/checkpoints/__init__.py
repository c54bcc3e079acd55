"""Checkpoint formats: ours (orbax), Hugging Face, T5X; gin model files.

`read`/`write` move a model's config, parameters and vocabulary between
memory and a directory; `sd.Model.load`/`Model.save` wrap them. Model gin
files, T5 (ours or T5X's, `spec_decode/t5/gin_file.py`) or T5Gemma, become
a config through `gin_model.read`.

  loader.py       `read`/`write`: detects the format; ours (orbax) read here
  huggingface.py  a Hugging Face T5 / MT5 / UMT5 / LongT5 directory
                  (safetensors, torch)
  t5gemma_hf.py   a Hugging Face T5Gemma / T5Gemma 2 directory: config,
                  names, the Gemma vocabulary, checked before weights
  hf_config.py    HF config.json <-> T5Config, HF names <-> ours, the output
                  scaling per model type
  t5x.py          a T5X checkpoint directory (msgpack + zarr arrays)
  t5x_layout.py   T5X scalable_t5 (3-D kernels, scanned layers) -> our layout
  t5gemma_export.py  T5Gemma / T5Gemma 2 -> a Hugging Face directory
                  transformers reads (config.json, sharded safetensors)
  gin_model.py    a model gin file -> `T5Config` or `T5GemmaConfig`, T5Gemma
                  files evaluated without gin's global state
  assemble.py     names and shapes checked against the config, one tensor
                  at a time, cast to the requested dtype
  convert.py      `spec-decode convert`: any format -> ours; T5Gemma ->
                  Hugging Face
"""

from spec_decode.checkpoints.assemble import CheckpointError
from spec_decode.checkpoints.loader import CONFIG_FILE
from spec_decode.checkpoints.loader import HUGGING_FACE
from spec_decode.checkpoints.loader import ORBAX
from spec_decode.checkpoints.loader import PARAMS_DIR
from spec_decode.checkpoints.loader import T5X
from spec_decode.checkpoints.loader import VOCAB_FILE
from spec_decode.checkpoints.loader import Checkpoint
from spec_decode.checkpoints.loader import detect_format
from spec_decode.checkpoints.loader import read
from spec_decode.checkpoints.loader import read_vocabulary
from spec_decode.checkpoints.loader import save_arrays
from spec_decode.checkpoints.loader import write
from spec_decode.checkpoints.loader import write_vocabulary

__all__ = [
  'CONFIG_FILE',
  'Checkpoint',
  'CheckpointError',
  'HUGGING_FACE',
  'ORBAX',
  'PARAMS_DIR',
  'T5X',
  'VOCAB_FILE',
  'detect_format',
  'read',
  'read_vocabulary',
  'save_arrays',
  'write',
  'write_vocabulary',
]

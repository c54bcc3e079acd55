"""Checkpoint formats: ours (orbax), Hugging Face, T5X; gin model files.

`read`/`write` move a model's config, parameters and vocabulary between
memory and a directory; `sd.Model.load`/`Model.save` wrap them. The format
readers (`huggingface.py`, `t5x.py`) feed `assemble.py`, which checks
names and shapes against the config before reading a tensor. `convert.py` is
`spec-decode convert`. (Model gin files, ours or T5X's, are read by
`T5Config.from_gin`, `spec_decode/t5/gin_file.py`.)
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

"""Language models behind the protocol: `Model` (a T5 network with its
weights, loading and saving) and `TableLM` (an n-gram table).

  t5_model.py  `Model`: a T5 network with its weights (pytree), load, save
  packing.py   the decoder's weights packed for the CPU kernel, or rounded
               to bfloat16 for drafting
  t5gemma_model.py  `T5GemmaModel`: T5Gemma / T5Gemma 2 behind the protocol
  table_lm.py  `TableLM`: next-token logits from a [V, V] table
"""

from spec_decode.models.t5_model import Model
from spec_decode.models.t5_model import shift_right
from spec_decode.models.t5gemma_model import T5GemmaModel
from spec_decode.models.table_lm import TableLM

__all__ = ['Model', 'T5GemmaModel', 'TableLM', 'shift_right']

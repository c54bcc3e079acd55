"""Language models behind the protocol: `Model` (a T5 network with its
weights, loading and saving) and `TableLM` (an n-gram table)."""

from spec_decode.models.t5_model import Model
from spec_decode.models.t5_model import shift_right
from spec_decode.models.table_lm import TableLM

__all__ = ['Model', 'TableLM', 'shift_right']

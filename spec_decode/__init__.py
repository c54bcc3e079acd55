"""spec_decode: exact speculative decoding for T5 encoder-decoders in JAX."""

from spec_decode import drafters
from spec_decode import multihost
from spec_decode.checkpoints import CheckpointError
from spec_decode.config import EOS_ID
from spec_decode.config import PAD_ID
from spec_decode.config import UNK_ID
from spec_decode.config import T5Config
from spec_decode.decoding import DecodeSettings
from spec_decode.generation import GenerateOutput
from spec_decode.generation import SpecStats
from spec_decode.generation import generate
from spec_decode.models import Model
from spec_decode.partitioning import Partitioner
from spec_decode.sampling import Sampler
from spec_decode.speculative import ExactVerifier
from spec_decode.speculative import VerifyResult
from spec_decode.table_lm import TableLM
from spec_decode.vocab import Vocabulary

__all__ = [
  'CheckpointError',
  'DecodeSettings',
  'EOS_ID',
  'ExactVerifier',
  'GenerateOutput',
  'Model',
  'PAD_ID',
  'Partitioner',
  'Sampler',
  'SpecStats',
  'T5Config',
  'UNK_ID',
  'TableLM',
  'VerifyResult',
  'Vocabulary',
  'drafters',
  'multihost',
  'generate',
]

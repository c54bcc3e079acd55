"""spec_decode: exact speculative decoding for T5 encoder-decoders in JAX."""

from spec_decode import drafters
from spec_decode.checkpoints import CheckpointError
from spec_decode.core.beam_search import BeamSearchOutput
from spec_decode.core.beam_search import beam_search
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.generation import GenerateOutput
from spec_decode.core.generation import SpecStats
from spec_decode.core.generation import generate
from spec_decode.core.pair_check import PairReport
from spec_decode.core.pair_check import verify
from spec_decode.core.sampling import Sampler
from spec_decode.core.verify import ExactVerifier
from spec_decode.core.verify import VerifyResult
from spec_decode.models.t5_model import Model
from spec_decode.models.table_lm import TableLM
from spec_decode.parallel import multihost
from spec_decode.parallel.partitioning import Partitioner
from spec_decode.t5.config import EOS_ID
from spec_decode.t5.config import PAD_ID
from spec_decode.t5.config import UNK_ID
from spec_decode.t5.config import T5Config
from spec_decode.t5.vocab import Vocabulary

__all__ = [
  'BeamSearchOutput',
  'CheckpointError',
  'DecodeSettings',
  'EOS_ID',
  'ExactVerifier',
  'GenerateOutput',
  'Model',
  'PAD_ID',
  'PairReport',
  'Partitioner',
  'Sampler',
  'SpecStats',
  'T5Config',
  'UNK_ID',
  'TableLM',
  'VerifyResult',
  'Vocabulary',
  'beam_search',
  'drafters',
  'multihost',
  'generate',
  'verify',
]

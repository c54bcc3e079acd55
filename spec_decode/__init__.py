"""spec_decode: exact speculative decoding for T5 encoder-decoders in JAX.

The public API (`import spec_decode as sd`) is re-exported below. Rooms and
modules, bottom to top of the layering (tests/test_layout.py):

  paths.py      where the repository's gin/ and configs/ live
  theory/       the paper's section 3 as numpy functions; its tables
  core/         the engine's primitives: protocols, sampling, Algorithm 1
  policy/       cost measurement and the gamma policy
  tree/         token trees: verification, the loop, tree='auto'
  beam/         beam search, plain and exactly speculative
  chain/        plain, fixed-gamma and gamma='auto' loops; `generate`
  check/        is a target/draft pair exact? (`sd.verify`)
  kernels/      the small-K CPU matmul called through XLA's FFI
  layers/       what both network families use: blocked float32 dots, the
                slot layouts (causal, tree) of a decoder call
  t5/           T5Config, the network with T5X's names, cache, vocabulary
  t5gemma/      T5Gemma and T5Gemma 2: config, network (RoPE, GQA, sliding
                and global layers, soft-caps), a ring-buffer cache
  checkpoints/  checkpoint formats: ours (orbax), Hugging Face, T5X
  models/       `Model` (a T5 behind the protocol), `T5GemmaModel`, `TableLM`
  parallel/     partitioning (logical axis rules), multi-host, memory
  drafters/     n-gram, copy, Medusa heads, feature (EAGLE-style) and
                early-exit drafts, hierarchical drafters
  data/         tasks (our readers and seqio), metrics, the Debian data
  train/        LM and Medusa-heads training (`spec-decode train`)
  eval/         the eval run, its reports and comparisons
  bench/        `spec-decode bench` and its sub-benchmarks
  main.py       the `spec-decode` command line (the only entry point)
  gin_cli.py    the one place that parses --gin_file / --gin.NAME=VALUE
  demo.py       `make demo`: a short decode on random tiny models
"""

from spec_decode import drafters
from spec_decode.beam.search import BeamSearchOutput
from spec_decode.beam.search import beam_search
from spec_decode.chain.generation import GenerateOutput
from spec_decode.chain.generation import generate
from spec_decode.check.pair import verify
from spec_decode.check.report import PairReport
from spec_decode.checkpoints import CheckpointError
from spec_decode.core.counters import SpecStats
from spec_decode.core.decode_settings import DecodeSettings
from spec_decode.core.rejection import ExactVerifier
from spec_decode.core.rejection import VerifyResult
from spec_decode.core.sampling import Sampler
from spec_decode.core.tree_shape import DynamicTree
from spec_decode.models.t5_model import Model
from spec_decode.models.t5gemma_model import T5GemmaModel
from spec_decode.models.table_lm import TableLM
from spec_decode.parallel import multihost
from spec_decode.parallel.partitioning import Partitioner
from spec_decode.policy.carried import AcceptanceEstimate
from spec_decode.t5.config import EOS_ID
from spec_decode.t5.config import PAD_ID
from spec_decode.t5.config import UNK_ID
from spec_decode.t5.config import T5Config
from spec_decode.t5.vocab import Vocabulary
from spec_decode.t5gemma.config import StackConfig
from spec_decode.t5gemma.config import T5GemmaConfig

__all__ = [
  'AcceptanceEstimate',
  'BeamSearchOutput',
  'CheckpointError',
  'DecodeSettings',
  'DynamicTree',
  'EOS_ID',
  'ExactVerifier',
  'GenerateOutput',
  'Model',
  'PAD_ID',
  'PairReport',
  'Partitioner',
  'Sampler',
  'SpecStats',
  'StackConfig',
  'T5Config',
  'T5GemmaConfig',
  'T5GemmaModel',
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

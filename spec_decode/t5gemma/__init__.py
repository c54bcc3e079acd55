"""T5Gemma and T5Gemma 2 (Google's Gemma-based encoder-decoders), text only.

config.py    `T5GemmaConfig` / `StackConfig`: both versions' hyperparameters
rope.py      rotary position embeddings (a base per layer type)
modules.py   RMSNorm (1 + w), GeGLU, scaled embedding, grouped-query
             attention with soft-capping and QK-norm
network.py   encoder, decoder (cross or merged attention), the sliding and
             global visibility per position, the parameter tree
cache.py     `RingKVCache`: global layers whole, sliding layers a ring
             buffer of their window
"""

from spec_decode.t5gemma.config import StackConfig
from spec_decode.t5gemma.config import T5GemmaConfig

__all__ = ['StackConfig', 'T5GemmaConfig']

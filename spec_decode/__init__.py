"""spec_decode: exact speculative decoding for T5 encoder-decoders in JAX."""

from spec_decode.config import EOS_ID, PAD_ID, T5Config
from spec_decode.models import Model

__all__ = ['EOS_ID', 'PAD_ID', 'Model', 'T5Config']

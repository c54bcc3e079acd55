"""Drafters: anything implementing the language-model protocol as a draft."""

from spec_decode.drafters.controlled import ControlledDraft
from spec_decode.drafters.copy import Copy
from spec_decode.drafters.hierarchical import Hierarchical
from spec_decode.drafters.ngram import NGram

__all__ = ['ControlledDraft', 'Copy', 'Hierarchical', 'NGram']

"""Drafters: anything implementing the language-model protocol as a draft."""

from spec_decode.drafters.controlled import ControlledDraft

__all__ = ['ControlledDraft']

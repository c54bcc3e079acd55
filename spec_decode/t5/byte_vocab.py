"""ByT5's byte vocabulary with seqio's `ByteVocabulary` semantics.

Ids 0, 1, 2 are padding, EOS and unknown; byte `b` of the UTF-8 text is id
`b + 3` (259 ids); `extra_ids` ids sit above them. Where the sentinels are
depends on the framework the model comes from (`sentinels`), so that a
user's text encodes to the ids their framework gives it:

* `'seqio'` (T5X gin files' `@seqio.ByteVocabulary()`, `convert --vocab
  byte`, the default): exactly seqio. Text is bytes only: `<extra_id_0>` in
  a text is its 12 bytes, and decodes back to the same text; the extra ids
  (`extra_id(i)`, `<extra_id_0>` at the top, what T5's span-corruption
  preprocessors emit) decode to nothing, as seqio maps them to unknown.
* `'hf'` (an HF ByT5 directory): transformers' `ByT5Tokenizer` (4.x and
  5): `<extra_id_i>` in a text is one id, `259 + i`, counting up, and
  decodes back to `<extra_id_i>`.

seqio's default is 0 extra ids (T5X's ByT5 files); HF's ByT5 tokenizer has
125 (259 + 125 = 384, the models' embedding rows). Decoding stops at EOS
and drops bytes that do not form UTF-8 (seqio's `errors='ignore'`).
"""

import hashlib
import re
from typing import Iterable
from typing import Sequence

import numpy as np

from spec_decode.core.ids import EOS_ID
from spec_decode.core.ids import PAD_ID
from spec_decode.core.ids import UNK_ID
from spec_decode.t5 import vocab as vocab_lib

NUM_SPECIAL = 3
NUM_BYTES = 256
_EXTRA_ID = re.compile(r'<extra_id_(\d+)>')
SEQIO = 'seqio'
HF = 'hf'


class ByteVocabulary:
  """UTF-8 bytes offset by 3, plus `extra_ids` sentinels (see `sentinels`
  in the module docstring: seqio's or transformers' numbering)."""

  serialized = None  # No model file: nothing to store but `extra_ids`.

  def __init__(self, extra_ids: int = 0, sentinels: str = SEQIO):
    if extra_ids < 0:
      raise ValueError(f'extra_ids must be >= 0, got {extra_ids}')
    if sentinels not in (SEQIO, HF):
      raise ValueError(f"sentinels must be 'seqio' or 'hf', got {sentinels!r}")
    self._extra_ids = int(extra_ids)
    self._sentinels = sentinels
    h = hashlib.sha256(b'seqio.ByteVocabulary')
    h.update(b'extra_ids=%d' % self._extra_ids)
    if sentinels == HF:
      h.update(b'sentinels=hf')
    self._digest = h.hexdigest()

  extra_ids = property(lambda self: self._extra_ids)
  sentinels = property(lambda self: self._sentinels)
  digest = property(lambda self: self._digest)
  base_vocab_size = property(lambda self: NUM_SPECIAL + NUM_BYTES)
  vocab_size = property(lambda self: self.base_vocab_size + self._extra_ids)
  pad_id = property(lambda self: PAD_ID)
  eos_id = property(lambda self: EOS_ID)
  unk_id = property(lambda self: UNK_ID)

  def __eq__(self, other) -> bool:
    if not isinstance(other, ByteVocabulary):
      return NotImplemented
    return self._digest == other._digest

  def __hash__(self) -> int:
    return hash(self._digest)

  def __repr__(self) -> str:
    hf = ", transformers' sentinels" if self._sentinels == HF else ''
    return (
      f'ByteVocabulary({self.vocab_size} ids = 3 special + 256 bytes + '
      f'{self._extra_ids} extra{hf})'
    )

  def __reduce__(self):
    return (ByteVocabulary, (self._extra_ids, self._sentinels))

  def extra_id(self, i: int) -> int:
    """Id of `<extra_id_i>`: seqio's `vocab_size - 1 - i` (the top), or
    transformers' `259 + i`."""
    if not 0 <= i < self._extra_ids:
      raise ValueError(f'extra id {i} out of range [0, {self._extra_ids})')
    if self._sentinels == HF:
      return self.base_vocab_size + i
    return self.vocab_size - 1 - i

  def encode(self, text: str) -> list[int]:
    """Byte ids of `text`, without EOS; with transformers' sentinels,
    `<extra_id_N>` (N < extra_ids) is its one id."""
    ids, pos = [], 0
    if self._sentinels == HF:
      for m in _EXTRA_ID.finditer(text):
        n = int(m.group(1))
        if n >= self._extra_ids:
          continue
        ids.extend(b + NUM_SPECIAL for b in text[pos : m.start()].encode())
        ids.append(self.extra_id(n))
        pos = m.end()
    ids.extend(b + NUM_SPECIAL for b in text[pos:].encode())
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS; padding, unknown and ids past
    `vocab_size` dropped; extra ids dropped (seqio) or `<extra_id_N>`
    (transformers' sentinels)."""
    pieces, run = [], bytearray()

    def flush():
      if run:
        pieces.append(run.decode('utf-8', errors='ignore'))
        run.clear()

    for i in (int(t) for t in ids):
      if i == EOS_ID:
        break
      if NUM_SPECIAL <= i < self.base_vocab_size:
        run.append(i - NUM_SPECIAL)
      elif (
        self._sentinels == HF and self.base_vocab_size <= i < self.vocab_size
      ):
        flush()
        pieces.append(f'<extra_id_{i - self.base_vocab_size}>')
    flush()
    return ''.join(pieces)

  def encode_batch(
    self, texts: Sequence[str], max_len: int | None = None
  ) -> np.ndarray:
    """`[B, S]` int32, EOS appended, 0-padded (see `Vocabulary`)."""
    return vocab_lib.pad_rows([self.encode(t) for t in texts], max_len)

  def decode_batch(self, tokens) -> list[str]:
    return [self.decode(row) for row in np.asarray(tokens)]

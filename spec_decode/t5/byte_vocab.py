"""ByT5's byte vocabulary with seqio's `ByteVocabulary` semantics.

Ids 0, 1, 2 are padding, EOS and unknown; byte `b` of the UTF-8 text is id
`b + 3` (259 ids); `extra_ids` sentinels sit above them, `<extra_id_0>` at
the top, as in our sentencepiece `Vocabulary`, whose interface this class
shares (sizes, special ids, `encode`/`decode`, batches, digest equality).
seqio's default is 0 extra ids (T5X's ByT5 files); HF's ByT5 tokenizer has
125 (259 + 125 = 384, the models' embedding rows). Decoding drops bytes
that do not form UTF-8 (seqio's `errors='ignore'`).
"""

import hashlib
import re
from typing import Iterable
from typing import Sequence

import numpy as np

from spec_decode.core.ids import EOS_ID
from spec_decode.core.ids import PAD_ID
from spec_decode.core.ids import UNK_ID

NUM_SPECIAL = 3
NUM_BYTES = 256
_EXTRA_ID = re.compile(r'<extra_id_(\d+)>')


class ByteVocabulary:
  """UTF-8 bytes offset by 3, plus `extra_ids` sentinels."""

  serialized = None  # No model file: nothing to store but `extra_ids`.

  def __init__(self, extra_ids: int = 0):
    if extra_ids < 0:
      raise ValueError(f'extra_ids must be >= 0, got {extra_ids}')
    self._extra_ids = int(extra_ids)
    h = hashlib.sha256(b'seqio.ByteVocabulary')
    h.update(b'extra_ids=%d' % self._extra_ids)
    self._digest = h.hexdigest()

  extra_ids = property(lambda self: self._extra_ids)
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
    return (
      f'ByteVocabulary({self.vocab_size} ids = 3 special + 256 bytes + '
      f'{self._extra_ids} extra)'
    )

  def __reduce__(self):
    return (ByteVocabulary, (self._extra_ids,))

  def extra_id(self, i: int) -> int:
    """Id of `<extra_id_i>`; `<extra_id_0>` is the highest id."""
    if not 0 <= i < self._extra_ids:
      raise ValueError(f'extra id {i} out of range [0, {self._extra_ids})')
    return self.vocab_size - 1 - i

  def encode(self, text: str) -> list[int]:
    """Byte ids of `text`, without EOS; `<extra_id_N>` maps to its id."""
    ids, pos = [], 0
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
    """Text of `ids` up to the first EOS; padding and unknown ids dropped,
    extra ids as `<extra_id_N>`, ids past `vocab_size` dropped."""
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
      elif self.base_vocab_size <= i < self.vocab_size:
        flush()
        pieces.append(f'<extra_id_{self.vocab_size - 1 - i}>')
    flush()
    return ''.join(pieces)

  def encode_batch(
    self, texts: Sequence[str], max_len: int | None = None
  ) -> np.ndarray:
    """`[B, S]` int32, EOS appended, 0-padded (see `Vocabulary`)."""
    rows = [self.encode(t) for t in texts]
    if max_len is None:
      max_len = max((len(r) for r in rows), default=0) + 1
    if max_len < 1:
      raise ValueError(f'max_len must be >= 1, got {max_len}')
    out = np.full((len(rows), max_len), PAD_ID, np.int32)
    for b, r in enumerate(rows):
      r = r[: max_len - 1] + [EOS_ID]
      out[b, : len(r)] = r
    return out

  def decode_batch(self, tokens) -> list[str]:
    return [self.decode(row) for row in np.asarray(tokens)]

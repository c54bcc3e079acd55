"""Sentencepiece vocabulary with T5's conventions.

T5 reserves id 0 for padding (also the decoder start token), 1 for EOS and 2
for unknown pieces; `extra_ids` sentinel tokens (`<extra_id_0>`,
`<extra_id_1>`, ...) sit above the sentencepiece pieces, `<extra_id_0>` at the
very top, as in seqio's `SentencePieceVocabulary`.

A `Vocabulary` is immutable, hashable and compared by content (a digest of the
serialized model proto plus `extra_ids`): a `Model` carries it as static aux
data under `jax.jit`, and a draft and a target must share one.
"""

import hashlib
import os
import re
from typing import Iterable
from typing import Sequence

import numpy as np
import sentencepiece as spm

from spec_decode.core.ids import EOS_ID
from spec_decode.core.ids import PAD_ID
from spec_decode.core.ids import UNK_ID

DEFAULT_EXTRA_IDS = 100
_EXTRA_ID = re.compile(r'<extra_id_(\d+)>')


class Vocabulary:
  """A sentencepiece model plus T5's extra ids.

  Attributes:
    extra_ids: number of sentinel ids above the sentencepiece pieces.
    digest: sha256 hex digest identifying the model and `extra_ids`.
  """

  # The special ids (pad, eos, unk) the sentencepiece model must have, and
  # whose they are (a subclass names another family's: Gemma's unk is 3).
  SPECIAL_IDS = (PAD_ID, EOS_ID, UNK_ID)
  FAMILY = 'T5'

  def __init__(
    self,
    serialized_model: bytes,
    extra_ids: int = DEFAULT_EXTRA_IDS,
    name: str = '<bytes>',
  ):
    """Builds a vocabulary from a serialized sentencepiece `ModelProto`.

    Args:
      serialized_model: the contents of a `.model` file.
      extra_ids: number of sentinel ids appended above the pieces.
      name: where the model came from, for error messages.

    Raises:
      ValueError: the bytes are not a sentencepiece model, or its special ids
        differ from T5's (pad 0, EOS 1, unk 2).
    """
    if extra_ids < 0:
      raise ValueError(f'extra_ids must be >= 0, got {extra_ids}')
    self._serialized = bytes(serialized_model)
    self._extra_ids = int(extra_ids)
    self._name = name
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(self._serialized)
    except Exception as e:  # sentencepiece raises RuntimeError or OSError.
      raise ValueError(f'{name}: not a sentencepiece model ({e})') from e
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id())
    if ids != self.SPECIAL_IDS:
      raise ValueError(
        f'{name}: sentencepiece special ids (pad, eos, unk) = {ids}; '
        f'{self.FAMILY} needs {self.SPECIAL_IDS}'
      )
    h = hashlib.sha256(self._serialized)
    h.update(b'extra_ids=%d' % self._extra_ids)
    self._digest = h.hexdigest()

  @classmethod
  def from_file(
    cls, path: str | os.PathLike, extra_ids: int = DEFAULT_EXTRA_IDS
  ) -> 'Vocabulary':
    """Reads a sentencepiece `.model` file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
      raise FileNotFoundError(f'sentencepiece model not found: {path}')
    with open(path, 'rb') as f:
      return cls(f.read(), extra_ids=extra_ids, name=path)

  # -- identity ---------------------------------------------------------------
  @property
  def serialized(self) -> bytes:
    """The serialized sentencepiece model proto."""
    return self._serialized

  @property
  def extra_ids(self) -> int:
    return self._extra_ids

  @property
  def digest(self) -> str:
    return self._digest

  def __eq__(self, other) -> bool:
    if not isinstance(other, Vocabulary):
      return NotImplemented
    return self._digest == other._digest

  def __hash__(self) -> int:
    return hash(self._digest)

  def __repr__(self) -> str:
    return (
      f'Vocabulary({self.vocab_size} ids = {self.base_vocab_size} '
      f'pieces + {self.extra_ids} extra, sha256 {self._digest[:12]})'
    )

  def __reduce__(self):
    return (type(self), (self._serialized, self._extra_ids, self._name))

  # -- sizes and ids ----------------------------------------------------------
  @property
  def base_vocab_size(self) -> int:
    """Number of sentencepiece pieces (ids below the extra ids)."""
    return self._sp.GetPieceSize()

  @property
  def vocab_size(self) -> int:
    """Number of ids, extra ids included (a model may have more rows)."""
    return self.base_vocab_size + self._extra_ids

  @property
  def pad_id(self) -> int:
    return PAD_ID

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def unk_id(self) -> int:
    return UNK_ID

  def extra_id(self, i: int) -> int:
    """Id of `<extra_id_i>`; `<extra_id_0>` is the highest id."""
    if not 0 <= i < self._extra_ids:
      raise ValueError(f'extra id {i} out of range [0, {self._extra_ids})')
    return self.vocab_size - 1 - i

  # -- text <-> ids -----------------------------------------------------------
  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without EOS; `<extra_id_N>` maps to its id."""
    ids = []
    pos = 0
    for m in _EXTRA_ID.finditer(text):
      n = int(m.group(1))
      if n >= self._extra_ids:
        continue  # Not a sentinel of this vocabulary: plain text.
      ids.extend(self._sp.EncodeAsIds(text[pos : m.start()]))
      ids.append(self.extra_id(n))
      pos = m.end()
    ids.extend(self._sp.EncodeAsIds(text[pos:]))
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; stops at the first EOS, skips padding.

    Extra ids decode to `<extra_id_N>`; ids past `vocab_size` (models round
    their vocabulary up, e.g. 32128) decode as unknown pieces.
    """
    pieces: list[str] = []
    run: list[int] = []

    def flush():
      if run:
        pieces.append(self._sp.DecodeIds(run))
        run.clear()

    base = self.base_vocab_size
    for i in (int(t) for t in ids):
      if i == EOS_ID:
        break
      if i == PAD_ID:
        continue
      if base <= i < self.vocab_size:
        flush()
        pieces.append(f'<extra_id_{self.vocab_size - 1 - i}>')
      else:
        run.append(i if 0 <= i < base else UNK_ID)
    flush()
    return ''.join(pieces)

  def encode_batch(
    self, texts: Sequence[str], max_len: int | None = None
  ) -> np.ndarray:
    """Encodes `texts` into `[B, max_len]` int32, EOS appended, 0-padded.

    As seqio's `trim_and_append_eos`: a text longer than `max_len - 1`
    tokens is cut, then EOS is appended, so every row ends with EOS.

    Args:
      texts: B strings.
      max_len: row length S; default the longest encoding plus one.

    Returns:
      `np.int32 [B, S]`.
    """
    return pad_rows([self.encode(t) for t in texts], max_len)

  def decode_batch(self, tokens) -> list[str]:
    """Decodes `tokens [B, T]` row by row, each up to its first EOS."""
    return [self.decode(row) for row in np.asarray(tokens)]


def check_compatible(
  target_vocab: Vocabulary | None, draft_vocab: Vocabulary | None
) -> None:
  """Raises ValueError when a draft's vocabulary differs from the target's.

  A missing vocabulary (None) on either side is accepted: random test models
  carry none.
  """
  if target_vocab is None or draft_vocab is None:
    return
  if target_vocab != draft_vocab:
    raise ValueError(
      'draft and target vocabularies differ: target has '
      f'{target_vocab!r}, draft has {draft_vocab!r}; speculative decoding '
      'needs both models to share one vocabulary'
    )


def pad_rows(
  rows: Sequence[list[int]], max_len: int | None = None
) -> np.ndarray:
  """Encoded rows as `[B, max_len] int32`: each cut to `max_len - 1` ids,
  EOS appended, 0-padded; `max_len` defaults to the longest row + 1."""
  if max_len is None:
    max_len = max((len(r) for r in rows), default=0) + 1
  if max_len < 1:
    raise ValueError(f'max_len must be >= 1, got {max_len}')
  out = np.full((len(rows), max_len), PAD_ID, np.int32)
  for b, r in enumerate(rows):
    r = list(r[: max_len - 1]) + [EOS_ID]
    out[b, : len(r)] = r
  return out

"""Inputs from a plain file, without seqio: text lines or a JSONL field.

`load(settings, vocabulary, owns)` reads `settings.input_file` and returns
the `task_data.TaskData` an infer run decodes, as `task_data.load` does for
a task split: line n is example n - 1, in file order. A text file holds one
input per line; with `input_field` every line is a JSON object and that
field is the input (`id_field`, if set, is copied to the prediction).

Inputs are tokenized with the model's vocabulary as the eval run tokenizes
a built-in task's (cut to max_input_len - 1 ids, then EOS: seqio's
`append_eos_after_trim`). A bad line is trimmed that way or fails, naming
the file and line, as `bad_lines` says (`InferSettings`): an empty line,
bytes that are not UTF-8, an input longer than max_input_len tokens with
its EOS. A line that is not a JSON object with the field always fails (it
has no input to trim).

Every process reads and checks the whole file (an error is everyone's), and
keeps the ids of its share only (`owns`, as in `task_data`).
"""

import json
import os
from collections.abc import Callable
from typing import Any

import spec_decode as sd
from spec_decode.eval.infer import settings as settings_lib
from spec_decode.eval.load import task_data
from spec_decode.t5 import vocab as vocab_lib

SOURCE = 'file'


def task_name(path: str) -> str:
  """The name predictions of a file are written under: its base name
  without extension (`inputs.txt` -> `inputs`)."""
  stem = os.path.basename(path)
  for ext in ('.txt', '.jsonl', '.json', '.tsv'):
    if stem.endswith(ext):
      return stem[: -len(ext)] or stem
  return stem


def _lines(path: str) -> list[bytes]:
  with open(path, 'rb') as f:
    data = f.read()
  lines = data.split(b'\n')
  if lines and lines[-1] == b'':  # The file's last newline ends a line.
    lines.pop()
  return [line[:-1] if line.endswith(b'\r') else line for line in lines]


def _text(
  raw: bytes, where: str, s: settings_lib.InferSettings
) -> tuple[str, Any]:
  """(the line's input text, its id or None)."""
  try:
    line = raw.decode('utf-8')
  except UnicodeDecodeError as e:
    if s.bad_lines == 'fail':
      raise ValueError(f'{where}: not UTF-8 ({e.reason} at byte '
                       f'{e.start})') from None  # fmt: skip
    line = raw.decode('utf-8', errors='replace')
  if s.input_field is None:
    return line, None
  try:
    obj = json.loads(line)
  except ValueError as e:
    raise ValueError(f'{where}: not a JSON object ({e})') from None
  if not isinstance(obj, dict) or s.input_field not in obj:
    raise ValueError(f'{where}: no field {s.input_field!r}')
  text = obj[s.input_field]
  if not isinstance(text, str):
    raise ValueError(f'{where}: field {s.input_field!r} is not a string')
  ident = None
  if s.id_field is not None:
    if s.id_field not in obj:
      raise ValueError(f'{where}: no field {s.id_field!r}')
    ident = obj[s.id_field]
  return text, ident


def load(
  settings: settings_lib.InferSettings,
  vocabulary: vocab_lib.Vocabulary | None,
  owns: Callable[[int], bool] | None = None,
) -> task_data.TaskData:
  """The examples of `settings.input_file` (see the module docstring).

  Raises:
    ValueError: no vocabulary, an empty file, or a bad line with
      `bad_lines='fail'` (`path:line: what`).
    OSError: the file cannot be read.
  """
  s = settings
  if vocabulary is None:
    raise ValueError(
      'the target has no vocabulary; set VOCABULARY (a sentencepiece .model)'
    )
  owns = owns or (lambda i: True)
  name = task_name(s.input_file)
  lines = _lines(s.input_file)[: s.num_examples]
  exs, features, tokens = [], [], []
  for i, raw in enumerate(lines):
    where = f'{s.input_file}:{i + 1}'
    text, ident = _text(raw, where, s)
    ids = vocabulary.encode(text)
    if s.bad_lines == 'fail':
      if not text.strip():
        raise ValueError(f'{where}: empty input')
      if len(ids) + 1 > s.max_input_len:
        raise ValueError(
          f'{where}: {len(ids) + 1} tokens with EOS, longer than the '
          f'inputs feature length {s.max_input_len}'
        )
    if not owns(i):
      exs.append(None)
      features.append(None)
      tokens.append(None)
      continue
    tokens.append(ids[: s.max_input_len - 1] + [sd.EOS_ID])
    exs.append({'inputs': text, 'targets': ''})
    inputs = {'inputs_pretokenized': text}
    if s.id_field is not None:
      inputs = {s.id_field: ident, **inputs}
    features.append({'subtask': name, 'pretokenized': inputs})
  if not lines:
    raise ValueError(f'{s.input_file} has no lines')

  def score(_, __):
    return {}, ['an input file has no references']

  return task_data.TaskData(
    source=SOURCE,
    metric='(none)',
    vocabulary=vocabulary,
    examples=exs,
    features=features,
    token_lists=tokens,
    decode=vocabulary.decode,
    score=score,
  )

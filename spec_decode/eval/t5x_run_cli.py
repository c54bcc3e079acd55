"""T5X's run macros and flags for `spec-decode eval` (see gin/runs/eval.gin).

A T5X user's eval or infer command line runs here with the draft added:

* `--gin_file=t5x/configs/runs/eval.gin` (or `infer.gin`) means our
  `runs/eval.gin`, which binds the same macros (T5X's file imports t5x).
* A `--gin_file` that is a model gin file (it binds `T5Config`, like T5X's
  `t5x/examples/t5/t5_1_1/xxl.gin` or our `models/t5_1_1/xxl.gin`, or
  `T5GemmaConfig`, like `models/t5gemma/2b_2b.gin`) is the target's model:
  `TARGET_MODEL_GIN`, read by `checkpoints/gin_model.py`, not by gin.
* Command-line bindings of T5X's `utils.DatasetConfig` and
  `utils.RestoreCheckpointConfig` fields become the macros they set
  (`DatasetConfig.split` -> `SPLIT`, ...; `partitioning.PjitPartitioner.
  num_partitions` -> `NUM_PARTITIONS`, `.model_parallel_submesh` ->
  `MODEL_PARALLEL_SUBMESH`); T5X bindings with no counterpart (logical axis
  rules, checkpoint modes) are errors naming them.
* The same bindings inside a run gin file (`partitioning.PjitPartitioner.
  num_partitions = 4`, under `from t5x import partitioning` or old-style)
  set the same macros (`file_bindings`): gin skips those configurables and
  the import of t5x (which need not be installed), and the macros are bound
  after the files and before the command line, so that a command-line
  binding still wins and, among files, the T5X name beats our macro (as
  for the aliases below).
* Aliases (`TASK` for `MIXTURE_OR_TASK_NAME`, ...; `ALIASES`): a binding on
  the command line beats one in a file, and at the same level the T5X name
  beats its alias. runs/eval.gin links each T5X name to its alias
  (`MIXTURE_OR_TASK_NAME = %TASK`), which settles the files; `link_aliases`
  appends the links that settle the command line, and `links_after_parse`
  links an alias a file left apart, and a command-line `MAX_INPUT_LEN` or
  `MAX_DECODE_LEN` against a file's `TASK_FEATURE_LENGTHS`.
"""

import os
import re
from collections.abc import Sequence
from typing import Any

from spec_decode import gin_cli
from spec_decode import paths
from spec_decode.checkpoints import gin_model
from spec_decode.t5 import gin_file

# (T5X's name, our alias).
ALIASES = (
  ('MIXTURE_OR_TASK_NAME', 'TASK'),
  ('CHECKPOINT_PATH', 'TARGET_CHECKPOINT'),
  ('DRAFT_GIN_FILE', 'DRAFT_MODEL_GIN'),
  ('EVAL_OUTPUT_DIR', 'INFER_OUTPUT_DIR'),
)
# TASK_FEATURE_LENGTHS key -> our alias.
LENGTH_ALIASES = (('inputs', 'MAX_INPUT_LEN'), ('targets', 'MAX_DECODE_LEN'))
RUN_FILE = 'runs/eval.gin'
T5X_RUN_FILES = ('t5x/configs/runs/eval.gin', 't5x/configs/runs/infer.gin')
# `<Configurable>.<field>` of T5X's run files -> the macro it corresponds to.
T5X_PARAMETERS = {
  'DatasetConfig.mixture_or_task_name': 'MIXTURE_OR_TASK_NAME',
  'DatasetConfig.module': 'MIXTURE_OR_TASK_MODULE',
  'DatasetConfig.task_feature_lengths': 'TASK_FEATURE_LENGTHS',
  'DatasetConfig.split': 'SPLIT',
  'DatasetConfig.batch_size': 'BATCH_SIZE',
  'RestoreCheckpointConfig.path': 'CHECKPOINT_PATH',
  'PjitPartitioner.num_partitions': 'NUM_PARTITIONS',
  'PjitPartitioner.model_parallel_submesh': 'MODEL_PARALLEL_SUBMESH',
  'eval_script.evaluate.output_dir': 'EVAL_OUTPUT_DIR',
  'infer_script.infer.output_dir': 'INFER_OUTPUT_DIR',
}
# Configurables of T5X's run files (a binding of any other field of theirs
# has no counterpart here); T5X's run files import their script `__main__`
# as `eval_script` or `infer_script`.
T5X_CONFIGURABLES = frozenset(
  {
    'DatasetConfig',
    'RestoreCheckpointConfig',
    'PjitPartitioner',
    'Evaluator',
    'eval_script.evaluate',
    'infer_script.infer',
  }
)
# Our run files' configurables (module aliases of gin/runs/*.gin).
_OURS = ('spec_eval', 'spec_eval_compare', 'spec_eval_drafters')
_BINDING = re.compile(r'\s*([A-Za-z_][\w./]*)\s*=(.*)\Z', re.DOTALL)
_MACRO_REFERENCE = re.compile(r'%(\w+)\Z')
_MAX_HOPS = 16


def binding_name(binding: str) -> str | None:
  """`NAME` of a `NAME = VALUE` binding (None if it is not one)."""
  m = _BINDING.match(binding)
  return m.group(1) if m else None


def _t5x_key(name: str) -> str | None:
  """`Configurable.field` of a binding of T5X's run configurables."""
  parts = name.split('/')[-1].split('.')
  if len(parts) >= 2 and parts[-2] in T5X_CONFIGURABLES:
    return '.'.join(parts[-2:])
  if len(parts) >= 3 and '.'.join(parts[-3:-1]) in T5X_CONFIGURABLES:
    return '.'.join(parts[-3:])
  return None


def _is_ours(name: str) -> bool:
  return name.split('/')[-1].split('.')[0] in _OURS


def translate(bindings: Sequence[str]) -> list[str]:
  """T5X run-file parameter bindings as our macros (see the docstring).

  Raises:
    gin_cli.GinFlagError: a T5X binding with no counterpart.
  """
  out = []
  for binding in bindings:
    name = binding_name(binding)
    key = _t5x_key(name) if name else None
    if key is None:
      out.append(binding)
    elif key in T5X_PARAMETERS:
      out.append(f'{T5X_PARAMETERS[key]} ={_BINDING.match(binding).group(2)}')
    else:
      raise gin_cli.GinFlagError(
        f'{name}: T5X binding with no counterpart in spec-decode eval '
        f'(which reads {", ".join(sorted(T5X_PARAMETERS))} as macros; '
        'see gin/runs/eval.gin)'
      )
  return out


def file_bindings(
  run_files: Sequence[str], search_paths: Sequence[str]
) -> tuple[list[str], list[str]]:
  """T5X run-parameter bindings inside gin files, as our macros.

  Args:
    run_files: the gin files gin will parse (`split_gin_files`).
    search_paths: where their includes are looked up.

  Returns:
    (macro bindings in file order, the T5X selectors gin must skip).

  Raises:
    gin_cli.GinFlagError: a file binds a T5X run configurable with no
      counterpart (named with the file).
  """
  roots = [*search_paths, paths.CONFIGS_DIR, paths.GIN_DIR, paths.REPO_DIR]
  bindings, skip = [], []
  for name in run_files:
    try:
      path = gin_cli.resolve_file(name, search_paths)
      read = gin_file.read(path, search_paths=roots)
    except (OSError, ValueError):
      continue  # gin parses it and reports what is wrong.
    for binding, value in read.skipped_values.items():
      if _t5x_key(binding) is None:
        continue
      try:
        bindings.extend(translate([f'{binding} = {value}']))
      except gin_cli.GinFlagError as e:
        raise gin_cli.GinFlagError(f'{path}: {e}') from None
      selector = binding.split('/')[-1].rsplit('.', 1)[0]
      if selector not in skip:
        skip.append(selector)
  return bindings, skip


def link_aliases(bindings: Sequence[str]) -> list[str]:
  """`bindings` plus the links that make a command-line binding of either
  name of a pair win, the T5X name first."""
  names = {binding_name(b) for b in bindings}
  links = []
  for t5x, alias in ALIASES:
    if t5x in names:
      links.append(f'{alias} = %{t5x}')
    elif alias in names:
      links.append(f'{t5x} = %{alias}')
  return [*bindings, *links]


def resolved_macro(name: str, default: Any = None) -> Any:
  """The value of macro `name` after the parse, following `%OTHER` links."""
  value = gin_cli.macro(name, default)
  for _ in range(_MAX_HOPS):
    m = _MACRO_REFERENCE.match(repr(value))
    if not m or m.group(1) == 'gin':
      return value
    value = gin_cli.macro(m.group(1), default)
  raise gin_cli.GinFlagError(f'macro {name}: too many %links')


def links_after_parse(bindings: Sequence[str]) -> list[str]:
  """After a parse: bindings that settle what the files left apart.

  * An alias a file set differently from its T5X name (which won) is linked
    to it, so blocks that read either name agree.
  * A command-line MAX_INPUT_LEN or MAX_DECODE_LEN replaces that key of a
    file's TASK_FEATURE_LENGTHS.
  """
  links = []
  for t5x, alias in ALIASES:
    if repr(resolved_macro(t5x)) != repr(resolved_macro(alias)):
      links.append(f'{alias} = %{t5x}')
  names = {binding_name(b) for b in bindings}
  lengths = resolved_macro('TASK_FEATURE_LENGTHS')
  if 'TASK_FEATURE_LENGTHS' in names or not isinstance(lengths, dict):
    return links
  items = {k: repr(v) for k, v in lengths.items()}
  overridden = [
    (key, alias)
    for key, alias in LENGTH_ALIASES
    if alias in names and key in items
  ]
  for key, alias in overridden:
    items[key] = f'%{alias}'
  if overridden:
    text = ', '.join(f'{k!r}: {v}' for k, v in items.items())
    links.append(f'TASK_FEATURE_LENGTHS = {{{text}}}')
  return links


def _is_t5x_run_file(name: str) -> bool:
  return os.path.normpath(name).replace(os.sep, '/').endswith(T5X_RUN_FILES)


def split_gin_files(
  names: Sequence[str], search_paths: Sequence[str]
) -> tuple[list[str], str | None]:
  """(gin files to parse, the target's model gin file or None).

  Raises:
    gin_cli.GinFlagError: a missing file, two model files, or a model file
      that also binds T5X's run configurables (a whole T5X run file: pass
      its model file and its macros instead).
  """
  run_files, model_files = [], []
  for name in names:
    if _is_t5x_run_file(name):
      run_files.append(RUN_FILE)
      continue
    path = gin_cli.resolve_file(name, search_paths)
    # Includes resolve as gin_cli resolves them (configs/, gin/, the repo).
    roots = [*search_paths, paths.CONFIGS_DIR, paths.GIN_DIR, paths.REPO_DIR]
    try:
      model = gin_file.read(path, search_paths=roots)
    except (OSError, ValueError):
      model = None  # Not a model file (gin parses it and reports errors).
    if model is None or not (model.config or gin_model.is_t5gemma(model)):
      run_files.append(name)
      continue
    run_bindings = [b for b in model.skipped if _t5x_key(b)]
    if run_bindings:
      raise gin_cli.GinFlagError(
        f'{name} is a T5X run file (it binds {", ".join(run_bindings)}); '
        "spec-decode eval reads the model gin file and T5X's macros: pass "
        '--gin_file=<model>.gin --gin_file=t5x/configs/runs/eval.gin and '
        'the macros (--gin.MIXTURE_OR_TASK_NAME=..., see gin/runs/eval.gin)'
      )
    ours = [b for b in model.skipped if _is_ours(b)]
    if ours:
      raise gin_cli.GinFlagError(
        f'{name} binds a model '
        f'({", ".join(sorted(model.config) or ["T5GemmaConfig"])}) and run '
        f'settings ({", ".join(ours)}); name the model with '
        'TARGET_MODEL_GIN / DRAFT_GIN_FILE (or its own --gin_file) instead '
        'of including it'
      )
    model_files.append(path)
  if len(model_files) > 1:
    raise gin_cli.GinFlagError(
      f'more than one model gin file: {", ".join(model_files)} (the '
      "target's is --gin_file, the draft's --gin.DRAFT_GIN_FILE)"
    )
  return run_files, (model_files[0] if model_files else None)

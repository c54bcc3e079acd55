"""`spec-decode data`: the offline Debian data and the demo vocabulary.

  spec-decode data build --out_dir data/debian [--fetch] [--lists_dir DIR]
  spec-decode data vocab --data_dir data/debian --output runs/demo/spiece.model
  spec-decode data pack --data_dir data/debian --out .gpu/demo_train.tar.xz

`build` turns apt's English and German package descriptions into the
`ende` and `summarize` TSV splits (`data.debian`); `vocab` trains the demo
sentencepiece vocabulary on their train splits (`data.spm_trainer`);
`pack` compresses the splits a GPU training job needs into one file that
travels with the repository (`data.pack`).
`spec-decode data COMMAND --help` gives a command's flags.
"""

import argparse
import importlib
import sys

# Command -> (module with `main(argv) -> int`, one line of help). Imported
# only when run: `build` needs no sentencepiece.
COMMANDS = {
  'build': (
    'spec_decode.data.build_cli',
    'build the EnDe translation and summarization splits from Debian '
    'package descriptions',
  ),
  'vocab': (
    'spec_decode.data.spm_trainer',
    'train the demo sentencepiece vocabulary on the Debian train splits',
  ),
  'pack': (
    'spec_decode.data.pack',
    'pack the train and validation splits into one .tar.xz for a GPU job',
  ),
}


def main(argv: list[str] | None = None) -> int:
  """Runs `spec-decode data COMMAND ...`; returns the exit code."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] in COMMANDS:
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)
  parser = argparse.ArgumentParser(
    prog='spec-decode data',
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  commands = parser.add_subparsers(
    title='commands', dest='command', metavar='COMMAND', required=True
  )
  for name, (_, text) in COMMANDS.items():
    commands.add_parser(name, help=text, add_help=False)
  parser.parse_args(argv)  # --help, or an error that names the commands.
  return 2

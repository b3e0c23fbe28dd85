"""The `pyspec` command line.

- `main`: the entry point and the parser, which registers every command;
- one module per command (`generate`, `demo`, `bench`, `calibrate`, `distill`, `train_head`,
  `models`, `data`, `ngram`, `serve`), each with `register(subparsers)`;
- `options`: the options and helpers several commands share.

Commands import the library and `options`; nothing imports `main` but the entry point. The
library (everything outside this package) never imports the command line.
"""

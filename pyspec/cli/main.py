"""`pyspec`: the parser of every command, and the entry point."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from ..errors import SpecError
from . import bench, calibrate, data, demo, distill, generate, models, ngram, rpc_server, serve, train_head

# Each command is a module of this package with register(subparsers); commands import the library
# and .options, never this module. In `pyspec --help` order:
COMMANDS = (generate, demo, bench, calibrate, distill, train_head, models, data, ngram, serve, rpc_server)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyspec", description="Exact speculative decoding for GGUF models.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: llama.cpp debug)")
    sub = parser.add_subparsers(dest="command", required=True)

    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else (logging.INFO if args.verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose < 2:
        # Errors from llama.cpp reach the user inside the exception message; do not print them twice.
        logging.getLogger("pyspec.llama").setLevel(logging.CRITICAL if args.verbose == 0 else logging.WARNING)
    try:
        return int(args.handler(args) or 0)
    except (SpecError, FileNotFoundError, ValueError, OSError) as exc:
        print(f"pyspec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

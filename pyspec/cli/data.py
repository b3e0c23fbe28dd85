"""`pyspec data`: the benchmark prompt sets (pyspec.data)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..data import SUITES, load_suite
from ..fetch import Cache
from ..models import Registry



def _cmd_list(args: argparse.Namespace) -> int:
    registry, cache = Registry.load(), Cache.default()
    for suite in SUITES.values():
        part = registry.datasets[suite.dataset]
        path = cache.data / suite.dataset / Path(part.member).name
        state = "cached" if path.is_file() and path.stat().st_size == part.size else "-"
        print(f"{suite.name:10s} {state:6s} {part.requirement:40s} {suite.description}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    prompts = load_suite(args.suite, args.n)
    for p in prompts:
        print(f"=== {p.id}")
        print(json.dumps(p.messages, indent=2, ensure_ascii=False) if args.chat else p.text)
    print(f"({len(prompts)} prompt(s) from {args.suite})", file=sys.stderr)
    return 0


def register(subparsers: Any) -> None:
    """Add ``data {list,show}``; each leaf sets ``args.handler(args) -> exit code``."""
    p = subparsers.add_parser("data", help="benchmark prompt sets: list, show")
    sub = p.add_subparsers(dest="data_command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="list prompt suites").set_defaults(handler=_cmd_list)
    sp = sub.add_parser("show", help="print the first N prompts of SUITE")
    sp.add_argument("suite", metavar="SUITE", choices=list(SUITES))
    sp.add_argument("n", metavar="N", type=int, nargs="?", default=3)
    sp.add_argument("--chat", action="store_true", help="print chat messages instead of raw text")
    sp.set_defaults(handler=_cmd_show)

"""`pyspec models`: the offline model registry (pyspec.models)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..fetch import Cache
from ..models import Registry, derive_draft, fetch_model, resolve_model, verify_model



def _format_size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _cmd_list(args: argparse.Namespace) -> int:
    registry, cache = Registry.load(), Cache.default()
    for entry in registry.models.values():
        path = cache.model_path(entry.name)
        state = "cached" if path.is_file() and path.stat().st_size == entry.size else "-"
        draft = f"  draft: {entry.draft}" if entry.draft else ""
        print(f"{entry.name:32s} {entry.quant:7s} {_format_size(entry.size):>12s} "
              f"{len(entry.parts):3d} part(s)  {state:6s} {entry.description}{draft}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    path = fetch_model(args.name)
    print(f"{args.name}: ok in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(path)
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    print(resolve_model(args.name))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    result = verify_model(args.name)
    print(f"{result.name}: {result.reason} ({result.path})")
    return 0 if result.ok else 1


def _cmd_derive(args: argparse.Namespace) -> int:
    print(derive_draft(args.source, args.layers, args.out))
    return 0


def register(subparsers: Any) -> None:
    """Add ``models {list,fetch,path,verify,derive-draft}``.

    Each leaf sets ``args.handler(args) -> exit code``; errors propagate as SpecError (unknown
    name, fetch failure), FileNotFoundError or ValueError for the caller to report.
    """
    p = subparsers.add_parser("models", help="offline model registry: list, fetch, verify, derive")
    sub = p.add_subparsers(dest="models_command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="list registry models").set_defaults(handler=_cmd_list)
    for name, handler, text in (
        ("fetch", _cmd_fetch, "download, assemble and verify NAME (prints its path last)"),
        ("path", _cmd_path, "print the local path of NAME, fetching it if needed"),
        ("verify", _cmd_verify, "hash the cached file of NAME against the registry"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("name", metavar="NAME")
        sp.set_defaults(handler=handler)
    sp = sub.add_parser("derive-draft", help="keep the first N blocks of a model as a draft GGUF")
    sp.add_argument("--from", dest="source", required=True, metavar="NAME",
                    help="registry name or GGUF path")
    sp.add_argument("--layers", type=int, required=True, metavar="N")
    sp.add_argument("--out", required=True, metavar="PATH")
    sp.set_defaults(handler=_cmd_derive)

"""`pyspec demo`: the main job (pyspec.demo)."""

from __future__ import annotations

import argparse
from typing import Any

from ..config import DEFAULT_DRAFT, DEFAULT_TARGET
from ..demo import run_demo
from .options import add_engine_options, engine_options



def _cmd_demo(args: argparse.Namespace) -> int:
    methods = args.methods.split(",") if args.methods else None
    runs = run_demo(
        args.target, args.draft, methods=methods, prompt_index=args.prompt_index, max_tokens=args.max_tokens,
        n_draft=args.n_draft, n_threads=args.threads, **engine_options(args),
    )
    return 0 if all(r.tokens == runs[0].tokens for r in runs) else 2


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="the main job: plain vs speculative decoding on real models")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"registry name or GGUF path (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"registry name or GGUF path (default {DEFAULT_DRAFT})")
    p.add_argument("--methods", default=None, help="comma-separated speculative methods (default: all available)")
    p.add_argument("--prompt-index", type=int, default=0, help="HumanEval prompt to use (default 0)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--n-draft", type=int, default=None, help="draft length (default: chain 4, lookup 8)")
    p.add_argument("--threads", type=int, default=None)
    add_engine_options(p)
    p.set_defaults(handler=_cmd_demo)

"""`pyspec ngram`: static n-gram tables for method auto (pyspec.ngram)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Iterable

from ..ngram import DEFAULT_MAX_CHARS, DEFAULT_MIN_TOTAL, build_table, default_table_path, sharegpt_answers



def _cmd_build(args: argparse.Namespace) -> int:
    from ..engine import Engine
    from ..models import resolve_model

    with Engine(resolve_model(args.target), n_ctx=256, n_batch=64, n_threads=args.threads, prefix_cache=False,
                head=False) as engine:
        if args.text:
            texts: Iterable[str] = (Path(p).read_text(encoding="utf-8") for p in args.text)
        else:
            texts = sharegpt_answers(args.max_chars)
        out = Path(args.out) if args.out else default_table_path(engine)
        path = build_table(engine, texts, out, min_total=args.min_total, progress=not args.no_progress)
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def register(subparsers: Any) -> None:
    """Add ``ngram build``; each leaf sets ``args.handler(args) -> exit code``."""
    from ..config import DEFAULT_TARGET

    p = subparsers.add_parser("ngram", help="static n-gram tables for method auto: build")
    sub = p.add_subparsers(dest="ngram_command", required=True, metavar="COMMAND")
    b = sub.add_parser("build", help="build a table from ShareGPT answers (default) or text files")
    b.add_argument("--target", default=DEFAULT_TARGET, help=f"registry name or GGUF path whose vocabulary the table uses "
                   f"(default {DEFAULT_TARGET}; any model with the same tokenizer can use the table)")
    b.add_argument("--text", action="append", metavar="FILE",
                   help="a UTF-8 text file to count instead of ShareGPT (repeatable)")
    b.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS,
                   help=f"characters of ShareGPT answers to read (default {DEFAULT_MAX_CHARS:,})")
    b.add_argument("--min-total", type=int, default=DEFAULT_MIN_TOTAL,
                   help=f"keep contexts seen at least this often (default {DEFAULT_MIN_TOTAL})")
    b.add_argument("--out", help="output file (default: the cache, where Engine(ngram='default') finds it)")
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(handler=_cmd_build)

"""`pyspec rpc-server`: run llama.cpp's RPC server, which lends this machine to another's target
(pyspec.rpc)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def _cmd_rpc_server(args: argparse.Namespace) -> int:
    from ..rpc import DEFAULT_PORT, RpcServerError, build_rpc_server, find_rpc_server

    try:
        server = find_rpc_server()
    except RpcServerError:
        if not args.build:
            raise
        print("pyspec rpc-server: building llama.cpp's ggml-rpc-server (once, a few minutes)...", file=sys.stderr)
        server = build_rpc_server(jobs=args.jobs)
    if args.build_only:
        print(server)
        return 0
    if args.host not in ("127.0.0.1", "localhost"):
        print(f"pyspec rpc-server: listening on {args.host}: llama.cpp's RPC protocol has no authentication, "
              "so only expose it on a network you trust", file=sys.stderr)
    argv = [str(server), "-H", args.host, "-p", str(args.port or DEFAULT_PORT)]
    if args.threads:
        argv += ["-t", str(args.threads)]
    if args.cache:
        argv.append("-c")
    os.execv(argv[0], argv)  # the server takes over this process (Ctrl-C stops it)
    return 0  # not reached


def register(subparsers: Any) -> None:
    """Add ``rpc-server``; sets ``args.handler(args) -> exit code``."""
    p = subparsers.add_parser(
        "rpc-server", help="lend this machine to another's target: run llama.cpp's RPC server",
        description="Runs llama.cpp's ggml-rpc-server (the same llama.cpp as pyspec's engine), so that an engine "
                    "on another machine can put its target's layers here with --rpc HOST:PORT. Built from the "
                    "pinned llama.cpp source on first use with --build (needs cmake and a C++ compiler).")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=None, help="port to listen on (default 50052)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the server (default: its own)")
    p.add_argument("--cache", action="store_true", help="let the server cache received tensors on disk (-c)")
    p.add_argument("--build", action="store_true", help="build the server first when it is not built yet")
    p.add_argument("--build-only", action="store_true", help="build (with --build) or find the server, print its path")
    p.add_argument("--jobs", "-j", type=int, default=None, help="parallel compile jobs for --build (default: all cores)")
    p.set_defaults(handler=_cmd_rpc_server)

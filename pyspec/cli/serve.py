"""`pyspec serve`: the command line of the OpenAI-compatible server (pyspec.server). This module
imports neither FastAPI nor uvicorn, so `pyspec` works without the server extra."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from .options import add_engine_options, add_ngram_option, add_rpc_option, engine_options
from ..config import METHODS, SERVER_TEMPERATURE, GenerationConfig
from ..online.config import TRAIN_BLOCKS_HELP, DistillConfig  # no torch: plain settings

if TYPE_CHECKING:
    from ..server.online import OnlineSettings


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a target (and draft) over an OpenAI-compatible HTTP API",
                       description="An OpenAI-compatible server: POST /v1/chat/completions and /v1/completions "
                                   "(streamed or not), GET /v1/models, /health, /metrics, POST /tokenize, "
                                   "/detokenize, /apply-template. Requests run one at a time in arrival order. "
                                   "Needs: pip install 'pyspec-engine[server]'. docs/server.md describes it all.")
    p.add_argument("--target", required=True, help="GGUF path or registry name")
    p.add_argument("--draft", default=None, help="GGUF path or registry name of the draft model")
    p.add_argument("--head", default=None, metavar="PATH",
                   help="draft head GGUF (pyspec train-head) for methods redrafter, eagle and auto (default: the head "
                        "pyspec train-head wrote for this target, if any); with --online and no --draft, the head is "
                        "what learns from the traffic")
    p.add_argument("--no-head", action="store_true", help="no draft head, not even the one known for the target")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default=None,
                   help="the model id responses carry and /v1/models lists first (default: the target's file name "
                        "without .gguf); requests may name any model, the one model serves them all")
    p.add_argument("--model-alias", action="append", default=[], metavar="NAME",
                   help="another name /v1/models lists for the model (repeat for several)")
    p.add_argument("--strict", action="store_true",
                   help="refuse (400) request fields this server does not know, and (404) model names other than "
                        "--model-name and the aliases; by default both are accepted and unknown fields ignored")
    p.add_argument("--chat-template", default=None, metavar="FILE|NAME",
                   help="format chat requests with this Jinja template file, or this llama.cpp built-in template "
                        "(chatml, llama3, ...) instead of the model's own template")
    p.add_argument("--n-ctx", type=int, default=4096, help="context window in tokens (default 4096)")
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--n-gpu-layers", type=int, default=None,
                   help="layers to offload, -1 all (GPU builds only; default $PYSPEC_N_GPU_LAYERS, else 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the engine's random stream")
    add_engine_options(p)
    add_rpc_option(p)
    add_ngram_option(p)
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="evaluate every prompt from scratch instead of reusing the KV cache of the longest "
                        "common prefix with the previous request")
    d = GenerationConfig()
    g = p.add_argument_group("request defaults (each request may override them)")
    g.add_argument("--method", choices=list(METHODS), default="auto", help="decoding method (default auto)")
    g.add_argument("--n-draft", type=int, default=None, help="longest draft per step (chain, lookup, ouroboros)")
    g.add_argument("--temperature", type=float, default=SERVER_TEMPERATURE,
                   help=f"default {SERVER_TEMPERATURE:g} (OpenAI's; the Python API and `pyspec generate` are greedy); 0 = greedy")
    g.add_argument("--top-p", type=float, default=d.top_p)
    g.add_argument("--top-k", type=int, default=d.top_k, help="0 disables")
    g.add_argument("--min-p", type=float, default=d.min_p)
    pool = p.add_argument_group("phrase pool")
    pool.add_argument("--pool-file", default=None,
                      help="keep the phrase pool in this file across restarts (loaded at start, saved atomically "
                           "every --pool-save-interval seconds when it changed and at shutdown; an unreadable "
                           "file is moved aside and the server starts with an empty pool)")
    pool.add_argument("--pool-save-interval", type=_seconds, default=60.0, help="seconds between saves (default 60)")
    pool.add_argument("--pool-capacity", type=_phrase_count, default=None,
                      help="phrases the pool keeps at most, the least recently useful evicted beyond it (default "
                           "65536, at most about 13 MB when full: the server's memory grows by up to that much "
                           "while the pool fills)")
    p.add_argument("--stats-file", default=None, metavar="PATH",
                   help="keep method auto's acceptance statistics in this file across restarts (loaded at start, "
                        "saved every --stats-save-interval seconds when requests ran and at shutdown; an unusable "
                        "file is moved aside and auto starts afresh)")
    p.add_argument("--stats-save-interval", type=_seconds, default=60.0, metavar="S",
                   help="seconds between saves of --stats-file (default 60)")
    ops = p.add_argument_group("access and load")
    ops.add_argument("--api-key", default=None, metavar="KEY",
                     help="require 'Authorization: Bearer KEY' on every request but GET /health (default: "
                          "$PYSPEC_API_KEY, else no key)")
    ops.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                     help="allow browser requests from this origin (repeat for several; '*' for any)")
    ops.add_argument("--max-queue", type=_count, default=64, metavar="N",
                     help="requests that may wait besides the running one; more get 503 with Retry-After "
                          "(default 64)")
    ops.add_argument("--max-body-bytes", type=_count, default=8 * 1024 * 1024, metavar="N",
                     help="largest request body; larger ones get 413 (default 8 MiB)")
    ops.add_argument("--max-tokens-default", type=_count, default=2048, metavar="N",
                     help="max_tokens of a request that sets none (default 2048; a request's own max_tokens may "
                          "go up to the context)")
    ops.add_argument("--sse-keepalive", type=_seconds, default=10.0, metavar="S",
                     help="a stream waiting in the queue gets a keep-alive comment every S seconds (default 10)")
    ops.add_argument("--shutdown-timeout", type=_seconds, default=30.0, metavar="S",
                     help="longest shutdown: generations stopped, pool and statistics saved, distiller and engine "
                          "closed, each wait bounded by what is left of S (default 30)")
    online = p.add_argument_group("online distillation (needs the train extra: PyTorch)")
    online.add_argument("--online", action="store_true",
                        help="distil the draft from the served traffic and hot-reload it (pyspec.online)")
    online.add_argument("--online-interval", type=int, default=32, help="requests between draft updates (default 32)")
    online.add_argument("--online-buffer", type=int, default=4096, help="training positions buffered (default 4096)")
    online.add_argument("--online-lr", type=float, default=1e-4)
    online.add_argument("--online-train-threads", type=int, default=1, help="PyTorch threads while training")
    online.add_argument("--online-train-vocab", action=argparse.BooleanOptionalAction,
                        default=DistillConfig.train_vocab,
                        help="train the draft's embedding and output matrices too (--no-online-train-vocab "
                             "freezes them: less memory and time per update)")
    online.add_argument("--online-train-blocks", type=int, default=DistillConfig.train_blocks, metavar="N",
                        help=TRAIN_BLOCKS_HELP)
    online.add_argument("--online-work-dir", default=None, help="where trained drafts are written (default: temporary)")
    p.set_defaults(handler=_cmd_serve)


def _phrase_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of phrases, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"the pool holds at least 1 phrase, got {value}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"the interval must be a finite number of seconds > 0, got {text}")
    return value


def online_settings(args: argparse.Namespace) -> OnlineSettings | None:
    """The --online-* flags as OnlineSettings; None without --online."""
    from ..server.online import OnlineSettings

    if not args.online:
        return None
    return OnlineSettings(update_interval=args.online_interval, buffer_limit=args.online_buffer, lr=args.online_lr,
                          train_threads=args.online_train_threads, train_vocab=args.online_train_vocab,
                          train_blocks=args.online_train_blocks, work_dir=args.online_work_dir)


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..server import ServerSettings, begin_shutdown, create_app
    except ImportError as exc:
        print(f"pyspec: error: {exc}", file=sys.stderr)
        return 1
    defaults = GenerationConfig(method=args.method, n_draft=args.n_draft, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, min_p=args.min_p)
    online = online_settings(args)
    settings = ServerSettings(
        target=args.target, draft=args.draft, head=False if args.no_head else args.head,
        model_name=args.model_name, n_ctx=args.n_ctx, n_batch=args.n_batch,
        n_threads=args.threads, n_gpu_layers=args.n_gpu_layers, rpc=args.rpc, seed=args.seed,
        prefix_cache=not args.no_prefix_cache, pool_capacity=args.pool_capacity, defaults=defaults,
        pool_file=args.pool_file, stats_file=args.stats_file, stats_save_interval_s=args.stats_save_interval,
        pool_save_interval_s=args.pool_save_interval, online=online, ngram=args.ngram,
        model_aliases=tuple(args.model_alias), strict=args.strict, chat_template=args.chat_template,
        api_key=args.api_key or os.environ.get("PYSPEC_API_KEY") or None, cors_origins=tuple(args.cors_origin),
        max_queue=args.max_queue, max_body_bytes=args.max_body_bytes, max_tokens_default=args.max_tokens_default,
        keepalive_s=args.sse_keepalive, shutdown_timeout_s=args.shutdown_timeout, **engine_options(args),
    )
    level = logging.getLogger().getEffectiveLevel()
    logging.getLogger("pyspec").setLevel(min(level, logging.INFO))  # startup, pool and update lines
    if settings.api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("pyspec.server").warning(
            "listening on %s without --api-key: anyone who can reach this address can use the server", args.host)
    app = create_app(settings)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            begin_shutdown(app)  # generations stop now, so open streams end before the connections are waited for
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning",
                            timeout_graceful_shutdown=5)
    server = Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, once the shutdown is done
        pass
    return 0 if server.started else 3  # 3: uvicorn's exit status for a failed start

"""`pyspec bench`: decoding methods and peers side by side (pyspec.bench)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

from ..bench import SETTLE_S, available_methods, format_markdown, plot, run_bench, write_json
from ..config import DEFAULT_DRAFT, DEFAULT_TARGET, GenerationConfig
from .options import add_engine_options, add_ngram_option, engine_options



def _cmd_bench(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # fail before the long run
        print("pyspec: error: --plot needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 1
    report = run_bench(
        args.target, args.draft, args.prompt or args.suite, n=args.n, max_tokens=args.max_tokens, methods=args.methods,
        n_draft=args.n_draft, n_threads=args.threads, n_ctx=args.n_ctx, progress=not args.no_progress,
        llama_cpp_bin=args.llama_cpp_bin, n_gpu_layers=args.n_gpu_layers, head=args.head, ngram=args.ngram,
        settle_s=args.settle, repeats=args.repeats, temperature=args.temperature, seed=args.seed,
        **engine_options(args),
    )
    for method, why in report.skipped.items():
        print(f"pyspec bench: skipped {method}: {why}", file=sys.stderr)
    print(format_markdown(report))
    if args.json:
        write_json(report, args.json)
    if args.plot:
        plot(report, args.plot)
    return 0


def register(subparsers: Any) -> None:
    from ..data import SUITES

    p = subparsers.add_parser("bench", help="benchmark decoding methods and peers (llama-cpp-python, llama.cpp's "
                                            "own tools) side by side")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"registry name or GGUF path (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"registry name or GGUF path (default {DEFAULT_DRAFT})")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--suite", default="humaneval",
                     help=f"prompt suite: {', '.join(SUITES)}; SUITE[A:B] takes prompts A..B-1 (e.g. prompts "
                          f"no draft head was trained on)")
    src.add_argument("--prompt", action="append", default=None,
                     help="a prompt (one user message) instead of a suite; repeatable")
    p.add_argument("--n", type=int, default=None,
                   help="prompts from the suite (default 5; with SUITE[A:B], all B-A of the slice)")
    p.add_argument("--max-tokens", type=int, default=128, help="most new tokens per prompt (default 128)")
    p.add_argument("--methods", default="none,auto,chain,lookup,peer-pld",
                   help="comma-separated; chain, lookup, ouroboros, peer-pld and llama.cpp-draft take an optional "
                        ":K draft length, tree:N a node budget, beam:KxL beams x length; available: "
                        f"{', '.join(available_methods())} (default none,auto,chain,lookup,peer-pld)")
    p.add_argument("--n-draft", type=int, default=None,
                   help="draft length for pyspec methods and peer-pld without :K (default: chain 4, lookup 8, "
                        "peer-pld 10)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every method (default: all cores)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context size for every method (default 4096)")
    p.add_argument("--n-gpu-layers", type=int, default=None,
                   help="layers to offload for every method, -1 all (GPU builds only; default "
                        "$PYSPEC_N_GPU_LAYERS, else 0)")
    add_engine_options(p)  # the tools follow: repacking where their build allows it, glibc's huge pages
    add_ngram_option(p)
    p.add_argument("--llama-cpp-bin", default=None, metavar="DIR",
                   help="directory of llama.cpp's llama-completion and llama-speculative-simple (default: "
                        "$PYSPEC_LLAMA_CPP_BIN, else those built by benchmarks/build_llama_cpp.py)")
    p.add_argument("--settle", type=float, default=None, metavar="SECONDS",
                   help=f"pause before each run, of every method alike (default {SETTLE_S:g} s when llama.cpp's "
                        "tools run, else 0: a tool process that exits slows what runs about 2 s later)")
    p.add_argument("--repeats", type=int, default=1, metavar="R",
                   help="runs of every method per prompt, interleaved; the run with the median decode tok/s is "
                        "kept (default 1; 3 damps the noise that favours 'the best llama.cpp mode of each prompt')")
    p.add_argument("--temperature", type=float, default=GenerationConfig.temperature, metavar="T",
                   help="sample at temperature T, every method and peer alike (top-k, top-p, min-p off; default 0: "
                        "greedy, with each output checked against none's)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="with --temperature: seed every run with S (reproducible outputs; auto then leaves the draft "
                        "model out, as for any seeded sampled request); default: each run its own random stream")
    p.add_argument("--head", default=None, metavar="PATH",
                   help="draft head GGUF (`pyspec train-head`) for methods redrafter and eagle and for auto to weigh "
                        "(auto:no-head leaves it out)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.add_argument("--plot", default=None, metavar="PATH", help="also write a PNG bar chart (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=_cmd_bench)

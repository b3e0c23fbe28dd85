"""The `pyspec` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from .errors import SpecError


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 disables")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--n-draft", type=int, default=None, help="longest draft per step (default: chain 4, lookup 8)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--n-gpu-layers", type=int, default=None,
                   help="layers to offload, -1 all (GPU builds only; default $PYSPEC_N_GPU_LAYERS, else 0)")


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """--repack, --no-huge-pages and --flash-attn (Engine's repack, huge_pages and flash_attn),
    for generate, calibrate, bench, serve, demo, distill and train-head: the commands whose speed
    they change."""
    from .engine import REPACK_MODES

    p.add_argument("--repack", choices=["auto", *REPACK_MODES], default="auto",
                   help="llama.cpp's weight repacking for the CPU: all extra buffer types, the matmul weights "
                        "alone, or none (default auto: weights on CPUs with AMX, all elsewhere)")
    p.add_argument("--no-huge-pages", action="store_true",
                   help="do not ask for transparent huge pages on the models' and contexts' buffers")
    p.add_argument("--flash-attn", action="store_true",
                   help="llama.cpp's flash attention (default off: slower on the CPU at long contexts; "
                        "see docs/numerics.md)")


def add_ngram_option(p: argparse.ArgumentParser) -> None:
    """--ngram: Engine's ngram (a static n-gram table method auto also drafts from)."""
    p.add_argument("--ngram", default=None, metavar="PATH",
                   help="n-gram table for method auto (`pyspec ngram build`); 'default': the ShareGPT table in the "
                        "cache, built first when missing (about 2 minutes)")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """Engine keyword arguments from add_engine_options' flags."""
    return {"repack": None if args.repack == "auto" else args.repack, "huge_pages": not args.no_huge_pages,
            "flash_attn": args.flash_attn}


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return str(args.prompt)
    if args.prompt_file == "-":
        return sys.stdin.read()
    with open(args.prompt_file, encoding="utf-8") as f:
        return f.read()


def _stats_path(args: argparse.Namespace, engine: Any) -> Path | None:
    """The acceptance statistics file a command keeps for method auto (--stats-file), loaded
    now; None when off (the default) or the method is not auto. A missing file starts fresh; a
    bad cached file ('default') is reported and replaced; a bad file the user named is an error."""
    from . import acceptance
    from .errors import StatsFileError

    if args.stats_file is None or args.method != "auto":
        return None
    default = args.stats_file == "default"
    path = acceptance.default_path(engine) if default else Path(args.stats_file).expanduser()
    if path.exists():
        try:
            n = engine.load_stats(path)
            logging.getLogger("pyspec").info("auto's acceptance statistics: %d sets loaded from %s", n, path)
        except StatsFileError as exc:
            if not default:
                raise
            print(f"pyspec: ignoring the cached acceptance statistics ({exc}); starting afresh, the file will "
                  "be replaced", file=sys.stderr)
    return path


def add_stats_option(p: argparse.ArgumentParser) -> None:
    """--stats-file: method auto's acceptance statistics kept across runs (pyspec.acceptance)."""
    p.add_argument("--stats-file", default=None, metavar="PATH",
                   help="keep what method auto learnt of its drafts' acceptance across runs in PATH ('default': a "
                        "file per target model in the cache): loaded before, saved after. Faster on requests "
                        "like the earlier ones, slower on the first of another kind; off by default")


def _cmd_generate(args: argparse.Namespace) -> int:
    from .engine import Engine

    prompt_text = _read_prompt(args)
    with Engine(args.target, draft=args.draft, n_ctx=args.n_ctx, n_threads=args.threads,
                n_gpu_layers=args.n_gpu_layers, head=args.head, ngram=args.ngram, **engine_options(args)) as engine:
        stats_path = _stats_path(args, engine)
        prompt: Any = [{"role": "user", "content": prompt_text}] if args.chat else prompt_text
        kwargs = dict(
            max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            min_p=args.min_p, stop=args.stop, method=args.method, n_draft=args.n_draft, seed=args.seed,
            lookup_ngram_max=args.lookup_ngram_max, lookup_ngram_min=args.lookup_ngram_min,
            tree_nodes=args.tree_nodes, tree_depth=args.tree_depth, tree_branching=args.tree_branching,
            tree_expand=args.tree_expand, beams=args.beams, beam_length=args.beam_length,
            acceptance=args.acceptance, typical_epsilon=args.typical_epsilon, typical_delta=args.typical_delta,
            auto_max_depth=args.auto_max_depth, auto_max_nodes=args.auto_max_nodes,
            auto_max_gamma=args.auto_max_gamma, auto_draft_model=not args.auto_no_draft_model,
            auto_head=not args.auto_no_head,
        )
        if args.json:
            result = engine.generate(prompt, **kwargs)
            if stats_path is not None:
                engine.save_stats(stats_path)
            print(json.dumps(result.to_dict(), ensure_ascii=False))
            return 0
        stream = engine.stream(prompt, **kwargs)
        for piece in stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
        result = stream.result
        assert result is not None
        if stats_path is not None:
            engine.save_stats(stats_path)
        s = result.stats
        print(file=sys.stdout)
        print(
            f"[{result.method}] {s.n_generated} tokens, {s.tokens_per_second:.1f} tok/s, "
            f"acceptance {s.acceptance_rate:.2f}, {s.tokens_per_target_call:.2f} tokens/target call, "
            f"finish: {result.finish_reason}",
            file=sys.stderr,
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyspec", description="Exact speculative decoding for GGUF models.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: llama.cpp debug)")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text with a target (and draft) model")
    gen.add_argument("--target", required=True, help="GGUF path or registry name")
    gen.add_argument("--draft", default=None, help="GGUF path or registry name of the draft model")
    gen.add_argument("--head", default=None, help="draft head GGUF for method redrafter (pyspec train-head)")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file with the prompt text ('-' for stdin)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    from .config import METHODS, GenerationConfig

    d = GenerationConfig()
    gen.add_argument("--method", choices=list(METHODS), default="auto",
                     help="decoding method: auto (default: per step what pays on this machine, from the cost "
                          "curves of `pyspec calibrate`), chain (draft model chain), tree (draft model token "
                          "tree), beam (draft model beam search), lookup (prompt lookup + phrase pool, no draft "
                          "model), ouroboros (draft model + phrase pool), redrafter (beam search over a draft "
                          "head, --head) or none (plain decoding)")
    gen.add_argument("--auto-max-depth", type=int, default=d.auto_max_depth,
                     help=f"auto: longest lookup/pool path considered (default {d.auto_max_depth})")
    gen.add_argument("--auto-max-nodes", type=int, default=d.auto_max_nodes,
                     help=f"auto: lookup/pool nodes considered per step (default {d.auto_max_nodes})")
    gen.add_argument("--auto-max-gamma", type=int, default=d.auto_max_gamma,
                     help=f"auto: longest draft-model chain considered (default {d.auto_max_gamma})")
    gen.add_argument("--auto-no-draft-model", action="store_true",
                     help="auto: never draft with the draft model (lookup, pool and plain decoding only)")
    gen.add_argument("--auto-no-head", action="store_true", help="auto: never draft with the draft head (--head)")
    gen.add_argument("--tree-nodes", type=int, default=d.tree_nodes, help=f"tree: node budget (default {d.tree_nodes})")
    gen.add_argument("--tree-depth", type=int, default=d.tree_depth, help=f"tree: longest path (default {d.tree_depth})")
    gen.add_argument("--tree-branching", type=int, default=d.tree_branching,
                     help=f"tree: children per expanded node (default {d.tree_branching})")
    gen.add_argument("--tree-expand", type=int, default=d.tree_expand,
                     help=f"tree: frontier nodes expanded per draft decode (default {d.tree_expand})")
    gen.add_argument("--beams", type=int, default=d.beams,
                     help=f"beam, redrafter: number of beams K (default {d.beams})")
    gen.add_argument("--beam-length", type=int, default=d.beam_length,
                     help=f"beam, redrafter: beam length L (default {d.beam_length})")
    gen.add_argument("--acceptance", choices=["exact", "typical"], default=d.acceptance,
                     help="sampled verification: exact (default) or typical (Medusa; LOSSY, not the target's distribution)")
    gen.add_argument("--typical-epsilon", type=float, default=d.typical_epsilon)
    gen.add_argument("--typical-delta", type=float, default=d.typical_delta)
    gen.add_argument("--lookup-ngram-max", type=int, default=3,
                     help="lookup: longest n-gram matched against earlier text (default 3)")
    gen.add_argument("--lookup-ngram-min", type=int, default=1,
                     help="lookup: shortest n-gram tried before proposing nothing (default 1)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, tokens, finish_reason, stats")
    _add_generation_args(gen)
    add_engine_options(gen)
    add_ngram_option(gen)
    add_stats_option(gen)
    gen.set_defaults(handler=_cmd_generate)

    from . import bench, calibration, demo, data, distill, models, ngram, serve
    from .head import cli as head_cli

    demo.register_cli(sub)
    bench.register_cli(sub)
    calibration.register_cli(sub)
    distill.register_cli(sub)
    head_cli.register_cli(sub)
    models.register_cli(sub)
    data.register_cli(sub)
    ngram.register_cli(sub)
    serve.register_cli(sub)
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

"""Options shared by several `pyspec` commands, and the helpers that read them back."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any


def add_generation_options(p: argparse.ArgumentParser) -> None:
    from ..config import DEFAULT_N_DRAFT, GenerationConfig

    d = GenerationConfig()  # the one source of generation defaults
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help=f"most tokens to generate (default {d.max_tokens})")
    p.add_argument("--temperature", type=float, default=d.temperature, help=f"0 = greedy (default {d.temperature:g})")
    p.add_argument("--top-k", type=int, default=d.top_k, help="0 disables")
    p.add_argument("--top-p", type=float, default=d.top_p)
    p.add_argument("--min-p", type=float, default=d.min_p)
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--presence-penalty", type=float, default=d.presence_penalty,
                   help="subtracted from the logit of every token the output holds, in [-2, 2] (OpenAI's; default 0)")
    p.add_argument("--frequency-penalty", type=float, default=d.frequency_penalty,
                   help="subtracted times the token's count in the output, in [-2, 2] (OpenAI's; default 0)")
    p.add_argument("--repetition-penalty", type=float, default=d.repetition_penalty,
                   help="positive logits of tokens in the prompt or output divided by it, negative ones multiplied, "
                        "in (0, 10] (CTRL's; default 1: off)")
    p.add_argument("--logit-bias", action="append", default=None, type=logit_bias_item, metavar="TOKEN=BIAS",
                   help="add BIAS (in [-100, 100]) to token id TOKEN's logit (repeatable)")
    p.add_argument("--n-draft", type=int, default=d.n_draft,
                   help="longest draft per step (default: " + ", ".join(f"{m} {n}" for m, n in DEFAULT_N_DRAFT.items()) + ")")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--n-gpu-layers", type=int, default=None,
                   help="layers to offload, -1 all (GPU builds only; default $PYSPEC_N_GPU_LAYERS, else 0)")


def logit_bias_item(text: str) -> tuple[int, float]:
    """--logit-bias's TOKEN=BIAS: a token id and the bias added to its logit."""
    token, sep, bias = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected TOKEN=BIAS with an integer token id and a number, got {text!r}") from None


def penalty_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """GenerationConfig's penalty fields from add_generation_options' flags (a repeated token: the
    last bias given)."""
    return dict(presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                repetition_penalty=args.repetition_penalty,
                logit_bias=dict(args.logit_bias) if args.logit_bias else None)


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """--repack, --no-huge-pages and --flash-attn (Engine's repack, huge_pages and flash_attn),
    for generate, calibrate, bench, serve, demo, distill and train-head: the commands whose speed
    they change."""
    from ..engine import REPACK_MODES

    p.add_argument("--repack", choices=["auto", *REPACK_MODES], default="auto",
                   help="llama.cpp's weight repacking for the CPU: all extra buffer types, the matmul weights "
                        "alone, or none (default auto: weights on CPUs with AMX, all elsewhere)")
    p.add_argument("--no-huge-pages", action="store_true",
                   help="do not ask for transparent huge pages on the models' and contexts' buffers")
    p.add_argument("--flash-attn", nargs="?", const="on", default=None, choices=["auto", "on", "off"],
                   help="llama.cpp's flash attention: auto decides by measurement once per model, window and "
                        "machine (cached), on / off force it; --flash-attn alone is on (default: auto, or "
                        "$PYSPEC_FLASH_ATTN; docs/cost-curves.md)")


def add_rpc_option(p: argparse.ArgumentParser) -> None:
    """--rpc: Engine's rpc (the target's layers on llama.cpp rpc-servers), for generate, calibrate
    and serve."""
    p.add_argument("--rpc", default=None, metavar="HOST:PORT[,...]",
                   help="llama.cpp rpc-servers that hold the target's layers (all of them unless --n-gpu-layers "
                        "says how many); needs llama-cpp-python built with -DGGML_RPC=on (docs/install.md)")


def add_ngram_option(p: argparse.ArgumentParser) -> None:
    """--ngram: Engine's ngram (a static n-gram table method auto also drafts from)."""
    p.add_argument("--ngram", default=None, metavar="PATH",
                   help="n-gram table for method auto (`pyspec ngram build`); 'default': the ShareGPT table in the "
                        "cache, built first when missing (about 2 minutes)")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """Engine keyword arguments from add_engine_options' flags."""
    return {"repack": None if args.repack == "auto" else args.repack, "huge_pages": not args.no_huge_pages,
            "flash_attn": args.flash_attn}


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return str(args.prompt)
    if args.prompt_file == "-":
        return sys.stdin.read()
    with open(args.prompt_file, encoding="utf-8") as f:
        return f.read()


def stats_file_path(args: argparse.Namespace, engine: Any) -> Path | None:
    """The acceptance statistics file a command keeps for method auto (--stats-file), loaded
    now; None when off (the default) or the method is not auto. A missing file starts fresh; a
    bad cached file ('default') is reported and replaced; a bad file the user named is an error."""
    from .. import acceptance
    from ..errors import StatsFileError

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

"""`pyspec distill`: offline distillation of a draft on a prompt suite (pyspec.online.offline).

Imports torch only when the command runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..online.config import EXPORT_TYPES, TRAIN_BLOCKS_HELP, DistillConfig  # no torch: plain settings


def _acceptance(engine: Any, prompts: list[list[int]], max_tokens: int) -> float:
    """Pooled acceptance of the engine's draft (method chain, greedy) over `prompts`."""
    drafted = accepted = 0
    for tokens in prompts:
        stats = engine.generate(tokens, max_tokens=max_tokens, method="chain").stats
        drafted += stats.n_drafted
        accepted += stats.n_accepted
    return accepted / drafted if drafted else 0.0


def _cmd_distill(args: argparse.Namespace) -> int:
    from ..data import load_suite
    from .options import engine_options
    from ..engine import Engine
    from ..online import export_gguf, load_gguf
    from ..online.offline import distill_offline
    from ..online.trainer import frozen_tensor_names

    config = DistillConfig(loss=args.loss, tau=args.tau, top_k=args.top_k, lr=args.lr, batch_size=args.batch_size,
                           train_vocab=args.train_vocab, train_blocks=args.train_blocks,
                           train_threads=args.train_threads, export_dtype=args.dtype, seed=args.seed)
    with Engine(args.target, draft=args.draft, n_ctx=args.n_ctx, n_threads=args.threads, head=False,
                **engine_options(args)) as engine:
        suite = load_suite(args.suite, args.n + args.eval)
        prompts = [engine.prompt_tokens(p.render(chat=not args.raw)) for p in suite]
        train_prompts, eval_prompts = prompts[: args.n], prompts[args.n:]
        if not train_prompts:
            raise ValueError(f"suite {args.suite} gave no training prompts")
        before = _acceptance(engine, eval_prompts, args.max_tokens) if eval_prompts else None
        model = load_gguf(engine.draft_path) if engine.draft_path else None
        if model is None:
            raise ValueError("--draft is required")

        def progress(step: int, loss: float) -> None:
            if (step + 1) % max(1, args.steps // 10) == 0 or step + 1 == args.steps:
                print(f"step {step + 1}/{args.steps}: loss {loss:.4f}", file=sys.stderr)

        report = distill_offline(engine, model, train_prompts, config, steps=args.steps, sampling=args.sampling,
                                 max_tokens=args.max_tokens, temperature=args.temperature, on_step=progress)
        out = export_gguf(model, args.out, dtype=args.dtype, unchanged=frozen_tensor_names(model, config))
        after = None
        if eval_prompts:
            engine.reload_draft(out)
            after = _acceptance(engine, eval_prompts, args.max_tokens)
    summary = {
        "out": str(out), "steps": args.steps, "sampling": args.sampling, "loss": args.loss,
        "first_loss": report.losses[0], "last_loss": report.losses[-1], "n_positions": report.n_positions,
        "sources": report.sources, "seconds": round(report.seconds, 1),
        "eval_prompts": len(eval_prompts), "acceptance_before": before, "acceptance_after": after,
    }
    print(json.dumps(summary, indent=1))
    return 0


def register(subparsers: Any) -> None:
    from .options import add_engine_options

    p = subparsers.add_parser("distill", help="distil a draft model on a prompt suite (needs torch)")
    p.add_argument("--target", required=True, help="GGUF path or registry name")
    p.add_argument("--draft", required=True, help="GGUF path or registry name of the draft to train")
    p.add_argument("--suite", default="humaneval", help="prompt suite (pyspec data list)")
    p.add_argument("--n", type=int, default=32, help="training prompts: the suite's first N (default 32)")
    p.add_argument("--eval", type=int, default=0,
                   help="also measure chain acceptance before/after on the next N prompts (default 0: off)")
    p.add_argument("--loss", choices=["fkl", "rkl", "jsd", "ce"], default="fkl")
    p.add_argument("--tau", type=float, default=1.0, help="temperature of both distributions (default 1)")
    p.add_argument("--sampling", choices=["teacher", "student", "mixed"], default="teacher",
                   help="where the sequences come from: the target, the draft, or half and half")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--top-k", type=int, default=32, help="target probabilities kept per position (default 32)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per generated sequence (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of the sequences (0: greedy)")
    p.add_argument("--dtype", choices=list(EXPORT_TYPES), default="source",
                   help="export type (default source: each tensor in the draft file's own type)")
    p.add_argument("--out", required=True, help="GGUF file to write")
    p.add_argument("--raw", action="store_true", help="raw prompt text instead of the chat template")
    p.add_argument("--threads", type=int, default=None, help="engine CPU threads (default: all cores)")
    add_engine_options(p)
    p.add_argument("--train-threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--train-vocab", action=argparse.BooleanOptionalAction, default=DistillConfig.train_vocab,
                   help="train the embedding and output matrices too (--no-train-vocab freezes them)")
    p.add_argument("--train-blocks", type=int, default=DistillConfig.train_blocks, metavar="N",
                   help=TRAIN_BLOCKS_HELP)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_cmd_distill)

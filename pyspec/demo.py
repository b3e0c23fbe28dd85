"""`pyspec demo`: the main job. Fetches the default Qwen pair, takes a HumanEval prompt through the
chat template, and generates it with plain decoding and speculatively, side by side."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_METHOD = "chain"


@dataclass
class DemoRun:
    method: str
    tokens: list[int]
    text: str
    tokens_per_second: float
    acceptance_rate: float
    tokens_per_target_call: float


def run_demo(
    target: str = DEFAULT_TARGET,
    draft: str | None = DEFAULT_DRAFT,
    *,
    prompt_index: int = 0,
    max_tokens: int = 128,
    method: str = DEFAULT_METHOD,
    n_draft: int = 4,
    n_threads: int | None = None,
    out: Any = sys.stdout,
) -> tuple[DemoRun, DemoRun]:
    """Runs plain and speculative greedy decoding on one HumanEval prompt; prints both."""
    from .data import load_suite
    from .engine import Engine
    from .models import resolve_model

    print(f"models: target {target}, draft {draft} (fetched into the pyspec cache on first use)", file=out)
    target_path = resolve_model(target, progress=True)
    draft_path = resolve_model(draft, progress=True) if draft else None
    prompts = load_suite("humaneval", n=prompt_index + 1)
    prompt = prompts[prompt_index]
    print(f"prompt: {prompt.id} through the chat template", file=out)

    runs = []
    with Engine(target_path, draft=draft_path, n_threads=n_threads) as engine:
        engine.generate(prompt.messages, max_tokens=8, method="none")  # warm-up: page in weights
        for m in ("none", method):
            r = engine.generate(prompt.messages, max_tokens=max_tokens, method=m, n_draft=n_draft)
            s = r.stats
            runs.append(DemoRun(m, r.tokens, r.text, s.tokens_per_second, s.acceptance_rate, s.tokens_per_target_call))
    plain, spec = runs
    print("\n--- completion " + "-" * 60, file=out)
    print(spec.text, file=out)
    print("-" * 75, file=out)
    print(format_table(plain, spec), file=out)
    return plain, spec


def format_table(plain: DemoRun, spec: DemoRun) -> str:
    identical = "yes" if plain.tokens == spec.tokens else "NO"
    rows = [
        "| method | tokens | tokens/s | speedup | acceptance | tokens/target call |",
        "|---|---|---|---|---|---|",
    ]
    for r in (plain, spec):
        speedup = r.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else 0.0
        acc = f"{r.acceptance_rate:.2f}" if r.method != "none" else "-"
        rows.append(
            f"| {r.method} | {len(r.tokens)} | {r.tokens_per_second:.1f} | {speedup:.2f}x | {acc} | "
            f"{r.tokens_per_target_call:.2f} |"
        )
    rows.append(f"\noutputs identical (greedy, token for token): {identical}")
    return "\n".join(rows)


def _cmd_demo(args: argparse.Namespace) -> int:
    plain, spec = run_demo(
        args.target, args.draft, prompt_index=args.prompt_index, max_tokens=args.max_tokens,
        method=args.method, n_draft=args.n_draft, n_threads=args.threads,
    )
    return 0


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="the main job: plain vs speculative decoding on real models")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"registry name or GGUF path (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"registry name or GGUF path (default {DEFAULT_DRAFT})")
    p.add_argument("--prompt-index", type=int, default=0, help="HumanEval prompt to use (default 0)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--method", default=DEFAULT_METHOD, choices=["chain"])
    p.add_argument("--n-draft", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(handler=_cmd_demo)

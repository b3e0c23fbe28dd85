"""`pyspec demo`: the main job. Fetches the default Qwen pair, takes a HumanEval prompt through the
chat template, and generates it with plain decoding and with each speculative method, side by
side in one process (same prompt, same threads, greedy)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Sequence

from .config import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402


@dataclass
class DemoRun:
    method: str
    tokens: list[int]
    text: str
    tokens_per_second: float
    acceptance_rate: float
    tokens_per_target_call: float


def default_methods() -> list[str]:
    """Every speculative method the engine runs without a draft head (the demo loads none):
    all but plain decoding and the head's `redrafter`."""
    from . import _core

    return [name for name, _, needs_head in _core.drafter_methods() if name != "none" and not needs_head]


def run_demo(
    target: str = DEFAULT_TARGET,
    draft: str | None = DEFAULT_DRAFT,
    *,
    methods: Sequence[str] | None = None,
    prompt_index: int = 0,
    max_tokens: int = 128,
    n_draft: int | None = None,
    n_threads: int | None = None,
    repack: bool | str | None = None,
    huge_pages: bool = True,
    flash_attn: bool | str | None = None,
    out: Any = sys.stdout,
) -> list[DemoRun]:
    """Runs plain decoding and each speculative method on one HumanEval prompt; prints the
    completion of the fastest method and a table. Returns the runs, plain decoding first.
    n_draft: draft length for every method (default: the engine's per-method default).
    repack, huge_pages, flash_attn: as Engine's."""
    from .data import load_suite
    from .engine import Engine
    from .models import resolve_model

    methods = list(methods or default_methods())
    print(f"models: target {target}, draft {draft} (fetched into the pyspec cache on first use)", file=out)
    target_path = resolve_model(target, progress=True)
    draft_path = resolve_model(draft, progress=True) if draft else None
    prompt = load_suite("humaneval", n=prompt_index + 1)[prompt_index]
    print(f"prompt: {prompt.id} through the chat template, greedy, {max_tokens} new tokens at most", file=out)

    runs = []
    with Engine(target_path, draft=draft_path, n_threads=n_threads, repack=repack, huge_pages=huge_pages,
                flash_attn=flash_attn) as engine:
        engine.generate(prompt.messages, max_tokens=8, method="none")  # warm-up: page the weights in
        for m in ["none", *methods]:
            r = engine.generate(prompt.messages, max_tokens=max_tokens, method=m, n_draft=n_draft)
            s = r.stats
            runs.append(DemoRun(m, r.tokens, r.text, s.tokens_per_second, s.acceptance_rate, s.tokens_per_target_call))
            print(f"  {m}: {s.tokens_per_second:.1f} tokens/s", file=out, flush=True)
    best = max(runs[1:], key=lambda r: r.tokens_per_second) if len(runs) > 1 else runs[0]
    print(f"\n--- completion ({best.method}) " + "-" * 50, file=out)
    print(best.text, file=out)
    print("-" * 75, file=out)
    print(format_table(runs), file=out)
    return runs


def format_table(runs: list[DemoRun]) -> str:
    plain = runs[0]
    rows = [
        "| method | tokens | tokens/s | speedup vs none | acceptance | tokens/target call | identical to none |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        speedup = r.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else 0.0
        acc = f"{r.acceptance_rate:.2f}" if r.method != "none" else "-"
        same = "-" if r is plain else ("yes" if r.tokens == plain.tokens else "NO")
        rows.append(
            f"| {r.method} | {len(r.tokens)} | {r.tokens_per_second:.1f} | {speedup:.2f}x | {acc} | "
            f"{r.tokens_per_target_call:.2f} | {same} |"
        )
    return "\n".join(rows)

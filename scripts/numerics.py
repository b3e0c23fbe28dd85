"""Batched vs one-token logits of a target model: what docs/numerics.md reports.

For each prompt, the target's plain greedy answer (method "none") is teacher-forced through the
target twice: in chunks of k tokens (an engine with n_batch=k, as verification evaluates drafts)
and one token at a time (n_batch=1, as plain decoding does). At every answer position the script
compares the two rows: argmax flips, the top-2 logit gap of both evaluations at each flip, and the
largest absolute logit difference. Not a timing: it need not run on a quiet machine.

    python scripts/numerics.py --k 4 8 16 --prompts humaneval:HumanEval/0 mtbench:mtbench/85 --repack weights off
    python scripts/numerics.py --flash-attn off on   # both evaluations with llama.cpp's flash attention, then without
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

import pyspec
from pyspec.config import DEFAULT_TARGET
from pyspec.data import load_suite
from pyspec.engine import REPACK_MODES, repack_mode


def top2_gap(row: np.ndarray) -> float:
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def find_prompt(spec: str) -> Any:
    """"suite:id", e.g. "humaneval:HumanEval/0" or "mtbench:mtbench/85"."""
    suite, _, prompt_id = spec.partition(":")
    for p in load_suite(suite):
        if p.id == prompt_id:
            return p
    raise SystemExit(f"no prompt {prompt_id!r} in suite {suite!r}")


def answer_logits(target: str, tokens: list[int], n_batch: int, repack: str, threads: int,
                  flash_attn: bool = False) -> np.ndarray:
    """All rows of `tokens` evaluated from an empty cache in chunks of n_batch: [n_tokens, n_vocab]."""
    with pyspec.Engine(target, n_ctx=2048, n_batch=n_batch, n_threads=threads, repack=repack,
                       flash_attn=flash_attn) as engine:
        return engine.evaluate(tokens, all_rows=True)


def compare(one: np.ndarray, batched: np.ndarray, first: int) -> dict[str, Any]:
    """Rows first.. (the rows that predict answer tokens) of two evaluations."""
    a, b = one[first:], batched[first:]
    flips = [i for i in range(len(a)) if int(a[i].argmax()) != int(b[i].argmax())]
    return {
        "n_positions": len(a),
        "n_flips": len(flips),
        "flips": [{"position": i, "gap_one_token": round(top2_gap(a[i]), 4), "gap_batched": round(top2_gap(b[i]), 4)}
                  for i in flips],
        "max_abs_logit_diff": float(np.abs(a - b).max()),
        "median_abs_logit_diff": float(np.median(np.abs(a - b))),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--prompts", nargs="+", default=["humaneval:HumanEval/0", "mtbench:mtbench/85"],
                   help="suite:id of each prompt")
    p.add_argument("--k", nargs="+", type=int, default=[4, 8, 16])
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--repack", nargs="+", choices=list(REPACK_MODES), default=[repack_mode(None), "off"],
                   help="Engine repack modes to compare (default: the engine's default here, and off)")
    p.add_argument("--flash-attn", nargs="+", choices=["off", "on"], default=["off"],
                   help="llama.cpp's flash attention in both evaluations (Engine's flash_attn): off, on or both")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)

    repacks = list(dict.fromkeys(args.repack))
    results = []
    for prompt_id in args.prompts:
        prompt = find_prompt(prompt_id)
        with pyspec.Engine(args.target, n_ctx=2048, n_threads=args.threads) as engine:
            plain = engine.generate(prompt.messages, max_tokens=args.max_tokens, method="none")
        tokens = plain.prompt_tokens + plain.tokens
        first = len(plain.prompt_tokens) - 1  # the row that predicts the first answer token
        for repack in repacks:
            for fa in dict.fromkeys(args.flash_attn):
                on = fa == "on"
                one = answer_logits(args.target, tokens, 1, repack, args.threads, on)
                for k in args.k:
                    row = compare(one, answer_logits(args.target, tokens, k, repack, args.threads, on), first)
                    row.update(prompt=prompt_id, repack=repack, flash_attn=on, k=k, n_answer_tokens=len(plain.tokens))
                    results.append(row)
                    gaps = ", ".join(f"{f['gap_one_token']:.3f}/{f['gap_batched']:.3f}" for f in row["flips"])
                    print(f"{prompt_id:24s} repack={repack:7s} fa={fa:3s} k={k:2d}: {row['n_flips']} flips "
                          f"in {row['n_positions']} positions (top-2 gaps one-token/batched: {gaps or '-'}), "
                          f"max |dlogit| {row['max_abs_logit_diff']:.4f}", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"target": args.target, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

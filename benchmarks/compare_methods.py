"""Side-by-side comparison of decoding methods on real models, one process, interleaved.

For each prompt every method runs back to back (so machine drift hits all alike), greedy, after a
warm-up. Reports tokens/s, speedup vs plain decoding, tokens per target call, acceptance, and
whether each output is token-identical to plain decoding; where it is not, the target's top-2
logit gap at the first divergence (a near-tie means batched vs one-token numerics, not a bug).

    python benchmarks/compare_methods.py --suites edit,humaneval --n 5 --max-tokens 128 \
        --methods none,lookup:8,lookup:4,chain:4
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import pyspec
from pyspec.data import load_suite


def parse_methods(spec: str) -> list[tuple[str, str, int]]:
    """'none,lookup:8,chain:4' -> [(label, method, n_draft)]."""
    out = []
    for item in spec.split(","):
        method, _, n = item.partition(":")
        out.append((item, method, int(n) if n else 4))
    return out


def top2_gap(engine: pyspec.Engine, tokens: list[int]) -> float:
    top = np.sort(engine.evaluate(tokens)[0])[-2:]
    return float(top[1] - top[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--suites", default="edit,humaneval")
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--methods", default="none,lookup:8,lookup:4,chain:4")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    methods = parse_methods(args.methods)
    assert methods[0][1] == "none", "the first method must be none (the reference)"

    engine = pyspec.Engine(args.target, draft=args.draft, n_threads=args.threads)
    rows: dict[tuple[str, str], list[dict]] = {}
    for suite in args.suites.split(","):
        prompts = load_suite(suite, n=args.n)
        engine.generate(prompts[0].messages, max_tokens=8, method="none")  # warm-up
        for p in prompts:
            ref = None
            for label, method, n_draft in methods:
                r = engine.generate(p.messages, max_tokens=args.max_tokens, method=method, n_draft=n_draft)
                if ref is None:
                    ref = r
                same = r.tokens == ref.tokens
                gap = None
                if not same:
                    i = next((k for k, (a, b) in enumerate(zip(r.tokens, ref.tokens)) if a != b),
                             min(len(r.tokens), len(ref.tokens)))
                    gap = top2_gap(engine, ref.prompt_tokens + ref.tokens[:i])
                    print(f"  {p.id} {label}: diverges from none at token {i}, top-2 logit gap {gap:.3f}")
                s = r.stats
                rows.setdefault((suite, label), []).append(dict(
                    tps=s.tokens_per_second, n=s.n_generated, calls=s.n_target_calls,
                    acc=s.n_accepted, drafted=s.n_drafted, same=same, ref_tps=ref.stats.tokens_per_second))
                print(f"{p.id} {label}: {s.tokens_per_second:.2f} tok/s, {s.tokens_per_target_call:.2f} tok/call, "
                      f"acceptance {s.acceptance_rate:.2f}", flush=True)

    print("\n| suite | method | tok/s (median) | speedup vs none (median of per-prompt ratios) "
          "| tokens/target call | acceptance | identical to none |")
    print("|---|---|---|---|---|---|---|")
    for (suite, label), xs in rows.items():
        tps = statistics.median(x["tps"] for x in xs)
        speedup = statistics.median(x["tps"] / x["ref_tps"] for x in xs)
        tpc = sum(x["n"] for x in xs) / sum(x["calls"] for x in xs)
        drafted = sum(x["drafted"] for x in xs)
        acc = f"{sum(x['acc'] for x in xs) / drafted:.2f}" if drafted else "-"
        print(f"| {suite} | {label} | {tps:.1f} | {speedup:.2f}x | {tpc:.2f} | {acc} | "
              f"{sum(x['same'] for x in xs)}/{len(xs)} |")


if __name__ == "__main__":
    main()

"""History reuse of the phrase pool: the same prompt stream decoded twice with method "lookup",
once with the pool kept across requests and once with it cleared before each request.

    python benchmarks/pool_history.py --suite humaneval --n 20 --max-tokens 128

Greedy, chat template, one engine (target only). Prints tokens per target call and tokens/s for
both passes and checks that both produce the same tokens (the pool changes speed, never output).
The cleared pass runs first, so page-cache warm-up favours the kept pass slightly; the tokens
per target call are unaffected by that.
"""

from __future__ import annotations

import argparse
import time

from pyspec import Engine
from pyspec.data import load_suite


def run(engine: Engine, prompts, max_tokens: int, keep: bool) -> tuple[float, float, list[list[int]]]:
    engine.clear_pool()
    generated = calls = 0
    seconds = 0.0
    outputs = []
    for p in prompts:
        if not keep:
            engine.clear_pool()
        t0 = time.perf_counter()
        r = engine.generate(p.messages, max_tokens=max_tokens, method="lookup")
        seconds += time.perf_counter() - t0
        generated += r.stats.n_generated
        calls += r.stats.n_target_calls
        outputs.append(r.tokens)
    return generated / calls, generated / seconds, outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--suite", default="humaneval")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    prompts = load_suite(args.suite, n=args.n)
    with Engine(args.target, n_ctx=4096, n_threads=args.threads) as engine:
        engine.generate(prompts[0].messages, max_tokens=8, method="none")  # page the weights in
        cold_tpc, cold_tps, cold_out = run(engine, prompts, args.max_tokens, keep=False)
        warm_tpc, warm_tps, warm_out = run(engine, prompts, args.max_tokens, keep=True)
        stats = engine.pool_stats()
    same = sum(a == b for a, b in zip(cold_out, warm_out))
    print(f"{args.suite}, {len(prompts)} prompts, {args.max_tokens} new tokens, method lookup, greedy")
    print("| pool | tokens/target call | tok/s |")
    print("|---|---|---|")
    print(f"| cleared before each request | {cold_tpc:.2f} | {cold_tps:.1f} |")
    print(f"| kept across requests | {warm_tpc:.2f} | {warm_tps:.1f} |")
    print(f"identical outputs: {same}/{len(prompts)}; pool after the kept pass: {stats['size']} phrases, "
          f"{stats['n_tokens_accepted']} accepted tokens credited, inserts by source {stats['n_inserted_by_source']}")


if __name__ == "__main__":
    main()

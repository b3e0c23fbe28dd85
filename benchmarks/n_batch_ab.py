"""Plain decoding speed against the engine's physical batch size (`n_batch`), side by side.

One engine per n_batch, all loaded at once; every prompt is generated with `method="none"` by
each engine in turn, the order rotating by one engine per prompt. Prints decode tokens/s per
prompt and, per n_batch, the median of per-prompt ratios against the last n_batch given.
Run it on an idle machine (README, "Against llama.cpp's own speculation").

    python benchmarks/n_batch_ab.py --suite mtbench --n 8 --max-tokens 128 --n-batch 512 64 8 1
"""
from __future__ import annotations

import argparse
import statistics

from pyspec import Engine
from pyspec.data import load_suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--suite", default="mtbench")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, nargs="+", default=[512, 64, 8, 1])
    args = ap.parse_args()

    sizes = list(args.n_batch)
    engines = [Engine(args.target, n_ctx=4096, n_batch=nb, n_threads=args.threads) for nb in sizes]
    prompts = load_suite(args.suite, n=args.n)
    tokens = [engines[0].tokenize(engines[0].apply_chat_template(list(p.messages))) for p in prompts]
    for e in engines:  # page the weights in
        e.generate(tokens[0], max_tokens=16, method="none")
    speed: dict[int, list[float]] = {nb: [] for nb in sizes}
    for i, t in enumerate(tokens):
        first = i % len(engines)
        for j in list(range(first, len(engines))) + list(range(first)):
            speed[sizes[j]].append(engines[j].generate(t, max_tokens=args.max_tokens, method="none").stats.tokens_per_second)
        print(f"{prompts[i].id}: " + "  ".join(f"n_batch {nb}: {speed[nb][-1]:.1f}" for nb in sizes), flush=True)
    base = sizes[-1]
    for nb in sizes:
        ratio = statistics.median(x / y for x, y in zip(speed[nb], speed[base]))
        print(f"n_batch {nb}: decode tok/s median {statistics.median(speed[nb]):.1f}, vs n_batch {base}: {ratio:.3f}x")
    for e in engines:
        e.close()


if __name__ == "__main__":
    main()

"""Greedy chain acceptance of a draft model per suite: on which domain is the draft weakest (the
domain where online distillation has the most to gain)?

    python benchmarks/draft_acceptance.py --draft qwen2.5-coder-0.5b-instruct \\
        --suites humaneval,gsm8k,mtbench,edit --first 60 --n 8

Target Qwen2.5-Coder 1.5B, chat template, method chain with 2 drafted tokens, 32 tokens per
request (the stream experiment's settings), prompts first..first+n-1 of each suite (60: after
the prompts the stream experiment serves and holds out). Prints one JSON line per suite
(acceptance = accepted / drafted tokens pooled over its prompts) and then all of them.
"""

from __future__ import annotations

import argparse
import json
import time

import pyspec
from pyspec.data import load_suite


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--suites", default="humaneval,gsm8k,mtbench,edit")
    p.add_argument("--first", type=int, default=60, help="index of the first prompt of each suite")
    p.add_argument("--n", type=int, default=8, help="prompts per suite")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--n-draft", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    out = {}
    with pyspec.Engine(args.target, draft=args.draft, n_ctx=2048, n_threads=args.threads) as engine:
        for suite in args.suites.split(","):
            prompts = [q.render(chat=True) for q in load_suite(suite, args.first + args.n)][args.first:]
            drafted = accepted = 0
            t0 = time.perf_counter()
            for prompt in prompts:
                s = engine.generate(prompt, max_tokens=args.max_tokens, method="chain", n_draft=args.n_draft).stats
                drafted += s.n_drafted
                accepted += s.n_accepted
            out[suite] = {"acceptance": accepted / drafted if drafted else None, "drafted": drafted,
                          "n_prompts": len(prompts), "seconds": time.perf_counter() - t0}
            print(json.dumps({suite: out[suite]}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Where a method's time goes on one prompt: every target step's size (1 + draft nodes) and time.

    python benchmarks/auto_steps.py --suite longedit --index 3 --methods none,auto,lookup:32,auto

Runs the methods one after another in one engine set up as `pyspec bench` sets up its own
(n_ctx 4096, the bench's n_batch, no prefix cache), so the second `auto` shows what the
engine's state after the first (acceptance statistics, learnt costs) changes.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import pyspec
from pyspec.bench import ENGINE_N_BATCH
from pyspec.data import load_suite


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="longedit")
    p.add_argument("--index", type=int, default=0, help="the prompt's index in the suite")
    p.add_argument("--methods", default="none,auto,lookup:32,auto", help="method[:n_draft], comma-separated")
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    prompt = load_suite(args.suite, n=args.index + 1)[args.index]
    with pyspec.Engine(args.target, draft=args.draft, n_ctx=4096, n_batch=ENGINE_N_BATCH, n_threads=args.threads,
                       prefix_cache=False) as engine:
        engine.generate(prompt.messages, max_tokens=4, method="none")  # warm-up
        for spec in args.methods.split(","):
            method, _, n_draft = spec.partition(":")
            options = {"n_draft": int(n_draft)} if n_draft else {}
            r = engine.generate(prompt.messages, max_tokens=args.max_tokens, method=method, **options)
            s = r.stats
            print(f"{spec}: {len(r.tokens)} tokens, {s.n_target_calls} target calls, {s.n_drafted} drafted, "
                  f"{s.n_accepted} accepted, target steps {s.t_verify_ms / 1000:.2f} s "
                  f"({len(r.tokens) / max(s.t_verify_ms / 1000, 1e-9):.1f} tok/s)")
            sizes, ms = np.asarray(r.step_sizes), np.asarray(r.step_ms)
            if sizes.size and sizes.max() > 1:
                print("  size:ms", " ".join(f"{int(a)}:{b:.0f}" for a, b in zip(sizes, ms)))
            elif ms.size:
                print(f"  one-token steps: median {np.median(ms):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

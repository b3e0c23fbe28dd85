"""Live counterpart of benchmarks/auto_streams.py: one engine (set up as `pyspec bench` sets up
its own) serves prompts of one suite with `auto` and then prompts of another, and each of the
latter is compared with `none` and with `auto` from the state the engine had before the first
suite (what a fresh engine would do).

    python benchmarks/auto_streams_live.py --first humaneval --n-first 12 --then mtbench --n-then 5

Prints per THEN prompt: decode tok/s of `none`, of `auto` from the starting state, of `auto`
after the FIRST suite, and that run's target calls, drafted and accepted tokens and plain steps.
One run each on a shared machine: the drafted and accepted counts are steadier than the speeds.
"""

from __future__ import annotations

import argparse
import sys

import pyspec
from pyspec.bench import ENGINE_N_BATCH, decode_tokens_per_second
from pyspec.data import load_suite


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--first", default="humaneval")
    ap.add_argument("--n-first", type=int, default=12)
    ap.add_argument("--then", default="mtbench")
    ap.add_argument("--n-then", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    tests = load_suite(args.then, n=args.n_then)
    with pyspec.Engine("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct", n_ctx=4096,
                       n_batch=ENGINE_N_BATCH, n_threads=args.threads, prefix_cache=False) as engine:

        def run(prompt, method):  # noqa: ANN001, ANN202
            r = engine.generate(prompt.messages, max_tokens=args.max_tokens, method=method)
            return decode_tokens_per_second(r.stats, r.finish_reason), r

        engine.generate(tests[0].messages, max_tokens=4, method="none")  # warm-up
        start = []
        for p in tests:
            none, _ = run(p, "none")
            before = engine._core.learnt()
            fresh, _ = run(p, "auto")
            engine._core.restore_learnt(before)  # each from the starting state
            start.append((none, fresh))
        for p in load_suite(args.first, n=args.n_first):
            run(p, "auto")
        print(f"after {args.n_first} {args.first} prompts with auto:")
        for p, (none, fresh) in zip(tests, start):
            after, r = run(p, "auto")
            s = r.stats
            print(f"  {p.id}: none {none:.1f}, auto from the start {fresh:.1f}, after {after:.1f} tok/s "
                  f"({after / none:.2f}x none); calls {s.n_target_calls}, drafted {s.n_drafted}, "
                  f"accepted {s.n_accepted}, plain steps {s.n_empty_drafts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What verification pays for its logits: one decode of k tokens with a logits row for every
token (as the target verifying a draft needs them) against one with only the last token's row (as
a draft model drafting, or a prompt pass, or `llama-bench`'s pp test, compute it).

The output matrix (151,936 x 1,536 for the Qwen2.5 targets, Q6_K in the Q4_K_M files; the pinned
llama.cpp's ggml-cpu/repack.cpp repacks Q6_K only for ARM, not on x86) is applied to every row
that asks for logits, so a verification step of k tokens costs more than a prompt batch of k
tokens; `llama-bench`'s pp figures are therefore a lower bound on the engine's cost curve, not
the curve. llama.cpp's own speculative tools need
every row too, so this is a cost both sides pay.

Both kinds are timed by the engine's calibration timer on the one loaded target
(`Engine._core.time_decodes`, spec/calibrate.h: sizes interleaved, the median of the repeats, on
top of `context` cached tokens, made non-decreasing in k), alternating `--rounds` times; each size
keeps the median of its rounds. The k = 1 row times the same work both ways: its difference is
the noise of the comparison. A timing: run it with the machine idle.

    python benchmarks/logit_rows_cost.py --contexts 128,2000 --sizes 1,2,4,8,16,32,64
"""

from __future__ import annotations

import argparse
import statistics

from pyspec import Engine

TARGET = "qwen2.5-coder-1.5b-instruct"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--contexts", default="128,2000", help="comma-separated tokens already in the cache")
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64", help="comma-separated tokens per decode, increasing from 1")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over the sizes within one measurement")
    ap.add_argument("--rounds", type=int, default=2, help="measurements of each kind, alternating")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    sizes = [int(k) for k in args.sizes.split(",")]

    with Engine(args.target, n_ctx=max(contexts) + max(sizes) + 16, n_batch=max(512, max(sizes)),
                n_threads=args.threads) as engine:
        print(f"ms per decode of k tokens, logits for every row / for the last row only (median of "
              f"{args.rounds} rounds of {args.repeats})")
        for c in contexts:
            rounds: dict[bool, list[list[float]]] = {True: [], False: []}
            for _ in range(args.rounds):
                for all_rows in (True, False):
                    rounds[all_rows].append(engine._core.time_decodes(sizes, args.repeats, all_rows, c).ms)
            for i, k in enumerate(sizes):
                e, l = (statistics.median(r[i] for r in rounds[all_rows]) for all_rows in (True, False))
                print(f"context {c:5d}  k {k:3d}: {e:7.1f} / {l:7.1f} ms, every row costs "
                      f"{e / l - 1:+.0%} ({(e - l) / max(k - 1, 1):.1f} ms per extra row)", flush=True)


if __name__ == "__main__":
    main()

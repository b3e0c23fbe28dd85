"""The target's cost curve at several context lengths: one decode of k tokens on top of c tokens
already in the cache, for the calibration's sizes k and each c given.

The cached calibration (`pyspec calibrate`) is taken over 128 cached tokens; at a long context
attention makes every step slower: this measures by how much, per size (docs/cost-curves.md: 15-34% at 2,048
tokens on the development CPU, close to one factor), so the cost model's correction (spec/cost_model.h) and the replay (`benchmarks/auto_replay.py
--actual-curve`) can be checked against the machine. A timing: run it with the machine idle.

    python benchmarks/context_cost.py --contexts 128,1024,2048 --json ctx.json
    python benchmarks/context_cost.py --contexts 128 --every-size --json every.json

`--every-size` times every size from 1 to 64, interleaved in each round and kept as measured
(the calibration's sizes are made non-decreasing, which hides a size that costs less than the
one before it): slower, minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyspec import Engine, calibration

TARGET = "qwen2.5-coder-1.5b-instruct"


def every_size(engine: Engine, repeats: int, context: int) -> calibration.CostCurve:
    """Each size k in 1..64 with the context prefilled once and the sizes interleaved in every
    round, as calibration times its sizes, the median of `repeats` rounds per size as measured
    (not made non-decreasing, as the calibration's running maximum does)."""
    bar, update = calibration._progress(f"context {context}: sizes 1-64", True)
    try:
        timed = engine._core.time_decodes(list(range(1, 65)), repeats=repeats, all_rows=True, context=context,
                                          non_decreasing=False, progress=update)
    finally:
        bar.close()
    return calibration.CostCurve(tuple(timed.n_tokens), tuple(timed.ms))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--contexts", default="128,2048", help="comma-separated cached-token counts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--every-size", action="store_true",
                    help="every size from 1 to 64, interleaved, not made non-decreasing")
    ap.add_argument("--json", type=Path, help="write {context: {n_tokens, ms}} here")
    args = ap.parse_args()
    contexts = list(dict.fromkeys(int(c) for c in args.contexts.split(",")))  # each once, in order
    engine = Engine(args.target, n_ctx=args.n_ctx, n_threads=args.threads)
    curves = {}
    try:
        for c in contexts:
            curves[c] = (every_size(engine, args.repeats, c) if args.every_size
                         else calibration.measure(engine, None, repeats=args.repeats, context=c))
    finally:
        engine.close()
    base = curves[contexts[0]]
    print(f"ms per decode of k tokens; in parentheses: / the {contexts[0]}-token context's time")
    print("k      " + "".join(f"{c:>18}" for c in contexts))
    for i, k in enumerate(base.n_tokens):
        cells = "".join(f"{curves[c].ms[i]:9.1f} ({curves[c].ms[i] / base.ms[i]:4.2f}x) " for c in contexts)
        print(f"{k:<6} {cells}")
    if args.json:
        args.json.write_text(json.dumps({str(c): {"n_tokens": list(v.n_tokens), "ms": list(v.ms)}
                                         for c, v in curves.items()}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

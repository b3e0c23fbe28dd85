"""One-shot runs with and without kept acceptance statistics (Engine.save_stats / load_stats, what
`pyspec generate --stats-file` does): a fresh engine per request, as a one-shot `pyspec generate`
has, once starting from the priors alone and once from statistics saved by an engine that served
other prompts first.

    python benchmarks/stats_file_live.py --warm humaneval:10:20 --test humaneval:0:10
    python benchmarks/stats_file_live.py --warm humaneval:10:20 --test mtbench:0:10

Each test prompt is run in both ways back to back (the order alternating from one prompt to the
next), each in a new engine with the bench's settings, `auto` greedy with 192 new tokens at most;
prints per prompt the decode tok/s of both and their ratio, whether the tokens are identical,
and the geometric mean of the ratios; where the tokens differ, the target's top-2 logit gap at the
first differing token (batched and one-token logits differ slightly, docs/numerics.md). The phrase pool is not kept, so only the statistics differ.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import pyspec
from pyspec.bench.runner import ENGINE_N_BATCH, _top2_gap, decode_tokens_per_second
from pyspec.data import load_suite


def prompts(spec: str) -> list:
    name, start, stop = spec.split(":")
    return load_suite(name, n=int(stop))[int(start):int(stop)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warm", default="humaneval:10:20", help="SUITE:START:STOP the saved statistics learn from")
    ap.add_argument("--test", default="humaneval:0:10", help="SUITE:START:STOP run one-shot both ways")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    settings = dict(draft="qwen2.5-coder-0.5b-instruct", n_ctx=4096, n_batch=ENGINE_N_BATCH, n_threads=args.threads,
                    prefix_cache=False)
    target = "qwen2.5-coder-1.5b-instruct"
    stats = Path(tempfile.mkdtemp()) / "stats.json"
    with pyspec.Engine(target, **settings) as engine:
        for p in prompts(args.warm):
            engine.generate(p.messages, max_tokens=args.max_tokens, method="auto")
        engine.save_stats(stats)
    print(f"statistics learnt on {args.warm}; one-shot runs of {args.test}:")

    def one_shot(prompt, kept: bool):  # noqa: ANN001, ANN202
        with pyspec.Engine(target, **settings) as engine:
            if kept:
                engine.load_stats(stats)
            engine.generate(prompt.messages, max_tokens=4, method="none")  # warm-up: page the weights in
            r = engine.generate(prompt.messages, max_tokens=args.max_tokens, method="auto")
            return decode_tokens_per_second(r.stats, r.finish_reason), list(r.tokens)

    ratios, differing = [], []
    for i, p in enumerate(prompts(args.test)):
        runs = {}
        for kept in ((False, True) if i % 2 == 0 else (True, False)):
            runs[kept] = one_shot(p, kept)
        ratio = runs[True][0] / runs[False][0]
        ratios.append(ratio)
        same = "identical" if runs[True][1] == runs[False][1] else "DIFFERENT"
        if runs[True][1] != runs[False][1]:
            differing.append((p, runs[False][1], runs[True][1]))
        print(f"  {p.id}: fresh {runs[False][0]:.1f}, kept statistics {runs[True][0]:.1f} tok/s ({ratio:.2f}x), "
              f"tokens {same}", flush=True)
    print(f"geometric mean kept / fresh: {statistics.geometric_mean(ratios):.3f}x over {len(ratios)} prompts")
    if differing:  # both runs are greedy auto: they part only where the target's two best tokens nearly tie
        print("where the two runs' tokens part (target's top-2 logit gap there, evaluated in one batch):")
        with pyspec.Engine(target, n_ctx=4096, n_threads=args.threads, prefix_cache=False) as engine:
            for p, a, b in differing:
                at = next(i for i, (x, y) in enumerate(zip(a + [-1], b + [-2])) if x != y)
                gap = _top2_gap(engine, engine.prompt_tokens(list(p.messages)) + a[:at])
                print(f"  {p.id}: token {at}, gap {gap:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

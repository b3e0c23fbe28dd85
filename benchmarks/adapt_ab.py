"""What the cost model's online corrections cost or gain when the calibration is right: greedy
`auto` with corrections (the default) against `auto` planning with the calibration alone
(`auto_adapt_costs=False`), side by side in one engine.

Per prompt both run from the same state (what `auto` had learnt before the prompt:
`Engine._core.learnt()` / `restore_learnt()`), in alternating order, and the engine goes on from
the corrected run's state, as a server would. Speed: generated tokens per second of the
generation's target steps (`GenerationResult.step_ms`, prefill excluded). Run it on a quiet
machine right after `pyspec calibrate --force`, so that the calibration is as right as it gets:
then the corrections can only follow the machine's noise, and this measures what following it
costs. (benchmarks/cost_repair.py measures the other side: a wrong calibration repaired.)

    python benchmarks/adapt_ab.py --suite humaneval --n 20 --json ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from pyspec import Engine
from pyspec.bench import ENGINE_N_BATCH
from pyspec.config import DEFAULT_DRAFT, DEFAULT_TARGET
from pyspec.data import load_suite


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="humaneval")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--json", type=Path, help="write the per-prompt records here")
    args = ap.parse_args()

    prompts = load_suite(args.suite, n=args.n)
    rows = []
    with Engine(args.target, draft=args.draft, n_ctx=4096, n_batch=ENGINE_N_BATCH, n_threads=args.threads,
                prefix_cache=False) as engine:
        engine.generate(prompts[0].messages, max_tokens=4, method="none")  # warm-up; calibrates if needed
        for i, prompt in enumerate(prompts):
            before = engine._core.learnt()
            speed, tokens, after, steps = {}, {}, {}, {}
            for adapt in ([True, False] if i % 2 == 0 else [False, True]):
                engine._core.restore_learnt(before)
                r = engine.generate(prompt.messages, max_tokens=args.max_tokens, method="auto",
                                    auto_adapt_costs=adapt)
                speed[adapt] = len(r.tokens) / (float(sum(r.step_ms)) / 1e3)
                tokens[adapt] = list(r.tokens)
                steps[adapt] = {"target_calls": r.stats.n_target_calls, "drafted": r.stats.n_drafted,
                                "accepted": r.stats.n_accepted}
                after[adapt] = engine._core.learnt()
            engine._core.restore_learnt(after[True])
            rows.append({"prompt_id": str(prompt.id), "corrected_tokens_per_second": speed[True],
                         "calibration_only_tokens_per_second": speed[False],
                         "same_tokens": tokens[True] == tokens[False],
                         "corrected_steps": steps[True], "calibration_only_steps": steps[False]})
            print(f"{prompt.id}: corrected {speed[True]:.1f} tok/s, calibration alone {speed[False]:.1f} "
                  f"({speed[False] / speed[True]:.3f}x){'' if tokens[True] == tokens[False] else ', tokens differ'}",
                  file=sys.stderr, flush=True)
    ratios = [r["calibration_only_tokens_per_second"] / r["corrected_tokens_per_second"] for r in rows]
    faster = sum(1 for x in ratios if x > 1.0)
    total = lambda which, key: sum(r[which][key] for r in rows)  # noqa: E731
    print(f"{args.suite}: {len(rows)} prompts; calibration alone / corrected: median {statistics.median(ratios):.3f}x, "
          f"geometric mean {statistics.geometric_mean(ratios):.3f}x, faster on {faster} of {len(rows)}; "
          f"same tokens on {sum(r['same_tokens'] for r in rows)} of {len(rows)}; target calls / drafted / accepted: "
          f"corrected {total('corrected_steps', 'target_calls')} / {total('corrected_steps', 'drafted')} / "
          f"{total('corrected_steps', 'accepted')}, calibration alone {total('calibration_only_steps', 'target_calls')} / "
          f"{total('calibration_only_steps', 'drafted')} / {total('calibration_only_steps', 'accepted')}")
    if args.json:
        args.json.write_text(json.dumps({"suite": args.suite, "n": len(rows), "max_tokens": args.max_tokens,
                                         "prompts": rows}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What repeats change in a `pyspec bench --repeats R` report: auto / best llama.cpp mode and
none / llama.cpp plain (decode tok/s, medians of per-prompt ratios, as the report computes them)
from the kept median runs, and from each repeat alone, as if the bench had run once.

    python benchmarks/bench_repeats.py benchmarks/results/vs_llama_cpp_mtbench_zen4_repeats3.json

A single run's "best mode of each prompt" is the fastest of several noisy figures; the spread of
the single-repeat rows against the median row shows how much of a gap that noise makes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from pyspec.bench.report import PromptRun, runs_from_report, versus_best_llama_cpp


def summarize(report: dict) -> list[str]:
    modes = report["llama_cpp_modes"]
    runs = runs_from_report(report)
    repeats = report.get("repeats", 1)
    if "none" not in runs:
        raise SystemExit("this report has no `none` results")
    if repeats < 2 or any(x.repeat_decode_tokens_per_second is None for x in runs["none"]):
        raise SystemExit("this report has no repeats (run `pyspec bench --repeats 3`)")

    def ratio(method: str, against: list[str], k: int | None) -> str:
        """The report's own figure: median over prompts of method / the best of `against` (one
        method: that method), on the kept runs (k None) or on repeat k alone; "-" where the
        report lacks the method or every one of `against`."""
        def value(x: PromptRun) -> float | None:
            return x.decode_tokens_per_second if k is None else x.repeat_decode_tokens_per_second[k]
        if method not in runs:
            return "-"
        r = versus_best_llama_cpp(runs[method], runs, [m for m in against if m in runs], value)
        return "-" if r is None else f"{r:.2f}x"

    lines = [f"suite {report['suite']}, {report['n']} prompts, {repeats} runs of each method per prompt",
             "| runs used | auto / best llama.cpp mode | none / llama.cpp plain | auto / none |"
             + "".join(f" {m} / none |" for m in modes),
             "|---|---|---|---|" + "---|" * len(modes)]
    for k in [None, *range(repeats)]:
        plain = ratio("none", ["llama.cpp"], k) if "llama.cpp" in modes else "-"
        lines.append(f"| {'kept runs' if k is None else 'repeat ' + str(k + 1) + ' alone'} | "
                     f"{ratio('auto', modes, k)} | {plain} | {ratio('auto', ['none'], k)} |"
                     + "".join(f" {ratio(m, ['none'], k)} |" for m in modes))
    spread = [statistics.pstdev(x.repeat_decode_tokens_per_second) / statistics.mean(x.repeat_decode_tokens_per_second)
              for r in runs.values() for x in r]
    lines.append(f"\nrun-to-run spread of one (prompt, method): median {statistics.median(spread):.1%} "
                 f"(standard deviation / mean over its {repeats} runs), largest {max(spread):.1%}")
    lines.extend(plan_spread(runs))
    return lines


def plan_spread(runs: dict[str, list[PromptRun]]) -> list[str]:
    """Per pyspec method (reports written before the bench kept each run's step counts have
    none): each run's target calls, drafted tokens and speed per prompt, and on how many prompts
    the runs' steps differ. Runs with the same steps at unequal speeds show the machine's noise; a
    speed that follows the steps, the plan changing between runs."""
    lines = []
    for method, per_prompt in runs.items():
        steps = [list(zip(x.repeat_n_target_calls or [None], x.repeat_n_drafted or [None])) for x in per_prompt]
        if any(None in s for run in steps for s in run):
            continue
        if not lines:
            lines = ["", "| method | prompts whose runs differ in steps "
                     "| per prompt: target calls / drafted tokens (tok/s) by run |", "|---|---|---|"]
        differ = sum(len(set(run)) > 1 for run in steps)
        detail = "; ".join(f"{x.prompt_id}: " + ", ".join(
            f"{c} / {d} ({r:.1f})" for (c, d), r in zip(run, x.repeat_decode_tokens_per_second))
            for x, run in zip(per_prompt, steps))
        lines.append(f"| {method} | {differ} of {len(steps)} | {detail} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="JSON of `pyspec bench --repeats R --json ...` with none (auto and llama.cpp's modes where it has them)")
    args = parser.parse_args(argv)
    with open(args.report, encoding="utf-8") as f:
        print("\n".join(summarize(json.load(f))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

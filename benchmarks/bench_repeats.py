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


def _ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den) if b)


def summarize(report: dict) -> list[str]:
    modes = report["llama_cpp_modes"]
    per = {r["method"]: r["per_prompt"] for r in report["results"]}
    repeats = report.get("repeats", 1)
    if repeats < 2 or any(x.get("repeat_decode_tokens_per_second") is None for x in per["none"]):
        raise SystemExit("this report has no repeats (run `pyspec bench --repeats 3`)")

    def rates(method: str, k: int | None) -> list[float]:
        return [x["decode_tokens_per_second"] if k is None else x["repeat_decode_tokens_per_second"][k]
                for x in per[method]]

    lines = [f"suite {report['suite']}, {report['n']} prompts, {repeats} runs of each method per prompt",
             "| runs used | auto / best llama.cpp mode | none / llama.cpp plain | auto / none |"
             + "".join(f" {m} / none |" for m in modes),
             "|---|---|---|---|" + "---|" * len(modes)]
    for k in [None, *range(repeats)]:
        best = [max(col) for col in zip(*(rates(m, k) for m in modes))]
        plain = (f"{_ratio(rates('none', k), rates('llama.cpp', k)):.2f}x" if "llama.cpp" in modes else "-")
        lines.append(f"| {'median of the ' + str(repeats) if k is None else 'repeat ' + str(k + 1) + ' alone'} | "
                     f"{_ratio(rates('auto', k), best):.2f}x | {plain} | {_ratio(rates('auto', k), rates('none', k)):.2f}x |"
                     + "".join(f" {_ratio(rates(m, k), rates('none', k)):.2f}x |" for m in modes))
    spread = [statistics.pstdev(x["repeat_decode_tokens_per_second"]) / statistics.mean(x["repeat_decode_tokens_per_second"])
              for r in per.values() for x in r]
    lines.append(f"\nrun-to-run spread of one (prompt, method): median {statistics.median(spread):.1%} "
                 f"(standard deviation / mean over its {repeats} runs), largest {max(spread):.1%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="JSON of `pyspec bench --repeats R --json ...` with llama.cpp's modes, none and auto")
    args = parser.parse_args(argv)
    with open(args.report, encoding="utf-8") as f:
        print("\n".join(summarize(json.load(f))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

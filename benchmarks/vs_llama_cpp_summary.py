#!/usr/bin/env python3
"""One line per `pyspec bench` report against llama.cpp's tools: auto / the best llama.cpp mode
of each prompt (the figure of docs/results-speed.md), auto / the suite's best single mode, none / llama.cpp plain
and auto / none (decode tok/s, medians of per-prompt ratios), recomputed from the per-prompt
records, so reports written before a figure existed get it too.

    python benchmarks/vs_llama_cpp_summary.py benchmarks/results/vs_llama_cpp_*_clx.json
    # another pyspec label in auto's place (a bench run of `auto:no-corpus` beside `auto`)
    python benchmarks/vs_llama_cpp_summary.py --method auto:no-corpus benchmarks/results/vs_llama_cpp_mtbench_intel_settle.json
    # one suite run in parts (`--suite 'longedit[10:20]'` after `--n 10`): one row over all prompts
    python benchmarks/vs_llama_cpp_summary.py --merge part1.json part2.json
    # parts run with different methods: only the methods every part ran
    python benchmarks/vs_llama_cpp_summary.py --merge --common-methods part1.json part2.json
    # what the first figure reads when nothing is faster than anything: the noise floor
    python benchmarks/vs_llama_cpp_summary.py --noise-floor benchmarks/results/vs_llama_cpp_mtbench_zen4_repeats3.json
    # runs of the same prompts made apart (whole suites, parts, --repeats runs): every run of a
    # prompt pooled, the median one kept; with --noise-floor, that figure's floor
    python benchmarks/vs_llama_cpp_summary.py --pool run1_part1.json run1_part2.json run2.json
    # the floor a bench with one run per prompt would have at these runs' spread
    python benchmarks/vs_llama_cpp_summary.py --noise-floor --runs 1 --pool run1_part1.json run1_part2.json run2.json
    # each ratio with its 95% bootstrap interval (prompts and their runs resampled)
    python benchmarks/vs_llama_cpp_summary.py --interval --pool run1.json run2.json

The best mode of each prompt is the fastest of several noisy runs; where every mode decodes at
about plain speed (chat, GSM8K) that maximum sits above any one mode's typical run. The suite's
best mode is the one mode with the highest median over the suite, chosen once, as a user
configures one. `--noise-floor` (reports run with `--repeats` 2 or more) says how far: from the
run-to-run spread of the plain-speed methods' decode tok/s (`none` and `llama.cpp`, every run of
every prompt), the figure "auto / best mode of each prompt" would read if auto and every mode
decoded at one true speed, each keeping the report's middle run as the bench does (median and
90% range of the median over the report's prompts; seeded simulation).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

from pyspec.bench import median_run
from pyspec.bench.report import ratio_interval, runs_from_report, versus_best_llama_cpp, versus_best_suite_llama_cpp
from pyspec.data import parse_suite_slice


def common_methods(reports: list[dict]) -> tuple[list[str], list[str]]:
    """The methods every report ran, in the first one's order, and the others (run by some)."""
    methods = [r["method"] for r in reports[0]["results"]]
    shared = [m for m in methods if all(m in {r["method"] for r in report["results"]} for report in reports)]
    every = dict.fromkeys(r["method"] for report in reports for r in report["results"])
    return shared, [m for m in every if m not in shared]


SETTINGS = ("target", "draft", "methods", "llama_cpp_modes", "max_tokens", "threads", "repack", "llama_cpp_repack",
            "huge_pages", "ngram", "head", "temperature", "settle_s", "repeats")
DEFAULTS = {"temperature": 0.0}  # what a report written before the field was added ran with


def _base_suite(suite: str) -> str:
    return parse_suite_slice(suite)[0]


def _common_only(reports: list[dict]) -> list[dict]:
    """The reports with only the methods every one of them ran."""
    keep = set(common_methods(reports)[0])
    return [{**report, "methods": [m for m in report.get("methods", []) if m in keep],
             "llama_cpp_modes": [m for m in report.get("llama_cpp_modes", []) if m in keep],
             "results": [r for r in report["results"] if r["method"] in keep]} for report in reports]


def _check_alike(reports: list[dict], keys: tuple[str, ...], verb: str) -> None:
    first = reports[0]
    for report in reports[1:]:
        if _base_suite(report["suite"]) != _base_suite(first["suite"]):
            raise ValueError(f"cannot {verb} suite {report['suite']!r} into {first['suite']!r}")
        for key in keys:
            ours, theirs = report.get(key, DEFAULTS.get(key)), first.get(key, DEFAULTS.get(key))
            if ours != theirs:
                raise ValueError(f"cannot {verb} reports that differ in {key}: {ours!r} vs {theirs!r}")


def merged(reports: list[dict], common: bool = False) -> dict:
    """One report of a suite run in parts on disjoint prompts (`--suite 'SUITE[A:B]'`), with the
    same methods and settings: the per-prompt records put together (the figures recomputed from
    them; the parts' own figures are not carried). A part with other methods or settings, another
    suite or a prompt already seen is an error. With common, parts may differ in their methods:
    only the methods every part ran are kept (a best mode over fewer modes than a part had)."""
    if common:
        reports = _common_only(reports)
    _check_alike(reports, SETTINGS, "merge")
    first = reports[0]
    out = {key: first[key] for key in SETTINGS if key in first}
    out["results"] = [{"method": r["method"], "per_prompt": list(r["per_prompt"])} for r in first["results"]]
    seen = {x["prompt_id"] for x in first["results"][0]["per_prompt"]}
    for report in reports[1:]:
        ids = {x["prompt_id"] for x in report["results"][0]["per_prompt"]}
        if ids & seen:
            raise ValueError(f"prompts in more than one report: {', '.join(sorted(ids & seen))}")
        seen |= ids
        by_method = {r["method"]: r for r in report["results"]}
        for r in out["results"]:
            r["per_prompt"] += by_method[r["method"]]["per_prompt"]
    out["suite"], out["n"] = _base_suite(first["suite"]), len(seen)
    return out


def _runs_of(record: dict) -> list[dict]:
    """Every run in a per-prompt record: the kept one as it is, the other repeats (`--repeats`)
    as the record with that run's speed and counts (its other fields the kept run's). The repeats'
    speeds are decode tok/s, or wall tok/s for a method without decode timings, as the bench lists
    them."""
    field = "decode_tokens_per_second" if record.get("decode_tokens_per_second") is not None else "tokens_per_second"
    rates = record.get("repeat_decode_tokens_per_second") or [record[field]]
    kept = rates.index(record[field]) if record[field] in rates else -1
    runs = []
    for i, rate in enumerate(rates):
        if i == kept:
            runs.append(record)
            continue
        run = {**record, field: rate, "decode_tokens_per_second_within_limit": None}
        for count in ("n_target_calls", "n_drafted", "n_accepted"):
            if len(record.get(f"repeat_{count}") or []) == len(rates):
                run[count] = record[f"repeat_{count}"][i]
        runs.append(run)
    return runs


def pooled(reports: list[dict], common: bool = False) -> dict:
    """One report from runs of the same suite made apart: whole runs, parts on disjoint prompts,
    `--repeats` runs, in any mix. Per prompt and method every run is pooled and the one with the
    median decode tok/s kept (the lower middle one for an even count), as `--repeats` keeps it
    within one bench run; `repeat_decode_tokens_per_second` lists them all (so `--noise-floor`
    reads the pooled runs). The reports must agree in their methods and settings (not in settle
    time or repeats); every prompt needs the same number of runs of every method. With common, only
    the methods every report ran."""
    if common:
        reports = _common_only(reports)
    keys = tuple(k for k in SETTINGS if k not in ("settle_s", "repeats"))
    _check_alike(reports, keys, "pool")
    first = reports[0]
    runs: dict[str, dict[str, list[dict]]] = {r["method"]: {} for r in first["results"]}
    for report in reports:
        for result in report["results"]:
            for record in result["per_prompt"]:
                runs[result["method"]].setdefault(record["prompt_id"], []).extend(_runs_of(record))
    prompts = list(dict.fromkeys(p for by_prompt in runs.values() for p in by_prompt))
    counts = {(m, p): len(by_prompt.get(p, [])) for m, by_prompt in runs.items() for p in prompts}
    if len(set(counts.values())) > 1:
        (m, p), n = min(counts.items(), key=lambda kv: kv[1])
        raise ValueError(f"unequal runs: {n} of {m} on {p}, {max(counts.values())} elsewhere")

    def kept(method: str, tries: list[dict]) -> dict:  # as the bench keeps one of its repeats
        return asdict(median_run(runs_from_report({"results": [{"method": method, "per_prompt": tries}]})[method])[1])

    out = {key: first[key] for key in keys if key in first}
    out["results"] = [{"method": m, "per_prompt": [kept(m, runs[m][p]) for p in prompts]} for m in runs]
    out["suite"], out["n"], out["repeats"] = _base_suite(first["suite"]), len(prompts), next(iter(counts.values()))
    return out


def summary_row(report: dict, name: str, method: str = "auto", interval: bool = False) -> str:
    """The report's row, `method` (a pyspec label of the report) in auto's place; with interval,
    each ratio's 95% bootstrap interval in brackets after it (pyspec.bench.ratio_interval)."""
    runs = runs_from_report(report)
    modes = [m for m in report.get("llama_cpp_modes", []) if m in runs]

    def ratio(label: str, against: list[str]) -> float | None:
        if label not in runs or not against:
            return None
        return versus_best_llama_cpp(runs[label], runs, against)

    def spread(label: str, against: list[str]) -> list[float] | None:
        if not interval or label not in runs or not against:
            return None
        return ratio_interval(runs[label], [runs[a] for a in against])

    mode, vs_mode = versus_best_suite_llama_cpp(runs[method], runs, modes) if method in runs else (None, None)
    plain = ["llama.cpp"] if "llama.cpp" in runs else []
    none = ["none"] if "none" in runs else []
    cells = [ratio(method, modes), vs_mode, ratio("none", plain), ratio(method, none)]
    intervals = [spread(method, modes), spread(method, [mode] if mode else []), spread("none", plain),
                 spread(method, none)]
    text = ["-" if x is None else f"{x:.2f}x" + (f" [{iv[0]:.2f}-{iv[1]:.2f}]" if iv else "")
            for x, iv in zip(cells, intervals)]
    return (f"| {name} | {report['suite']} | {report['n']} | {report.get('repeats', 1)} | {text[0]} | "
            f"{text[1]}{f' ({mode})' if mode else ''} | {text[2]} | {text[3]} |")


PLAIN_SPEED_METHODS = ("none", "llama.cpp")


def run_spread(report: dict) -> tuple[float, int] | None:
    """The run-to-run standard deviation of log decode tok/s of the plain-speed methods (each
    prompt's runs around their own mean, with the n - 1 correction) and the runs per prompt; None
    without repeats."""
    deviations, n_runs = [], 0
    for result in report["results"]:
        if result["method"] not in PLAIN_SPEED_METHODS:
            continue
        for x in result["per_prompt"]:
            rates = x.get("repeat_decode_tokens_per_second") or []
            if len(rates) < 2:
                continue
            n_runs = len(rates)
            logs = [math.log(r) for r in rates]
            mean = statistics.fmean(logs)
            deviations += [v - mean for v in logs]
    if not deviations:
        return None
    return math.sqrt(sum(d * d for d in deviations) * n_runs / (len(deviations) * (n_runs - 1))), n_runs


def noise_floor(sd: float, n_runs: int, n_modes: int, n_prompts: int, rounds: int = 2000,
                seed: int = 0) -> tuple[float, float, float]:
    """The median over n_prompts prompts of one method's kept run / the fastest of n_modes other
    methods' kept runs, all of one true speed, each run's log speed off it by N(0, sd), each
    method keeping the lower middle of its n_runs runs (as the bench keeps it): the median over
    `rounds` simulated suites and its 5% and 95% points."""
    rng = random.Random(seed)

    def kept() -> float:
        return sorted(rng.gauss(0.0, sd) for _ in range(n_runs))[(n_runs - 1) // 2]

    suites = sorted(statistics.median(math.exp(kept() - max(kept() for _ in range(n_modes)))
                                      for _ in range(n_prompts)) for _ in range(rounds))
    return statistics.median(suites), suites[int(0.05 * rounds)], suites[int(0.95 * rounds)]


def noise_floor_row(report: dict, name: str, runs: int | None = None) -> str:
    """The report's noise floor; with runs, the floor for that many runs per prompt at the
    report's spread (what a one-run bench would read, say)."""
    modes = report.get("llama_cpp_modes", [])
    spread = run_spread(report)
    if spread is None or not modes:
        return f"| {name} | {report['suite']} | - | - | - |"
    sd, n_runs = spread
    n_runs = runs or n_runs
    median, lo, hi = noise_floor(sd, n_runs, len(modes), report["n"])
    return f"| {name} | {report['suite']} | {n_runs} | {sd:.3f} | {median:.2f}x ({lo:.2f}-{hi:.2f}) |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", help="JSON files of `pyspec bench ... --json`")
    parser.add_argument("--method", default="auto",
                        help="the pyspec label compared (default auto; e.g. auto:no-corpus); a report without it "
                             "gets '-' in its columns")
    parser.add_argument("--merge", action="store_true",
                        help="the reports are parts of one suite run on disjoint prompts: one row over all of them")
    parser.add_argument("--noise-floor", action="store_true",
                        help="instead of the figures: the first figure's value when every method decodes at "
                             "one speed, from the report's run-to-run spread (module docstring)")
    parser.add_argument("--runs", type=int, default=None, metavar="N",
                        help="with --noise-floor: the floor for N runs per prompt at the report's spread (default: "
                             "the report's own runs per prompt)")
    parser.add_argument("--pool", action="store_true",
                        help="the reports are runs of the same suite made apart (whole, in parts, with --repeats): "
                             "one row, every run of a prompt pooled and the median one kept")
    parser.add_argument("--interval", action="store_true",
                        help="each ratio's 95%% bootstrap interval in brackets after it: the prompts resampled, and "
                             "each prompt's runs where it ran more than once (with --pool: every pooled run)")
    parser.add_argument("--common-methods", action="store_true",
                        help="with --merge or --pool: the reports may differ in their methods; only those every "
                             "one ran are kept (the ones left out are printed)")
    args = parser.parse_args(argv)
    if args.merge and args.pool:
        parser.error("--merge and --pool are two ways to make one report: choose one")
    if args.runs is not None and (not args.noise_floor or args.runs < 1):
        parser.error("--runs N (N >= 1) goes with --noise-floor")
    if args.common_methods and not (args.merge or args.pool):
        parser.error("--common-methods goes with --merge or --pool")
    m = args.method
    reports = []
    for path in args.reports:
        with open(path, encoding="utf-8") as f:
            reports.append((Path(path).stem, json.load(f)))
    if args.merge or args.pool:
        left_out = common_methods([r for _, r in reports])[1] if args.common_methods else []
        join = merged if args.merge else pooled
        try:
            reports = [(" + ".join(name for name, _ in reports), join([r for _, r in reports], args.common_methods))]
        except ValueError as e:
            parser.error(str(e))
        if left_out:
            print(f"left out (not run in every part): {', '.join(left_out)}\n")
    if args.noise_floor:
        print("| report | suite | runs per prompt | run-to-run sd of log decode tok/s (none, llama.cpp) | "
              "auto / best mode of each prompt at equal speeds: median (90% range) |")
        print("|---|---|---|---|---|")
        for name, report in reports:
            print(noise_floor_row(report, name, args.runs))
        return 0
    print(f"| report | suite | prompts | runs per prompt | {m} / best mode of each prompt | "
          f"{m} / the suite's best mode | none / llama.cpp plain | {m} / none |")
    print("|---|---|---|---|---|---|---|---|")
    for name, report in reports:
        print(summary_row(report, name, m, args.interval))
    return 0


if __name__ == "__main__":
    sys.exit(main())

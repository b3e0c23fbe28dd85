"""The cost model repairs a bad calibration: `auto` planned with a target cost curve
measured while the machine was busy, then run on the quiet machine.

1. The quiet curve: the target's decode time per batch size, measured now (run this script on an
   otherwise idle machine).
2. The loaded curve: the same measurement while --load-procs processes spin on the CPU (or, with
   --scale F, the quiet curve times F).
3. Three engines, the same prompts, interleaved per prompt, greedy `auto`:
   - `quiet`: planned with the quiet curve (the reference);
   - `stale`: planned with the loaded curve, corrections off (auto_adapt_costs=False: what a stale
     calibration cost before the cost model);
   - `repaired`: planned with the loaded curve, corrections on (the default).
   Each engine keeps its own acceptance statistics across the prompts, as a server would.
4. Convergence: each engine's steps (GenerationResult.step_sizes / step_ms, in order) are replayed
   through the engine's own CostModel class from that engine's prior; before each step the model
   predicts its time, and the error is |ln(predicted / measured)|. Reported: the median error
   over windows of steps for each engine, and the first step from which the repaired engine's
   rolling median error (window --window) stays within --tolerance of the quiet engine's median
   error over the whole run. That rule is decided by the run's last slow step, so it is also
   applied to the quiet engine against its own median, and beside it are the first step within
   the tolerance and the share of the later steps that stay within (both engines). The stale
   engine's error is its prior's, never corrected.

    python benchmarks/cost_repair.py --n 8 --json benchmarks/results/cost_repair.json \
        --plot benchmarks/results/cost_repair.png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pyspec import Engine, GenerationConfig, _core
from pyspec.calibration import CostCurve
from pyspec.config import DEFAULT_DRAFT, DEFAULT_TARGET
from pyspec.bench.runner import _top2_gap
from pyspec.data import load_suite

ARMS = ("quiet", "stale", "repaired")


def measure_target_curve(engine: Engine, repeats: int) -> CostCurve:
    return CostCurve._from_core(engine._core.measure_cost(False, "", [], repeats, None))


def measure_under_load(engine: Engine, repeats: int, n_procs: int) -> CostCurve:
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n_procs)]
    try:
        time.sleep(1.0)
        return measure_target_curve(engine, repeats)
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def scaled(curve: CostCurve, factor: float) -> CostCurve:
    return CostCurve(tuple(curve.n_tokens), tuple(m * factor for m in curve.ms))


def prediction_errors(prior: CostCurve, steps: list[tuple[int, float]], corrected: bool) -> list[float]:
    """|ln(predicted / measured)| of each step, predicted before the step is observed."""
    model = _core.CostModel()
    model.set_prior(prior._core())
    errors = []
    for size, ms in steps:
        predicted = model.at(size) if corrected else prior.at(size)
        errors.append(abs(math.log(predicted / ms)))
        model.observe(size, ms)
    return errors


def rolling_median(values: list[float], window: int) -> list[float]:
    return [statistics.median(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def steps_to_converge(rolling: list[float], target: float, tolerance: float) -> int | None:
    """First step from which the rolling error stays within tolerance of target (None: never)."""
    for i in range(len(rolling)):
        if all(e <= target + tolerance for e in rolling[i:]):
            return i
    return None


def first_within(rolling: list[float], target: float, tolerance: float) -> int | None:
    """First step whose rolling error is within tolerance of target (None: none is)."""
    return next((i for i, e in enumerate(rolling) if e <= target + tolerance), None)


def share_within(rolling: list[float], target: float, tolerance: float, start: int) -> float | None:
    """Share of the steps from `start` on whose rolling error is within tolerance of target."""
    later = rolling[start:]
    return sum(e <= target + tolerance for e in later) / len(later) if later else None


WINDOWS = ((0, 10), (10, 50), (50, 200), (200, None))


def window_medians(errors: list[float]) -> dict[str, float | None]:
    out = {}
    for lo, hi in WINDOWS:
        part = errors[lo:hi]
        out[f"{lo}-{hi if hi is not None else 'end'}"] = statistics.median(part) if part else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--suite", default="humaneval")
    p.add_argument("--n", type=int, default=8, help="prompts (default 8)")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--load-procs", type=int, default=2, help="busy processes while the loaded curve is measured")
    p.add_argument("--scale", type=float, default=None, help="instead of measuring under load, scale the quiet curve")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="convergence: rolling median error within this of the quiet engine's (default 0.05)")
    p.add_argument("--window", type=int, default=10, help="rolling window in steps (default 10)")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    args = p.parse_args(argv)

    engines = {arm: Engine(args.target, draft=args.draft, n_threads=args.threads) for arm in ARMS}
    for engine in engines.values():
        engine.calibrate()  # draft curves (and a target curve, replaced below)
    quiet = measure_target_curve(engines["quiet"], args.repeats)
    loaded = (scaled(quiet, args.scale) if args.scale is not None
              else measure_under_load(engines["stale"], args.repeats, args.load_procs))
    configs = {"quiet": GenerationConfig(method="auto", max_tokens=args.max_tokens),
               "stale": GenerationConfig(method="auto", max_tokens=args.max_tokens, auto_adapt_costs=False),
               "repaired": GenerationConfig(method="auto", max_tokens=args.max_tokens)}
    for arm, curve in (("quiet", quiet), ("stale", loaded), ("repaired", loaded)):
        engines[arm]._core.set_cost(False, curve._core(), "")

    prompts = list(load_suite(args.suite, n=args.n))
    rows: list[dict] = []
    steps: dict[str, list[tuple[int, float]]] = {arm: [] for arm in ARMS}
    for i, prompt in enumerate(prompts):
        row = {"prompt": prompt.id}
        outputs = {}
        for arm in ARMS:
            result = engines[arm].generate(list(prompt.messages), configs[arm])
            row[arm] = result.stats.tokens_per_second
            outputs[arm] = result.tokens
            steps[arm] += [(int(k), float(ms)) for k, ms in zip(result.step_sizes, result.step_ms)]
        row["identical"] = outputs["stale"] == outputs["quiet"] == outputs["repaired"]
        for arm in ("stale", "repaired"):  # where greedy outputs part, the target's top-2 logit gap
            a, b = outputs["quiet"], outputs[arm]
            j = next((t for t in range(min(len(a), len(b))) if a[t] != b[t]), None)
            if j is not None:
                context = engines["quiet"].prompt_tokens(list(prompt.messages)) + list(a[:j])
                row[f"divergence_{arm}"] = {"index": j, "top2_logit_gap": _top2_gap(engines["quiet"], context)}
        rows.append(row)
        print(f"[{i + 1}/{len(prompts)}] {prompt.id}: " + ", ".join(f"{a} {row[a]:.1f}" for a in ARMS) + " tok/s",
              file=sys.stderr)

    priors = {"quiet": quiet, "stale": loaded, "repaired": loaded}
    errors = {arm: prediction_errors(priors[arm], steps[arm], corrected=arm != "stale") for arm in ARMS}
    quiet_level = statistics.median(errors["quiet"])
    rolling = rolling_median(errors["repaired"], args.window)
    converged = steps_to_converge(rolling, quiet_level, args.tolerance)
    # "Stays within from step n on" is decided by the last slow step of the run, machine noise as
    # much as the model: the same rule applied to the quiet engine against its own median says how
    # much of it is noise, and the first step within with the share of the steps after it that
    # stay within separate the repair from later excursions.
    rolling_quiet = rolling_median(errors["quiet"], args.window)
    reached = first_within(rolling, quiet_level, args.tolerance)
    reached_quiet = first_within(rolling_quiet, quiet_level, args.tolerance)
    after = {arm: share_within(r, quiet_level, args.tolerance, start) if start is not None else None
             for arm, r, start in (("repaired", rolling, reached), ("quiet", rolling_quiet, reached_quiet))}
    ratio = {arm: statistics.median(r[arm] / r["quiet"] for r in rows) for arm in ARMS}
    first = {arm: rows[0][arm] / rows[0]["quiet"] for arm in ARMS}
    summary = {
        "suite": args.suite, "n": len(rows), "max_tokens": args.max_tokens, "threads": args.threads,
        "loaded": f"scaled x{args.scale}" if args.scale is not None else f"measured with {args.load_procs} busy processes",
        "curves_ms": {"sizes": list(quiet.n_tokens), "quiet": list(quiet.ms), "loaded": list(loaded.ms)},
        "median_ratio_vs_quiet": ratio, "first_prompt_ratio_vs_quiet": first,
        "prediction_error_by_window": {arm: window_medians(errors[arm]) for arm in ARMS},
        "quiet_median_error": quiet_level, "steps_to_converge": converged,
        "quiet_steps_to_converge": steps_to_converge(rolling_quiet, quiet_level, args.tolerance),
        "first_step_within": {"repaired": reached, "quiet": reached_quiet}, "share_within_after_first": after,
        "tolerance": args.tolerance,
        "window": args.window, "n_steps": {arm: len(steps[arm]) for arm in ARMS},
        "all_identical": all(r["identical"] for r in rows), "rows": rows, "errors": errors,
    }
    loaded_over_quiet = [l / q for l, q in zip(loaded.ms, quiet.ms)]
    print(f"loaded curve / quiet curve per size {list(quiet.n_tokens)}: "
          + ", ".join(f"{r:.2f}" for r in loaded_over_quiet))
    print(f"auto tok/s, median over {len(rows)} prompts as a ratio of the quiet-calibrated engine: "
          f"stale {ratio['stale']:.2f}x, repaired {ratio['repaired']:.2f}x (first prompt: stale {first['stale']:.2f}x, "
          f"repaired {first['repaired']:.2f}x)")
    for arm in ARMS:
        w = summary["prediction_error_by_window"][arm]
        print(f"{arm:9s} step-time prediction error |ln(predicted/measured)|, median over steps "
              + ", ".join(f"{k}: {v:.3f}" for k, v in w.items() if v is not None))
    print(f"repaired: rolling median error (window {args.window}) within {args.tolerance} of the quiet engine's "
          f"({quiet_level:.3f}) from step {converged} of {len(steps['repaired'])} on; "
          f"greedy outputs identical across the three: {summary['all_identical']}")
    print(f"  the quiet engine by the same rule from step {summary['quiet_steps_to_converge']}; first step within: "
          f"repaired {reached}, quiet {reached_quiet}; steps within after it: "
          + ", ".join(f"{arm} {after[arm]:.0%}" for arm in ("repaired", "quiet") if after[arm] is not None))
    for r in rows:
        for arm in ("stale", "repaired"):
            if f"divergence_{arm}" in r:
                d = r[f"divergence_{arm}"]
                print(f"  {r['prompt']}: {arm} parts from quiet at token {d['index']}, "
                      f"top-2 logit gap {d['top2_logit_gap']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for arm in ARMS:
            ax1.plot(range(len(errors[arm])), rolling_median(errors[arm], args.window), label=arm)
        ax1.set_xlabel("target steps decoded")
        ax1.set_ylabel(f"|ln(predicted / measured step time)|\nrolling median of {args.window} steps")
        ax1.set_xscale("symlog", linthresh=10)
        ax1.set_title("cost model: step-time prediction error")
        ax1.legend()
        x = range(1, len(rows) + 1)
        for arm in ARMS:
            ax2.plot(x, [r[arm] for r in rows], marker="o", label=arm)
        ax2.set_xlabel("prompt")
        ax2.set_ylabel("auto decode tok/s")
        ax2.set_title(f"{args.suite}, {args.max_tokens} tokens")
        ax2.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

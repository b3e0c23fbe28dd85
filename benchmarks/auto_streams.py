"""Replays `auto` on streams that change kind (HumanEval answers, then MT-Bench questions, in one
engine), with and without its check of the earlier requests' statistics against each request's
own outcomes (AcceptanceStats::begin_request, AutoParams.check_history), on recorded greedy
outputs, without the model (`_core.replay_auto`, see benchmarks/auto_replay.py for what a replay
models and leaves out).

    python benchmarks/auto_streams.py          # the recorded Zen 4 outputs below
    python benchmarks/auto_streams.py --alone --per-prompt

For each stream FIRST -> THEN: every FIRST request is replayed, then every THEN request in turn,
statistics carried across them as in one engine (phrase pool off, so that no request copies an
earlier one's answer); each THEN request's modelled speed is divided by a fresh engine's on the
same request (a replay of it alone), and the geometric mean of those ratios is printed, over all
of THEN's requests and over its first three (the start of the new stream, where the change
costs most); with --alone, also each THEN request replayed right after FIRST's alone. Then per
suite, as `pyspec bench` runs it: every request in turn, modelled `auto` / `none` (geometric
mean), beside a fresh engine per request. Modelled speed: each step charged the cached calibration's time of its
size (`pyspec calibrate`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from auto_replay import TARGET, model_cost, prompt_tokens, recorded_runs, target_calibration
from pyspec import Engine, _core
from pyspec.config import GenerationConfig

RESULTS = Path(__file__).resolve().parent / "results"
SUITES = {
    "humaneval": "vs_llama_cpp_humaneval_zen4_repeats3.json",
    "edit": "vs_llama_cpp_edit_zen4_substitutions.json",
    "longedit": "vs_llama_cpp_longedit_zen4_repeats3_0-4.json",
    "mtbench": "vs_llama_cpp_mtbench_zen4_repeats3.json",
    "gsm8k": "vs_llama_cpp_gsm8k_zen4_repeats2.json",
}
STREAMS = [("humaneval", "mtbench"), ("humaneval", "gsm8k"), ("edit", "longedit"), ("longedit", "mtbench"),
           ("mtbench", "humaneval"), ("gsm8k", "edit")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-prompt", action="store_true", help="each THEN request's ratio to a fresh engine")
    ap.add_argument("--alone", action="store_true",
                    help="also each THEN request alone right after FIRST's requests (the first of a new stream)")
    args = ap.parse_args()

    engine = Engine(TARGET, n_ctx=4096, n_threads=2)
    curve = target_calibration(engine)._core()
    core = GenerationConfig(method="auto").to_core()
    lookup, pool = core.lookup, core.pool
    lookup.stop_tokens = engine._core.control_tokens()  # as the engine
    lookup.blank_line_tokens, lookup.unit_start_tokens, lookup.fence_tokens = engine._core.layout_tokens()
    schedulers = {}
    for check in (True, False):
        schedulers[check] = GenerationConfig(method="auto").to_core().scheduler
        schedulers[check].check_history = check

    requests: dict[str, list[tuple[list[int], list[int]]]] = {}
    for name, file in SUITES.items():
        suite, runs = recorded_runs(RESULTS / file)
        prompts = prompt_tokens(engine, suite, len(runs))
        requests[name] = [(prompts[pid], tokens) for pid, tokens in runs if tokens]

    def replay(reqs: list[Any], check: bool) -> list[Any]:
        return _core.replay_auto(reqs, curve, lookup, pool, schedulers[check], 1)

    def speed(sizes: list[int], output: list[int]) -> float:  # tokens per modelled second
        return len(output) / model_cost(curve, list(sizes)) * 1e3

    fresh = {name: [speed(replay([r], True)[0][0], r[1]) for r in reqs] for name, reqs in requests.items()}
    print("stream FIRST -> THEN: THEN's modelled speed / a fresh engine's (geometric mean; its first 3)")
    for first, then in STREAMS:
        row = []
        for check in (False, True):
            steps = replay(requests[first] + requests[then], check)[len(requests[first]):]
            ratios = [speed(s[0], r[1]) / f for s, r, f in zip(steps, requests[then], fresh[then])]
            row.append(f"{'checked' if check else 'counts alone'} {statistics.geometric_mean(ratios):.3f} "
                       f"({statistics.geometric_mean(ratios[:3]):.3f})")
            if args.per_prompt:
                print(f"    {'checked' if check else 'counts alone'}: " + " ".join(f"{x:.2f}" for x in ratios))
        print(f"  {first:>9} -> {then:<9} " + ";  ".join(row))
        if args.alone:  # each THEN request right after FIRST's, none of THEN's before it
            alone = []
            for check in (False, True):
                ratios = [speed(replay(requests[first] + [r], check)[-1][0], r[1]) / f
                          for r, f in zip(requests[then], fresh[then])]
                alone.append(f"{'checked' if check else 'counts alone'} {statistics.geometric_mean(ratios):.3f} "
                             f"(worst {min(ratios):.2f})")
            print(f"  {'each alone after it':>22} " + ";  ".join(alone))
    print("one suite in turn, as pyspec bench runs it: modelled auto / none (geometric mean), and with a fresh "
          "engine per request")
    for name, reqs in requests.items():
        row = [f"fresh {statistics.geometric_mean(fresh[name]) / (1e3 / curve.at(1)):.3f}"]
        for check in (False, True):
            steps = replay(reqs, check)
            ratios = [speed(s[0], r[1]) / (1e3 / curve.at(1)) for s, r in zip(steps, reqs)]
            row.append(f"{'checked' if check else 'counts alone'} {statistics.geometric_mean(ratios):.3f}")
        print(f"  {name:<9} " + ";  ".join(row))
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

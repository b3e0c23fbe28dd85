"""A ReDrafter head against the draft model, on held-out prompts (not used to train the head).

    # quality (not timing-sensitive: run under `heavy`; resumable per prompt and drafter, so
    # the draft model's runs can be made before the head exists)
    python benchmarks/head_eval.py quality --head HEAD.gguf --out DIR --methods beam \
        --prompts 'humaneval[156:164]' --prompts 'mtbench[72:80]' --prompts 'gsm8k[1311:1319]'
    python benchmarks/head_eval.py quality --head HEAD.gguf --out DIR --methods redrafter ...
    # speed (timing: run under `quiet`, briefly)
    python benchmarks/head_eval.py speed --head HEAD.gguf --out DIR --per-suite 1
    # the tables, and what `auto`'s planner predicts with a flat (GPU-like) verification curve
    python benchmarks/head_eval.py report --out DIR

quality: greedy, chat template, for every prompt plain decoding (`none`) once, then the head
(`redrafter`) and/or the draft model (`beam`) with beams 1x5, 2x5 and 4x5: tokens per target
call, acceptance at depth 1..5 and whether each output equals plain decoding's. Acceptance at
depth k comes from the 1x5 runs, which are greedy chains: among the steps that drafted and
accepted at least k - 1 tokens, the share that accepted at least k (a step whose chain was
shorter than k counts as not accepted at k). One JSON file per prompt in OUT/quality/.

speed: one process, the machine alone (`quiet`). First the cost of one step, medians of
interleaved repeats: a target one-token decode, a draft-model one-token decode (both through
Engine.evaluate, from an empty cache), a head step of 1, 2 and 4 rows (DraftHead.step on a real
hidden state). Then tokens/s of none, the head, the draft model's chain and beam on a few prompts
per suite, methods interleaved per prompt; their in-generation costs too (the target's ms per
token in `none`, drafting ms per step of each drafter). OUT/speed.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pyspec import Engine, _core
from pyspec.data import load_prompt_slices
from pyspec.results import depth_counts

SHAPES = ((1, 5), (2, 5), (4, 5))
DEPTH = 5
DEFAULT_PROMPTS = ("humaneval[156:164]", "mtbench[72:80]", "gsm8k[1311:1319]")
DRAFTERS = (("redrafter", "head"), ("beam", "0.5B draft"))


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"1x5,4x5" -> [(1, 5), (4, 5)]: shapes of SHAPES only, since the report reads those."""
    shapes = []
    for part in text.split(","):
        k, _, length = part.strip().partition("x")
        if not (k.isdigit() and length.isdigit()) or (int(k), int(length)) not in SHAPES:
            raise SystemExit(f"--shapes takes some of {', '.join(f'{a}x{b}' for a, b in SHAPES)}, got {text!r}")
        shapes.append((int(k), int(length)))
    return shapes


def record_path(out: Path, prompt_id: str) -> Path:
    return out / f"{prompt_id.replace('/', '_')}.json"


def run_quality(args: argparse.Namespace) -> None:
    out = Path(args.out) / "quality"
    out.mkdir(parents=True, exist_ok=True)
    # Suites round-robin, so that a run stopped early (--limit) has some prompts of each.
    groups = [load_prompt_slices([spec]) for spec in args.prompts]
    prompts = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
    keys = [(m, k, length) for m in args.methods for k, length in parse_shapes(args.shapes)]

    def missing(p: Any) -> list[tuple[str, int, int]]:
        path = record_path(out, p.id)
        have = json.loads(path.read_text()) if path.exists() else {}
        return [(m, k, length) for m, k, length in keys if f"{m}:{k}x{length}" not in have]

    todo = [p for p in prompts if missing(p)][: args.limit]
    if not todo:
        print("all prompts done")
        return
    if "redrafter" in args.methods and not args.head:
        raise SystemExit("--methods redrafter needs --head")
    head = args.head if "redrafter" in args.methods else None
    with Engine(args.target, draft=args.draft, head=head, n_ctx=4096, n_threads=args.threads) as engine:
        for p in todo:
            path = record_path(out, p.id)
            record: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"id": p.id, "suite": p.suite}
            if "plain_top2_gaps" not in record:
                # return_logits: the rows plain decoding chose from (one-token decodes), whose
                # top-2 gap is what a divergence is judged by.
                plain = engine.generate(p.messages, max_tokens=args.max_tokens, method="none", return_logits=True)
                record.update(plain_tokens=list(plain.tokens), n_tokens=len(plain.tokens),
                              plain_top2_gaps=top2_gaps(plain.logits))
            for method, k, length in missing(p):
                r = engine.generate(p.messages, max_tokens=args.max_tokens, method=method, beams=k,
                                    beam_length=length, return_logits=True)
                s = r.stats
                record[f"{method}:{k}x{length}"] = entry = {
                    "tokens_per_target_call": s.tokens_per_target_call, "n_generated": s.n_generated,
                    "n_target_calls": s.n_target_calls, "n_accepted": s.n_accepted, "n_drafted": s.n_drafted,
                    "n_candidate_tokens": s.n_candidate_tokens, "n_empty_drafts": s.n_empty_drafts,
                    "depth_counts": depth_counts(s.accept_histogram, s.n_empty_drafts, DEPTH),
                    "identical": list(r.tokens) == record["plain_tokens"],
                }
                if not entry["identical"]:
                    entry["divergence"] = divergence(record["plain_tokens"], record["plain_top2_gaps"], list(r.tokens),
                                                     r.logits)
                path.write_text(json.dumps(record))
            print(p.id, {key: round(v["tokens_per_target_call"], 2) for key, v in record.items() if isinstance(v, dict)},
                  flush=True)


def top2_gaps(logits: np.ndarray) -> list[float]:
    """[n_tokens] the gap between the two largest logits of each row of [n_tokens, n_vocab]."""
    top2 = np.partition(logits, -2, axis=1)[:, -2:]
    return [round(float(g), 4) for g in top2[:, 1] - top2[:, 0]]


def divergence(plain: list[int], plain_gaps: list[float], other: list[int], other_logits: np.ndarray
               ) -> dict[str, Any]:
    """Where `other` first leaves plain decoding's tokens, judged on the rows each run chose from:
    plain decoding's top-2 logit gap there (its one-token decode; a gap < 0.25 is a near-tie that
    batched and one-token logits can flip on this backend) and, in the other run's own row (a
    batched verification), logit[plain token] - logit[other token] (negative: the flip).
    A from-scratch evaluation of the prefix is a third computation with its own rounding and is
    not used: on gsm8k/1311 it gave 0.332 where plain decoding's own row had 0.200."""
    i = next((j for j, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    entry: dict[str, Any] = {"index": i, "plain": plain[i] if i < len(plain) else None,
                             "other": other[i] if i < len(other) else None}
    if i < len(plain) and i < len(other):
        entry["top2_gap"] = plain_gaps[i]
        entry["other_row_gap"] = round(float(other_logits[i][plain[i]] - other_logits[i][other[i]]), 4)
    return entry


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def run_speed(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = [p for spec in args.prompts for p in load_prompt_slices([spec])[: args.per_suite]]
    result: dict[str, Any] = {"max_tokens": args.max_tokens, "prompts": [p.id for p in prompts]}
    with Engine(args.target, draft=args.draft, head=args.head, n_ctx=4096, n_threads=args.threads) as engine:
        head = engine._core.load_head(args.head)
        tokens = engine.prompt_tokens(prompts[0].messages)
        _, hidden = engine.evaluate_hidden(tokens)
        d = hidden.shape[1]
        one_token = [tokens[-1]]
        costs: dict[str, list[float]] = {"target": [], "draft": [], "head1": [], "head2": [], "head4": []}
        inputs = {n: (np.ascontiguousarray(np.repeat(hidden[-1:], n, axis=0), dtype=np.float32),
                      np.zeros((n, d), np.float32), [head.row_of(t) for t in tokens[-n:]]) for n in (1, 2, 4)}
        for _ in range(args.rounds):
            costs["target"].append(median_ms(lambda: engine.evaluate(one_token), 3))
            costs["draft"].append(median_ms(lambda: engine.evaluate(one_token, draft=True), 3))
            for n, (h, s, rows) in inputs.items():
                costs[f"head{n}"].append(median_ms(lambda: head.step(h, s, rows), 5))
        med = {k: statistics.median(v) for k, v in costs.items()}
        result["cost_ms"] = med
        methods = [("none", {}), ("redrafter", dict(beams=args.beams, beam_length=5)),
                   ("chain", dict(n_draft=args.n_draft)), ("beam", dict(beams=args.beams, beam_length=5)),
                   ("auto", {})]  # auto weighs the head (and the draft model) against plain decoding
        engine.generate(prompts[0].messages, max_tokens=8, method="none")  # warm-up
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m, _ in methods}
        for p in prompts:
            for method, options in methods:
                r = engine.generate(p.messages, max_tokens=args.max_tokens, method=method, **options)
                s = r.stats
                runs[method].append({"id": p.id, "tokens_per_second": s.tokens_per_second, "tokens": list(r.tokens),
                                     "tokens_per_target_call": s.tokens_per_target_call,
                                     "n_generated": s.n_generated, "n_target_calls": s.n_target_calls,
                                     "t_draft_ms": s.t_draft_ms, "t_verify_ms": s.t_verify_ms,
                                     "t_decode_ms": s.t_total_ms - s.t_prefill_ms,
                                     "n_head_drafts": s.n_head_drafts, "n_head_accepted": s.n_head_accepted,
                                     "n_draft_decodes": s.n_draft_decodes})
        result["methods"] = {m: dict(options) for m, options in methods}
        result["runs"] = runs
    (out / "speed.json").write_text(json.dumps(result))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


def pooled_depth_acceptance(records: list[dict[str, Any]], method: str) -> list[float]:
    c = np.sum([r[f"{method}:1x5"]["depth_counts"] for r in records], axis=0)
    return [c[k] / c[k - 1] if c[k - 1] else float("nan") for k in range(1, DEPTH + 1)]


def flat_chain_prediction(acceptance: list[float], draft_ms: float, target_ms: float) -> tuple[int, float, float]:
    """The best chain length on a flat verification curve (any step costs one target token) for
    per-depth acceptance a_1..a_L and drafting cost draft_ms per token: expected tokens
    E(g) = 1 + sum_{k<=g} a_1...a_k, time g * draft_ms + target_ms; returns (g, E(g), speedup
    over plain decoding = E(g) * target_ms / time)."""
    best = (0, 1.0, 1.0)
    tokens, reach = 1.0, 1.0
    for g, a in enumerate(acceptance, start=1):
        reach *= a
        tokens += reach
        speedup = tokens * target_ms / (g * draft_ms + target_ms)
        if speedup > best[2]:
            best = (g, tokens, speedup)
    return best


def report(args: argparse.Namespace) -> None:
    out = Path(args.out)
    records = [json.loads(f.read_text()) for f in sorted((out / "quality").glob("*.json"))]
    speed = json.loads((out / "speed.json").read_text()) if (out / "speed.json").exists() else None
    drafters = [(m, name) for m, name in DRAFTERS if any(f"{m}:1x5" in r for r in records)]
    # Prompts with every drafter's greedy chain (1x5); the beam shapes that all of them have.
    complete = [r for r in records if all(f"{m}:1x5" in r for m, _ in drafters)]
    if len(complete) < len(records):
        print(f"({len(records) - len(complete)} prompts with runs missing left out)")
    records = complete
    shapes = [(k, l) for k, l in SHAPES if all(f"{m}:{k}x{l}" in r for r in records for m, _ in drafters)]
    if len(shapes) < len(SHAPES):
        print(f"(beam shapes {', '.join(f'{k}x{l}' for k, l in SHAPES if (k, l) not in shapes)} missing on some "
              "prompts: left out)")
    suites = sorted({r["suite"] for r in records})
    counts = ", ".join(f"{s} {sum(r['suite'] == s for r in records)}" for s in suites)
    print(f"held-out prompts: {len(records)} ({counts})")
    print("\nacceptance at depth k (greedy chains of 5 = beams 1x5), pooled over steps that drafted\n")
    print("| suite | drafter | depth 1 | 2 | 3 | 4 | 5 |")
    print("|---|---|---|---|---|---|---|")
    acceptance: dict[str, list[float]] = {}
    for suite in suites + ["all"]:
        rs = [r for r in records if suite in ("all", r["suite"])]
        for method, name in drafters:
            acc = pooled_depth_acceptance(rs, method)
            if suite == "all":
                acceptance[method] = acc
            print(f"| {suite} | {name} | " + " | ".join(f"{a:.2f}" for a in acc) + " |")
    print("\ntokens per target call (generated / target calls, pooled); outputs identical to plain decoding\n")
    print("| suite | " + " | ".join(f"{name} {k}x{l}" for _, name in drafters for k, l in shapes) + " |")
    print("|---|" + "---|" * (len(drafters) * len(shapes)))
    summary: dict[str, float] = {}
    for suite in suites + ["all"]:
        rs = [r for r in records if suite in ("all", r["suite"])]
        cells = []
        for method, _ in drafters:
            for k, length in shapes:
                key = f"{method}:{k}x{length}"
                gen = sum(r[key]["n_generated"] for r in rs)
                calls = sum(r[key]["n_target_calls"] for r in rs)
                same = sum(r[key]["identical"] for r in rs)
                if suite == "all":
                    summary[key] = gen / calls
                cells.append(f"{gen / calls:.2f} ({same}/{len(rs)})")
        print(f"| {suite} | " + " | ".join(cells) + " |")
    diverged = [(r["id"], key, v["divergence"]) for r in records for key, v in r.items()
                if isinstance(v, dict) and "divergence" in v]
    if diverged:
        print("\noutputs that left plain decoding's: first differing token and the target's top-2 logit gap there\n")
        for pid, key, d in diverged:
            if "top2_gap" not in d:
                print(f"- {pid} {key}: token {d['index']}, one output is a prefix of the other")
            elif "other_row_gap" in d:
                print(f"- {pid} {key}: token {d['index']}, gap {d['top2_gap']:.3f} in plain decoding's row, "
                      f"{d['other_row_gap']:.3f} in the run's own")
            else:
                print(f"- {pid} {key}: token {d['index']}, gap {d['top2_gap']:.3f} (prefix evaluated from scratch)")
    if not speed:
        return
    med = speed["cost_ms"]
    runs = speed["runs"]
    none = {r["id"]: r for r in runs["none"]}
    # The target's cost of one token while decoding: `none`'s decode time per generated token.
    target_ms = sum(r["t_decode_ms"] for r in runs["none"]) / sum(r["n_generated"] for r in runs["none"])
    print("\ncost of one step, medians of interleaved repeats (ms; fraction of one target token in `none`'s "
          f"decoding, {target_ms:.1f} ms)\n")
    print("| target one-token decode | draft-model one-token decode | head step, 1 row | 2 rows | 4 rows |")
    print("|---|---|---|---|---|")
    print(f"| {med['target']:.1f} ({med['target'] / target_ms:.2f}) | {med['draft']:.1f} ({med['draft'] / target_ms:.3f}) | "
          + " | ".join(f"{med[f'head{n}']:.2f} ({med[f'head{n}'] / target_ms:.3f})" for n in (1, 2, 4)) + " |")
    print("\ndrafting time per target call inside generation (t_draft / target calls, pooled over prompts)\n")
    for method, rs in runs.items():
        if method != "none":
            per_call = sum(r["t_draft_ms"] for r in rs) / sum(r["n_target_calls"] for r in rs)
            print(f"- {method}: {per_call:.2f} ms ({per_call / target_ms:.3f} of a target token)")
    print("\ntokens/s (generation, prefill excluded), medians over prompts; vs none = median of per-prompt ratios\n")
    print("| method | tok/s | vs none | tokens/target call | identical to none |")
    print("|---|---|---|---|---|")
    for method, rs in runs.items():
        tps = [r["tokens_per_second"] for r in rs]
        ratio = [r["tokens_per_second"] / none[r["id"]]["tokens_per_second"] for r in rs]
        same = sum(r["tokens"] == none[r["id"]]["tokens"] for r in rs)
        opts = speed["methods"][method]
        label = method + (f" {opts['beams']}x5" if "beams" in opts else f" {opts['n_draft']}" if opts else "")
        tpc = statistics.median(r["tokens_per_target_call"] for r in rs)
        print(f"| {label} | {statistics.median(tps):.1f} | {statistics.median(ratio):.2f}x | {tpc:.2f} | {same}/{len(rs)} |")
    if "auto" in runs and all("n_head_drafts" in r for r in runs["auto"]):
        a = runs["auto"]
        print(f"\nauto: {sum(r['n_head_drafts'] for r in a)} head chains drafted, "
              f"{sum(r['n_head_accepted'] for r in a)} head tokens accepted, "
              f"{sum(r['n_draft_decodes'] for r in a)} draft-model decodes, "
              f"{sum(r['n_target_calls'] for r in a)} target calls over {len(a)} prompts")
    if "redrafter" not in acceptance:
        return
    print("\nflat verification curve (GPU-like: a step of any size costs one target token, T = "
          f"{target_ms:.1f} ms), drafting costs as measured here\n")
    head_ms = {n: med[f"head{n}"] for n in (1, 2, 4)}
    acc = acceptance["redrafter"]
    g, tokens, speedup = flat_chain_prediction(acc, head_ms[1], target_ms)
    alpha = float(np.exp(np.mean(np.log(acc))))
    plan = _core.plan_chain(alpha, [0.0] + [target_ms] * (DEPTH + 1), head_ms[1], DEPTH)
    print(f"- head chain, per-depth acceptance {[round(float(a), 3) for a in acc]}: best length {g}, {tokens:.2f} tokens "
          f"per step, predicted {speedup:.2f}x over plain decoding")
    print(f"- auto's chain planner (spec::plan_chain) with one acceptance alpha = {alpha:.3f} (geometric mean of "
          f"the depths): length {plan.gamma}, {plan.expected_tokens:.2f} tokens per step, "
          f"predicted {plan.expected_tokens * target_ms / plan.ms:.2f}x")
    for k, length in shapes:
        cost = head_ms[1] + (length - 1) * head_ms[k]  # the root row, then k beams per step
        tpc = summary[f"redrafter:{k}x{length}"]
        print(f"- head beams {k}x{length}: {tpc:.2f} tokens per call (measured), drafting {cost:.2f} ms "
              f"({cost / target_ms:.3f} T): predicted {tpc * target_ms / (target_ms + cost):.2f}x")
    if "beam" in acceptance:
        acc = acceptance["beam"]
        g, tokens, speedup = flat_chain_prediction(acc, med["draft"], target_ms)
        print(f"- 0.5B draft chain, per-depth acceptance {[round(float(a), 3) for a in acc]}, {med['draft']:.1f} ms per token: "
              f"best length {g}, {tokens:.2f} tokens per step, predicted {speedup:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    for mode in ("quality", "speed", "report"):
        p = sub.add_parser(mode)
        p.add_argument("--out", required=True)
        if mode == "report":
            continue
        p.add_argument("--head", required=mode == "speed", help="head GGUF (quality: needed for redrafter)")
        p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
        p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
        p.add_argument("--prompts", action="append", default=None)
        p.add_argument("--max-tokens", type=int, default=128 if mode == "quality" else 96)
        p.add_argument("--threads", type=int, default=2)
        if mode == "quality":
            p.add_argument("--limit", type=int, default=None, help="prompts per call (resumable)")
            p.add_argument("--methods", nargs="+", choices=[m for m, _ in DRAFTERS], default=[m for m, _ in DRAFTERS])
            p.add_argument("--shapes", default=",".join(f"{k}x{l}" for k, l in SHAPES),
                           help="beam shapes to run, some of 1x5,2x5,4x5 (default all)")
        else:
            p.add_argument("--per-suite", type=int, default=2)
            p.add_argument("--rounds", type=int, default=5)
            p.add_argument("--beams", type=int, default=1)
            p.add_argument("--n-draft", type=int, default=4)
    args = ap.parse_args()
    if getattr(args, "prompts", None) is None and args.mode != "report":
        args.prompts = list(DEFAULT_PROMPTS)
    {"quality": run_quality, "speed": run_speed, "report": report}[args.mode](args)


if __name__ == "__main__":
    main()

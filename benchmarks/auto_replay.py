"""Replays `auto` on recorded greedy outputs, without the model: what it would draft, what each
step would accept, and what the steps would cost under a calibration curve.

With greedy decoding the committed tokens do not depend on the drafts, so `none`'s outputs from a
`pyspec bench --json` file (or generated here and cached) fix them; the scheduler's decisions then
depend only on those tokens, its acceptance statistics and the cost curve (the engine's
`_core.replay_auto`, spec/replay.h). Each step is charged the curve's time of its size, so a
scheduling change can be judged in seconds on a busy machine; the curve is the cached
calibration of the target (`pyspec calibrate`, taken on a quiet machine at a short context);
`--actual-curve` charges the steps another curve's times instead (one measured at a long context
by benchmarks/context_cost.py) while `auto` still plans from the calibration and corrects its
cost model from what the steps cost, as the engine does on a long prompt. It compares scheduling
rules of `auto` with each other; against llama.cpp's own speculation, only `pyspec bench` with
its llama.cpp peers on a quiet machine measures anything.

    python benchmarks/auto_replay.py --bench benchmarks/results/vs_llama_cpp_humaneval.json
    python benchmarks/auto_replay.py --suite edit --n 20 --max-tokens 192   # generates, cached

The replay tokenizes and charges with the report's target (`--target` names another; suites
generated here use Qwen2.5-Coder-1.5B unless it does), with flash attention as the engine
decides or `$PYSPEC_FLASH_ATTN` says: the calibration must match the bench's setting.

Prints per suite: modelled tokens/s of `none` and `auto`, their ratio (median of per-prompt
ratios), tokens per target call and the share of plain steps; `--per-prompt` for a
row per prompt. What the replay leaves out: the draft model (auto's proposals are prompt lookup
and pool phrases only) and the pool's harvest of rejected drafts.

`--copy-optimum` also models, on the same outputs and curve, llama.cpp's ngram-simple mode step by
step (its draft counts checked against the tool's own in the bench file) and the least time any
drafter of copies could take (an oracle): how far a goal against llama.cpp's n-gram modes is
within reach of copying, and how much of that `auto` takes (docs/results-speed.md, "How far
copying can go on the Zen 4"). `--trace PROMPT_ID` prints that prompt's output position by
position with the optimum's steps beside `auto`'s: where `auto` starts a copy later than the
oracle, or drafts into a break. `--regret` sums, over a suite, the modelled time `auto` spends
beyond the copy optimum by where in the answer each of its steps starts (how much of the gap is
the answers' first tokens). `--prior-curve` plans from another curve than the calibration.

What `auto` learns carries from one request to the next, so a change to it moves every later
step, and the order of the requests alone shifts a suite's modelled figure by a few percent: a
deep step lands on a copy's break in one order and not in another. `--shuffles N` also replays
each suite in N shuffled orders (seeds 0 .. N-1, the same for every run of the script) and
prints the total modelled time of `none` over `auto`'s in each: two variants compared order by
order (two runs of the script, one with a flag) tell a change from that luck.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from pyspec import Engine, _core
from pyspec import calibration
from pyspec.config import GenerationConfig
from pyspec.bench import suite_prompts
from pyspec.data import load_suite
from pyspec.models import Cache

TARGET = "qwen2.5-coder-1.5b-instruct"
OPTIMUM_MAX_DEPTH = 192  # the copy optimum's deepest step (auto's own cap is auto_max_depth, 64)


def recorded_runs(bench_json: Path | dict[str, Any]) -> tuple[str, list[tuple[str, list[int]]]]:
    """(suite, [(prompt id, none's tokens)]) from a `pyspec bench --json` file (or its content)."""
    data = json.loads(bench_json.read_text(encoding="utf-8")) if isinstance(bench_json, Path) else bench_json
    none = next((r for r in data["results"] if r["method"] == "none"), None)
    if none is None:
        raise SystemExit(f"{bench_json}: no `none` results to replay")
    return data["suite"], [(p["prompt_id"], list(p["tokens"])) for p in none["per_prompt"]]


def tool_drafted(data: dict[str, Any], method: str) -> dict[str, int]:
    """Per prompt id: the draft tokens a llama.cpp tool counted in a `pyspec bench --json` report
    (its own `n_drafted`), for the prompts it ran; empty without that method."""
    runs = next((r for r in data["results"] if r["method"] == method), None)
    if runs is None:
        return {}
    return {p["prompt_id"]: int(p["n_drafted"]) for p in runs["per_prompt"] if p.get("n_drafted") is not None}


def generated_runs(engine: Engine, suite: str, n: int, max_tokens: int) -> list[tuple[str, list[int]]]:
    """`none`'s greedy outputs for the suite's first n prompts, cached by suite, n and length."""
    path = Cache.default().root / "replay" / f"{suite}-{n}-{max_tokens}.json"
    if path.exists():
        return [(pid, tokens) for pid, tokens in json.loads(path.read_text(encoding="utf-8"))]
    runs = []
    for i, p in enumerate(load_suite(suite, n=n)):
        r = engine.generate(list(p.messages), max_tokens=max_tokens, method="none")
        runs.append((str(p.id), list(r.tokens)))
        print(f"generated {i + 1}/{n}: {p.id} ({len(r.tokens)} tokens)", file=sys.stderr, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runs), encoding="utf-8")
    return runs


def prompt_tokens(engine: Engine, suite: str, n: int) -> dict[str, list[int]]:
    """The prompts as `pyspec bench` feeds them: chat template applied, then tokenized. suite is
    what the bench recorded (SUITE or SUITE[A:B]), read as the bench reads it."""
    return {str(p.id): engine.prompt_tokens(list(p.messages)) for p in suite_prompts(suite, n)[1]}


def target_calibration(engine: Engine) -> calibration.CostCurve:
    """The cached calibration of the engine's target (what the replay charges and plans with)."""
    curve = calibration.load_cached(calibration.cache_key(engine, None))
    if curve is None:
        raise SystemExit("no cached calibration for the target: run `pyspec calibrate` on a quiet machine first")
    return curve


def replay_target(target: str | None, benches: list[Path]) -> str:
    """The target whose tokenizer and calibration a replay uses: `target` when given, else the
    first bench report's (its outputs are that model's tokens), else TARGET."""
    if target:
        return target
    if benches:
        recorded = json.loads(benches[0].read_text(encoding="utf-8")).get("target")
        if recorded:
            return str(recorded)
    return TARGET


def model_cost(curve: Any, sizes: list[int]) -> float:
    return sum(curve.at(k) for k in sizes)


def total_speedup(requests: list[tuple[list[int], list[int]]], replayed: list[Any], curve: Any) -> float:
    """Modelled time of decoding every request's output plainly over the replayed steps' time."""
    return (sum(len(output) for _, output in requests) * curve.at(1)
            / sum(model_cost(curve, list(sizes)) for sizes, _, _ in replayed))


def copy_bound_sizes(prompt: list[int], output: list[int], curve: Any, max_depth: int = 64) -> list[int]:
    """Step sizes of a drafter that knows the output but drafts only copies: after the target's
    token, exactly the longest run of what follows that occurs somewhere in the context (prompt
    and output so far, up to max_depth tokens), when verifying it costs less than decoding it
    plainly. A reference for copy drafting (lookup, pool), not for a draft model, and not a strict
    upper bound: it drafts the whole copyable run whenever that beats plain decoding, not the
    cost-optimal split of it into steps."""
    # the run after the target's token output[i] is the copyable stretch at i + 1 committed tokens
    lengths = copyable_lengths(prompt, output, max_depth)
    sizes, i = [], 0
    while i < len(output):
        best = lengths[i + 1] if i + 1 < len(output) else 0
        if best and curve.at(1 + best) > (1 + best) * curve.at(1):
            best = 0
        sizes.append(1 + best)
        i += 1 + best
    return sizes


def copyable_lengths(prompt: list[int], output: list[int], max_depth: int) -> list[int]:
    """For each count c of committed output tokens: the longest d <= max_depth such that
    output[c:c + d], the tokens a draft proposed at that point would have to guess, occurs
    somewhere in the text known then (prompt + output[:c]): what a drafter that copies text
    from the context, knowing which copy is right, could draft there."""
    lengths = []
    for c in range(len(output)):
        context = prompt + output[:c]
        rest = output[c:c + max_depth]
        best = 0
        for j, token in enumerate(context):
            if token == rest[0]:
                n = 1
                while n < len(rest) and j + n < len(context) and context[j + n] == rest[n]:
                    n += 1
                best = max(best, n)
        lengths.append(best)
    return lengths


def copy_optimum_steps(prompt: list[int], output: list[int], curve: Any, max_depth: int = OPTIMUM_MAX_DEPTH,
                       lengths: list[int] | None = None) -> tuple[float, list[tuple[int, int, int]]]:
    """The least modelled time in which any drafter that proposes only copies of the context
    (prompt lookup, phrase pools, llama.cpp's n-gram modes) could produce `output`, and its steps:
    an oracle that knows the output, drafts at each step any copyable stretch of it
    (copyable_lengths) and may pad a draft with tokens it knows will be rejected when a bigger
    step costs less (a step of 1 + d tokens commits the d drafted tokens and the target's own
    next one). Dynamic programming over the committed count, exact for the curve given. Steps:
    (committed count before the step, tokens drafted and accepted, step size paid). lengths:
    copyable_lengths(prompt, output, max_depth) when the caller has them already."""
    n = len(output)
    if lengths is None:
        lengths = copyable_lengths(prompt, output, max_depth)
    time, choice, padded = optimum_time_to_go(lengths, curve, max_depth)
    steps, c = [], 0
    while c < n:
        steps.append((c, choice[c], padded[1 + choice[c]][1]))
        c += 1 + choice[c]
    return time[0], steps


def optimum_time_to_go(lengths: list[int], curve: Any, max_depth: int = OPTIMUM_MAX_DEPTH
                       ) -> tuple[list[float], list[int], dict[int, tuple[float, int]]]:
    """The copy optimum's dynamic programme (copy_optimum_steps) over an output of len(lengths)
    tokens: time[c], the least modelled time from c committed tokens to the end (time[n] = 0);
    choice[c], the tokens its step drafts there; padded[k], the cheapest step of at least k tokens
    (time, size)."""
    n = len(lengths)
    padded: dict[int, tuple[float, int]] = {}  # step size -> the cheapest step of at least that many tokens
    best = (float("inf"), 0)
    for k in range(max_depth + 1, 0, -1):
        best = min(best, (curve.at(k), k))
        padded[k] = best
    time = [0.0] * (n + 1)
    choice = [0] * n
    for c in range(n - 1, -1, -1):
        time[c], choice[c] = min((padded[1 + d][0] + time[c + 1 + d], d)
                                 for d in range(0, min(lengths[c], n - c - 1) + 1))
    return time, choice, padded


REGRET_SPANS = ((0, 1), (1, 3), (3, 9), (9, 17), (17, 1 << 30))  # where a step starts: the answer's first tokens


def regret_by_start(lengths: list[int], sizes: list[int], accepted: list[int], curve: Any) -> list[float]:
    """Modelled ms `auto` spends beyond the copy optimum, per span of REGRET_SPANS by where its
    steps start: a step from c to c' costing t loses t + time[c'] - time[c] against the optimum
    from c (optimum_time_to_go), so the spans add up to auto's time minus the optimum's."""
    time, _, _ = optimum_time_to_go(lengths, curve)
    out = [0.0] * len(REGRET_SPANS)
    c = 0
    for size, acc in zip(sizes, accepted):
        after = c + 1 + acc
        span = next(i for i, (lo, hi) in enumerate(REGRET_SPANS) if lo <= c < hi)
        out[span] += curve.at(size) + time[after] - time[c]
        c = after
    return out


def trace_lines(output: list[int], pieces: list[str], lengths: list[int], auto_steps: list[tuple[int, int, str]],
                optimum_steps: list[tuple[int, int, int]]) -> list[str]:
    """One line per output position: the position, its copyable length (copyable_lengths), where
    a step of the copy optimum starts there (+drafted, and the size paid when padded), where one of
    auto's starts (drafted, accepted, the first node's kind), and the token's text. auto_steps:
    (size, accepted, kind name) per step in order."""
    optimum = {c: (d, k) for c, d, k in optimum_steps}
    auto: dict[int, str] = {}
    c = 0
    for size, accepted, kind in auto_steps:
        auto[c] = f"d{size - 1} a{accepted}" + (f" {kind}" if size > 1 else "")
        c += 1 + accepted
    lines = []
    for i in range(len(output)):
        o = ""
        if i in optimum:
            d, k = optimum[i]
            o = f"+{d}" + (f" (paid {k})" if k != 1 + d else "")
        lines.append(f"{i:5d}  L{lengths[i]:<4d} {o:<14} {auto.get(i, ''):<32} {pieces[i]!r}")
    return lines


def shuffled_totals(requests: list[tuple[list[int], list[int]]], n_orders: int, replay: Any, curve: Any) -> list[float]:
    """Total modelled time of plain decoding over `auto`'s for the requests replayed in each of
    n_orders shuffled orders (random.Random(seed), seeds 0 .. n_orders - 1). replay: requests ->
    [(step sizes, accepted, kinds)] per request, as _core.replay_auto gives them."""
    totals = []
    for seed in range(n_orders):
        order = list(range(len(requests)))
        random.Random(seed).shuffle(order)
        shuffled = [requests[i] for i in order]
        totals.append(total_speedup(shuffled, replay(shuffled), curve))
    return totals


def ngram_simple_steps(prompt: list[int], output: list[int], max_tokens: int, size_n: int = 12,
                       size_m: int = 48) -> tuple[list[int], int]:
    """Step sizes of llama.cpp's `--spec-type ngram-simple` (common/ngram-map.cpp at the pinned
    commit, default sizes 12 and 48) on this output, greedy, and the draft tokens the tool would
    count: with the history H = prompt + the committed output (its last token the one the step
    decodes), the last size_n tokens of H are searched for in H without its last token, latest
    occurrence first; when one is found with at least size_n tokens after it there, up to size_m
    of them are drafted, cut to the tool's budget (`pyspec bench` runs it with `-n max_tokens -
    1`: max_tokens - 2 - committed tokens). With no budget left it drafts without a limit, past
    the end; that step is a plain one in the sizes, as the bench's speed up to the limit leaves
    the overrun out, but its draft is counted. A step decodes the last token and the draft and
    commits the accepted draft tokens and the target's next one."""
    sizes, c, n_drafted = [], 0, 0
    while c < len(output):
        history = prompt + output[:c]
        tokens, pattern = history[:-1], history[-size_n:]
        draft: list[int] = []
        if len(tokens) > size_n + size_m + 1:
            for j in range(len(tokens) - size_n - 1, 0, -1):
                if tokens[j:j + size_n] == pattern:
                    copy_max = min(size_m, len(tokens) - (j + size_n))
                    if copy_max >= size_n:
                        draft = tokens[j + size_n:j + size_n + copy_max]
                    break
        budget = max_tokens - 2 - c
        if budget > 0:
            draft = draft[:budget]
        n_drafted += len(draft)
        if budget <= 0:
            draft = []
        accepted = 0
        while accepted < len(draft) and c + accepted < len(output) and draft[accepted] == output[c + accepted]:
            accepted += 1
        accepted = min(accepted, len(output) - c - 1)
        sizes.append(1 + len(draft))
        c += accepted + 1
    return sizes, n_drafted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", type=Path, action="append", default=[], help="pyspec bench --json file(s) with none")
    ap.add_argument("--target", default=None,
                    help=f"the target whose tokenizer and calibration the replay uses (default: the first --bench "
                         f"file's target, else {TARGET}); flash attention as the engine decides, or "
                         f"$PYSPEC_FLASH_ATTN")
    ap.add_argument("--suite", action="append", default=[], help="suite(s) to generate none's outputs for")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--per-prompt", action="store_true")
    ap.add_argument("--no-stop-tokens", action="store_true",
                    help="copies run on through the target's control tokens (auto before they stopped there)")
    ap.add_argument("--no-boundaries", action="store_true",
                    help="no kinds of their own for copy nodes that end a top-level unit (auto before it had them)")
    ap.add_argument("--no-substitutions", action="store_true",
                    help="copies do not learn the output's replacements (auto before they did)")
    ap.add_argument("--no-resync", action="store_true",
                    help="a copy that broke is not resumed where it left off (auto before it was)")
    ap.add_argument("--no-loose", action="store_true",
                    help="a substitution applies only after the token it was learnt after (auto before "
                         "it also applied elsewhere)")
    ap.add_argument("--no-fences", action="store_true",
                    help="no kind of its own for a copy whose short key holds a code fence (auto before it had one)")
    ap.add_argument("--actual-curve", type=Path,
                    help="charge the steps this curve's times (a `benchmarks/context_cost.py --json` file "
                         "and --actual-context, e.g. the target at a long context) while auto plans from "
                         "the cached calibration, as the engine does at that context")
    ap.add_argument("--actual-context", default="2048", help="which curve of the --actual-curve file")
    ap.add_argument("--prior-curve", type=Path,
                    help="plan from this curve instead of the cached calibration (the same format; "
                         "--prior-context picks the curve)")
    ap.add_argument("--prior-context", default="128", help="which curve of the --prior-curve file")
    ap.add_argument("--copy-bound", action="store_true",
                    help="also the modelled speed of drafting exactly the copyable continuation each step "
                         "(the output known in advance): how much copy drafting could gain at all")
    ap.add_argument("--copy-optimum", action="store_true",
                    help="also the modelled speed of the best any copy drafter could do (copy_optimum_steps: "
                         "an oracle over copies of the context, cost-optimal steps) and of llama.cpp's "
                         "ngram-simple mode (ngram_simple_steps), and auto and the optimum over ngram-simple "
                         "per prompt: whether a goal against llama.cpp's n-gram modes is within reach of copying")
    ap.add_argument("--regret", action="store_true",
                    help="also the modelled time auto spends beyond the copy optimum, by where in the answer "
                         "its steps start (the first token, 2-3, 4-9, 10-17, later): where copying still loses")
    ap.add_argument("--by-kind", action="store_true",
                    help="per kind of the drafted first node (prompt lookup, pool, ... by match length): steps, "
                         "tokens drafted and accepted, and the modelled time those steps gained and lost against "
                         "decoding their tokens plainly")
    ap.add_argument("--ngram", type=Path,
                    help="an n-gram table (`pyspec ngram build`) auto also drafts from, as Engine(ngram=...)")
    ap.add_argument("--trace", metavar="PROMPT_ID",
                    help="print every position of this prompt's output: its copyable length, the copy "
                         "optimum's steps and auto's, both charged the curve the steps are charged")
    ap.add_argument("--shuffles", type=int, default=0, metavar="N",
                    help="also replay each suite in N shuffled request orders and print the total modelled "
                         "speedup of each (module docstring)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    engine = Engine(replay_target(args.target, args.bench), n_ctx=4096, n_threads=2)
    curve = target_calibration(engine)
    if args.prior_curve:
        planned = json.loads(args.prior_curve.read_text(encoding="utf-8"))[args.prior_context]
        curve = calibration.CostCurve(tuple(planned["n_tokens"]), tuple(planned["ms"]))
    core_curve = curve._core()
    actual = curve
    if args.actual_curve:
        measured = json.loads(args.actual_curve.read_text(encoding="utf-8"))[args.actual_context]
        actual = calibration.CostCurve(tuple(measured["n_tokens"]), tuple(measured["ms"]))
    params = GenerationConfig(method="auto", lookup_substitutions=not args.no_substitutions,
                              lookup_resync=not args.no_resync,
                              lookup_loose_substitutions=not args.no_loose).to_core()
    params.lookup.stop_tokens = [] if args.no_stop_tokens else engine._core.control_tokens()  # as the engine
    blank_line, unit_start, fence = engine._core.layout_tokens()  # one pass over the vocabulary
    if not args.no_boundaries:
        params.lookup.blank_line_tokens, params.lookup.unit_start_tokens = blank_line, unit_start
    if not args.no_fences:
        params.lookup.fence_tokens = fence
    corpus = engine._core.load_ngram(str(args.ngram)) if args.ngram else None  # checked against the target
    reports = [json.loads(p.read_text(encoding="utf-8")) for p in args.bench]
    jobs = [recorded_runs(data) for data in reports]
    # what llama-speculative-simple's ngram-simple drafted in the same bench run, to check the model by
    drafted_by_tool = [tool_drafted(data, "llama.cpp-ngram-simple") for data in reports]
    limits = [int(data["max_tokens"]) for data in reports]
    jobs += [(s, generated_runs(engine, s, args.n, args.max_tokens)) for s in args.suite]
    drafted_by_tool += [{} for _ in args.suite]
    limits += [args.max_tokens for _ in args.suite]
    report: dict[str, Any] = {}
    shuffled: dict[str, list[float]] = {}  # suite -> total modelled none/auto per shuffled order
    for (suite, runs), tool_counts, max_tokens in zip(jobs, drafted_by_tool, limits):
        prompts = prompt_tokens(engine, suite, len(runs))
        requests = [(prompts[pid], tokens) for pid, tokens in runs if tokens]
        ids = [pid for pid, tokens in runs if tokens]
        def replay(reqs: list[tuple[list[int], list[int]]]) -> list[Any]:
            return _core.replay_auto(reqs, core_curve, params.lookup, params.pool, params.scheduler,
                                     actual=actual._core(), corpus=corpus)

        replayed = replay(requests)
        rows = []
        kinds_table: dict[str, list[float]] = {}  # kind -> [steps, drafted, accepted, gained ms, lost ms]
        for pid, (_, output), (sizes, accepted, kinds) in zip(ids, requests, replayed):
            for size, acc, kind in zip(sizes, accepted, kinds):
                if size > 1:  # against plain decoding of the same tokens: 1 + acc one-token steps
                    net = (1 + acc) * actual.at(1) - actual.at(size)
                    row = kinds_table.setdefault(_core.kind_name(kind), [0, 0, 0, 0.0, 0.0])
                    row[0] += 1
                    row[1] += size - 1
                    row[2] += acc
                    row[3 if net > 0 else 4] += abs(net)
            n = len(output)
            t_none = n * actual.at(1)
            t_auto = model_cost(actual, list(sizes))
            rows.append({"prompt_id": pid, "n": n, "none": n / t_none * 1e3, "auto": n / t_auto * 1e3,
                         "calls": len(sizes), "plain": sum(1 for k in sizes if k == 1) / len(sizes),
                         "drafted": sum(sizes) - len(sizes), "accepted": sum(accepted)})
            if args.copy_bound:
                rows[-1]["bound"] = n / model_cost(actual, copy_bound_sizes(prompts[pid], output, actual)) * 1e3
            if args.copy_optimum or args.regret or args.trace == pid:
                lengths = copyable_lengths(prompts[pid], output, OPTIMUM_MAX_DEPTH)
                optimum_ms, optimum_steps = copy_optimum_steps(prompts[pid], output, actual, lengths=lengths)
            if args.regret:
                rows[-1]["regret"] = regret_by_start(lengths, list(sizes), list(accepted), actual)
            if args.trace == pid:
                pieces = [engine.detokenize_bytes([t]).decode("utf-8", "replace") for t in output]
                named = [(size, acc, _core.kind_name(kind)) for size, acc, kind in zip(sizes, accepted, kinds)]
                print(f"{pid}: position, copyable length, copy optimum step, auto step, token")
                print("\n".join(trace_lines(output, pieces, lengths, named, optimum_steps)))
            if args.copy_optimum:
                rows[-1]["optimum"] = n / optimum_ms * 1e3
                ngram_sizes, ngram_drafted = ngram_simple_steps(prompts[pid], output, max_tokens)
                rows[-1]["ngram_simple"] = n / model_cost(actual, ngram_sizes) * 1e3
                if pid in tool_counts:
                    rows[-1]["ngram_simple_drafted"] = (ngram_drafted, tool_counts[pid])
        med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
        ratio = lambda a, b: statistics.median(r[a] / r[b] for r in rows)  # noqa: E731
        geo = lambda key: statistics.geometric_mean(r[key] / r["none"] for r in rows)  # noqa: E731
        tokens_per_call = statistics.median(r["n"] / r["calls"] for r in rows)
        print(f"{suite}: {len(rows)} prompts; modelled tok/s none {med('none'):.1f}, auto {med('auto'):.1f}; "
              f"auto/none {ratio('auto', 'none'):.2f}x; tokens/call {tokens_per_call:.2f}, "
              f"plain steps {med('plain'):.0%}, accepted/drafted "
              f"{sum(r['accepted'] for r in rows) / max(1, sum(r['drafted'] for r in rows)):.2f}; "
              f"geometric mean of auto/none {geo('auto'):.2f}x")
        if args.copy_bound:
            print(f"  copy bound: tok/s {med('bound'):.1f}, bound/none {ratio('bound', 'none'):.2f}x, "
                  f"geometric mean {geo('bound'):.2f}x")
        if args.copy_optimum:
            share = sum(1 for r in rows if r["optimum"] / r["ngram_simple"] >= 1.15) / len(rows)
            print(f"  copy optimum: tok/s {med('optimum'):.1f}, optimum/none {ratio('optimum', 'none'):.2f}x; "
                  f"ngram-simple: tok/s {med('ngram_simple'):.1f}, /none {ratio('ngram_simple', 'none'):.2f}x; "
                  f"auto/ngram-simple {ratio('auto', 'ngram_simple'):.2f}x, optimum/ngram-simple "
                  f"{ratio('optimum', 'ngram_simple'):.2f}x (>= 1.15x on {share:.0%} of the prompts)")
            checked = [r["ngram_simple_drafted"] for r in rows if "ngram_simple_drafted" in r]
            if checked:
                same = sum(1 for modelled, counted in checked if modelled == counted)
                print(f"  ngram-simple's modelled draft tokens equal llama-speculative-simple's own count on "
                      f"{same} of {len(checked)} prompts")
        if args.regret:
            spans = [sum(r["regret"][i] for r in rows) / 1e3 for i in range(len(REGRET_SPANS))]
            total = sum(r["n"] / r["auto"] for r in rows)  # seconds
            print(f"  beyond the copy optimum: {sum(spans):.2f} s of auto's {total:.2f} s; by where the step starts, "
                  f"token 1: {spans[0]:.2f} s, 2-3: {spans[1]:.2f} s, 4-9: {spans[2]:.2f} s, 10-17: {spans[3]:.2f} s, "
                  f"later: {spans[4]:.2f} s")
        if args.by_kind:
            total = sum(model_cost(actual, list(sizes)) for sizes, _, _ in replayed)
            print(f"  by first node kind (modelled auto time {total / 1e3:.1f} s; gained / lost: against decoding "
                  f"the step's tokens plainly):")
            for kind, (n_steps, drafted, acc, gained, lost) in sorted(kinds_table.items(), key=lambda kv: -kv[1][4]):
                print(f"    {kind:<18} steps {n_steps:4d} drafted {drafted:5d} accepted {acc:5d} "
                      f"({acc / max(drafted, 1):.2f})  gained {gained / 1e3:6.2f} s  lost {lost / 1e3:6.2f} s")
        if args.per_prompt:
            for r in rows:
                bound = f" copy bound {r['bound']:5.1f}" if "bound" in r else ""
                if "optimum" in r:
                    bound += (f" optimum {r['optimum']:5.1f} ngram-simple {r['ngram_simple']:5.1f} "
                              f"optimum/ngram-simple {r['optimum'] / r['ngram_simple']:.2f}x")
                print(f"  {r['prompt_id']:<16} auto {r['auto']:5.1f} calls {r['calls']:3d} "
                      f"drafted {r['drafted']:4d} accepted {r['accepted']:4d}{bound}")
        report[suite] = rows
        if args.shuffles > 0:
            totals = shuffled_totals(requests, args.shuffles, replay, actual)
            in_order = total_speedup(requests, replayed, actual)
            print(f"  total modelled none/auto in order {in_order:.3f}; in {args.shuffles} shuffled orders mean "
                  f"{statistics.fmean(totals):.3f} (min {min(totals):.3f}, max {max(totals):.3f}): "
                  + " ".join(f"{t:.3f}" for t in totals))
            shuffled[suite] = totals
    if shuffled:
        report["shuffled"] = shuffled
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

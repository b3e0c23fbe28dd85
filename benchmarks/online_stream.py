"""The stream experiment (OSD §5): a query stream with distribution shift, served with
a static draft, with online distillation of one draft, and with one distilled draft per domain.

    # a cheap draft with room to learn: the first 6 blocks of the target family's small model
    pyspec models derive-draft --from qwen2.5-coder-0.5b-instruct --layers 6 --out qwen6.gguf
    # a run of the three modes (~2 h on 2 cores): 150 requests x 3 modes, then method auto with
    # each mode's final draft on the next 8 prompts of each suite
    python benchmarks/online_stream.py --draft qwen6.gguf \\
        --stream humaneval:50,gsm8k:50,mtbench:50 --max-tokens 32 --n-draft 2 \\
        --modes static,online,routed --threads 2 --train-threads 2 --wait-updates --window 25 \\
        --lr 5e-4 --epochs 2 --batch-size 4 --auto-eval 8 --keep-drafts final \\
        --json stream.json --plot stream.png

    # smoke run on tiny random models (seconds; numbers mean little)
    python benchmarks/online_stream.py --tiny --stream humaneval:16,gsm8k:16,mtbench:16 --max-tokens 24 \\
        --window 8 --update-interval 4 --lr 1e-3 --export-dtype f32 --wait-updates

    # the engine's draft head instead of a draft model (pyspec train-head makes one): modes
    # static and online, method redrafter (a greedy head chain) unless --method says otherwise
    python benchmarks/online_stream.py --target smollm2-135m-instruct --head eagle.gguf \\
        --stream mtbench:64 --shuffle 0 --heldout 16 --positions all --teacher evaluate \\
        --modes static,online --window 16 --wait-updates --json head_stream.json --plot head_stream.png

Every mode starts from the same draft file and serves the same prompts in the same order,
greedy, through the chat template (--raw: plain text), method chain. Reported per request:
suite, draft version, drafted / accepted tokens, tokens/s; per mode: acceptance pooled over the
last --window requests (OSD: 50) along the stream, per suite, and the final gain over static.
Greedy outputs should be identical across modes (the draft never changes the output): the
script counts the requests that differ. Without --wait-updates training runs beside generation
(as a server would) and --threads + --train-threads should split the cores; with it they take
turns and may each use all of them. --auto-eval N then serves the next N prompts of each suite
with plain decoding and with method auto and each mode's final draft (interleaved per prompt):
does the distilled draft make the scheduler faster?

With --head the drafter is the engine's draft head (pyspec.head.online.HeadDistiller: each
request is evaluated once more with hidden states on, the head's first step is fine-tuned, the
new head is hot-reloaded); --heldout then also serves each held-out prompt with plain decoding
and reports each mode's acceptance by depth, tokens per target call and decode speed against it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspec.online.config import TRAIN_BLOCKS_HELP, DistillConfig  # no torch: plain settings
from pyspec.results import depth_counts

MODES = ("static", "online", "routed")


def load_stream(spec: str, raw: bool, held_out: int = 0, shuffle: int | None = None,
                ) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """[(suite, prompt)] in stream order from "suite:n,suite:n,...", and the `held_out` prompts
    of each suite that follow its stream prompts. shuffle: a seed; each suite's prompts are put
    in a random order first (the same for a seed), so that the held-out prompts are drawn from
    the same distribution as the suite's stream prompts. In file order MT-Bench runs category by
    category (ten prompts each), and its held-out prompts after 50 served are the categories the
    stream never served."""
    import random

    from pyspec.data import load_suite

    stream, rest = [], []
    for part in spec.split(","):
        name, _, n = part.partition(":")
        limit = int(n) + held_out if n else None
        prompts = load_suite(name, None if shuffle is not None else limit)
        if shuffle is not None:
            random.Random(f"{shuffle}:{name}").shuffle(prompts)
        rendered = [p.render(chat=not raw) for p in prompts[:limit]]
        cut = int(n) if n else len(rendered)
        stream += [(name, p) for p in rendered[:cut]]
        rest += [(name, p) for p in rendered[cut:]]
    return stream, rest


def distill_config(args: argparse.Namespace) -> DistillConfig:
    return DistillConfig(loss=args.loss, tau=args.tau, positions=args.positions, teacher=args.teacher,
                         prompt_positions=args.prompt_positions, lr=args.lr,
                         lr_schedule=args.lr_schedule, epochs=args.epochs, batch_size=args.batch_size,
                         rehearsal=args.rehearsal, rehearsal_limit=args.rehearsal_limit,
                         train_vocab=args.train_vocab, train_blocks=args.train_blocks,
                         train_threads=args.train_threads, export_dtype=args.export_dtype,
                         head_depth=args.head_depth)


def peak_rss_mb(pid: int | None = None) -> float | None:
    """Peak resident memory (VmHWM) of a process in MB, from /proc (Linux); None elsewhere."""
    try:
        with open(f"/proc/{pid or 'self'}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def stream_options(args: argparse.Namespace) -> dict[str, Any]:
    """The generation options of every request of the stream."""
    options: dict[str, Any] = dict(max_tokens=args.max_tokens, method=args.method, n_draft=args.n_draft)
    if args.head and args.method == "redrafter":  # a greedy chain of the head: acceptance by depth
        options.update(beams=1, beam_length=args.n_draft)
    return options


def run_mode(mode: str, args: argparse.Namespace, stream: list[tuple[str, Any]], work_dir: Path) -> dict[str, Any]:
    import pyspec
    from pyspec.online import DomainRouter, OnlineDistiller

    config = distill_config(args)
    options = stream_options(args)
    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    drafter = dict(head=args.head) if args.head else dict(draft=args.draft)
    with pyspec.Engine(args.target, n_ctx=args.n_ctx, n_threads=args.threads, **drafter) as engine:
        distiller = router = None
        if mode == "online" and args.head:
            from pyspec.head.online import HeadDistiller

            distiller = HeadDistiller(engine, config, args.update_interval, args.buffer_limit, window=args.window,
                                      work_dir=work_dir / mode)
        elif mode == "online":
            distiller = OnlineDistiller(engine, config, args.update_interval, args.buffer_limit, window=args.window,
                                        work_dir=work_dir / mode)
        elif mode == "routed":
            suites = list(dict.fromkeys(s for s, _ in stream))
            router = DomainRouter(engine, suites, config, update_interval=args.update_interval,
                                  buffer_limit=args.buffer_limit, window=args.window, work_dir=work_dir / mode)
        distillers = [("", distiller)] if distiller else list(router.distillers.items()) if router else []
        for i, (suite, prompt) in enumerate(stream):
            t_request = time.perf_counter()
            if distiller is not None:
                result = distiller.generate(prompt, domain=suite, **options)
            elif router is not None:
                result = router.generate(prompt, domain=suite, **options)
            else:
                result = engine.generate(prompt, **options)
            serve_seconds = time.perf_counter() - t_request
            if args.wait_updates:
                for _, d in distillers:
                    d.wait()
            s = result.stats
            records.append({"index": i, "suite": suite, "draft": "head" if args.head else result.draft,
                            "draft_version": result.head_version if args.head else result.draft_version,
                            "n_drafted": s.n_drafted, "n_accepted": s.n_accepted, "n_generated": s.n_generated,
                            "n_target_calls": s.n_target_calls, "accept_histogram": list(s.accept_histogram),
                            "n_empty_drafts": s.n_empty_drafts, "n_positions": result.trace.reject_positions.shape[0],
                            "serve_seconds": serve_seconds, "tokens_per_second": s.tokens_per_second,
                            "tokens": result.tokens})
            if args.records_log:
                with open(args.records_log, "a", encoding="utf-8") as f:  # survives a run cut short
                    f.write(json.dumps({"mode": mode, **records[-1]}) + "\n")
            if args.progress:
                print(f"\r{mode}: {i + 1}/{len(stream)}", end="", file=sys.stderr, flush=True)
        if args.progress:
            print(file=sys.stderr)
        updates: dict[str, Any] = {}
        update_log: list[dict[str, Any]] = []
        finals: dict[str, str] = {}  # domain ("" = every domain) -> the draft file serving at the end
        for name, d in distillers:
            d.wait()
            trainer_peak = peak_rss_mb(d.trainer_pid)
            serving = engine.head_path if args.head else engine.draft_paths[d.draft]
            finals[name] = keep_draft(serving, args.keep_drafts, f"{mode}{'-' if name else ''}{name}")
            d.close()
            st = d.stats()
            updates[name] = {"n_updates": st.n_updates, "n_failed_updates": st.n_failed_updates,
                             "draft_version": st.draft_version, "last_error": st.last_error,
                             "trainer_peak_rss_mb": trainer_peak}
            domain_records = [r for r in records if not name or r["suite"] == name]
            for u in st.updates:
                served = requests_before_update(domain_records, u.started_after, args.update_interval)
                rep = u.report
                update_log.append({
                    "domain": name, "after_request": served[-1]["index"], "draft_version": u.version,
                    "update_seconds": u.seconds, "serve_seconds_of_interval": sum(r["serve_seconds"] for r in served),
                    **({} if rep is None else {
                        "loss_before": rep.loss_before, "loss_after": rep.loss_after, "n_positions": rep.n_positions,
                        "n_rehearsed": rep.n_rehearsed, "lr": rep.lr, "train_seconds": rep.seconds,
                        "export_seconds": rep.export_seconds})})
        if not finals:
            finals[""] = starting_drafter(args)
    update_log.sort(key=lambda u: u["after_request"])
    return {"mode": mode, "records": records, "updates": updates, "update_log": update_log, "final_drafts": finals,
            "serving_peak_rss_mb": peak_rss_mb(), "seconds": time.perf_counter() - t0}


def starting_drafter(args: argparse.Namespace) -> str:
    """The draft (or head) file every mode starts from: what the static mode serves throughout."""
    start = args.head or args.draft
    return str(Path(start).resolve()) if Path(start).exists() else start


def requests_before_update(domain_records: list[dict[str, Any]], started_after: int,
                           interval: int) -> list[dict[str, Any]]:
    """The records of the requests an update followed: the last `interval` of its distiller's
    domain before it started. `started_after` counts the requests that distiller observed (a routed
    mode's distiller sees its own domain only), not the stream's index."""
    return domain_records[:started_after][-interval:]


REUSE_MUST_MATCH = ("stream", "max_tokens", "n_draft", "raw", "method", "window")


def reuse_runs(path: str, modes: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Runs of `modes` from an earlier --json file of the same stream (the same target, prompts,
    lengths, method and target and draft file names), so that an unchanged mode is not served again. The
    static mode's final draft is the starting draft, --draft here."""
    earlier = json.loads(Path(path).read_text(encoding="utf-8"))
    # files written before --method existed ran method chain
    differ = [k for k in REUSE_MUST_MATCH if earlier["args"].get(k, "chain" if k == "method" else None) != getattr(args, k)]
    differ += [k for k in ("target", "draft", "head")
               if Path(earlier["args"].get(k) or "").name != Path(getattr(args, k) or "").name]
    if differ:
        raise SystemExit(f"--reuse {path}: not the same stream ({', '.join(differ)} differ)")
    runs = [run for run in earlier["runs"] if run["mode"] in modes]
    if missing := sorted(set(modes) - {run["mode"] for run in runs}):
        raise SystemExit(f"--reuse {path} holds no run of mode(s) {', '.join(missing)}")
    for run in runs:
        run["reused_from"] = path
        if run["mode"] == "static":
            run["final_drafts"] = {"": starting_drafter(args)}
    return runs


def keep_draft(path: str, folder: str | None, name: str) -> str:
    """Copies a trained draft out of the temporary work directory (when --keep-drafts is set)."""
    import shutil

    if folder is None:
        return path
    Path(folder).mkdir(parents=True, exist_ok=True)
    return str(shutil.copyfile(path, Path(folder) / f"{name}.gguf"))


def by_suite_and_all(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(suite, its rows) for each suite in the order first served, then ("all", every row)."""
    return [(suite, [r for r in rows if suite in ("all", r["suite"])])
            for suite in [*dict.fromkeys(r["suite"] for r in rows), "all"]]


def show_progress(args: argparse.Namespace, label: str, done: int | None, total: int = 0) -> None:
    """A one-line progress count on stderr with --progress; done None ends the line."""
    if args.progress:
        print(file=sys.stderr) if done is None else print(f"\r{label}: {done}/{total}", end="", file=sys.stderr,
                                                          flush=True)


def auto_eval(args: argparse.Namespace, runs: list[dict[str, Any]], held_out: list[tuple[str, Any]],
              work_dir: Path) -> dict[str, Any]:
    """Method auto with each mode's final draft(s), on prompts the stream did not contain.

    One engine holds the target and every final draft as a named slot; each prompt is served by
    plain decoding and by auto with each mode's draft in turn (interleaved, so machine noise hits
    all alike), each mode with a phrase pool of its own. Reports, per mode and suite, tokens/s
    (engine decode figure) and the speed-up over plain decoding, draft-model decodes, target calls
    and outputs identical to plain decoding.
    """
    import pyspec

    slots = {f"{run['mode']}:{dom}": path for run in runs for dom, path in run["final_drafts"].items()}
    pool_dir = work_dir / "pools"
    pool_dir.mkdir()
    rows = []
    with pyspec.Engine(args.target, n_ctx=args.n_ctx, n_threads=args.auto_threads, drafts=slots) as engine:
        engine.calibrate()
        for i, (suite, prompt) in enumerate(held_out):
            plain = engine.generate(prompt, max_tokens=args.max_tokens, method="none")
            row = {"suite": suite, "none": plain.stats.tokens_per_second}
            for run in runs:
                mode = run["mode"]
                slot = f"{mode}:{suite}" if f"{mode}:{suite}" in slots else f"{mode}:"
                # auto's phrase pool learns from every request: each mode keeps its own, so no mode
                # finds another mode's answer to this prompt in it
                pool_file = pool_dir / f"{mode}.pool"
                if pool_file.exists():
                    engine.load_pool(str(pool_file))
                else:
                    engine.clear_pool()
                r = engine.generate(prompt, max_tokens=args.max_tokens, method="auto", draft=slot)
                engine.save_pool(str(pool_file))
                s = r.stats
                row[mode] = {"tokens_per_second": s.tokens_per_second, "draft_decodes": s.n_draft_decodes,
                             "target_calls": s.n_target_calls, "identical": r.tokens == plain.tokens}
            rows.append(row)
            show_progress(args, "auto eval", i + 1, len(held_out))
        show_progress(args, "auto eval", None)
    summary: dict[str, Any] = {}
    for suite, rs in by_suite_and_all(rows):
        none = sum(r["none"] for r in rs) / len(rs)
        entry: dict[str, Any] = {"none_tokens_per_second": none}
        for run in runs:
            m = run["mode"]
            tps = sum(r[m]["tokens_per_second"] for r in rs) / len(rs)
            entry[m] = {"tokens_per_second": tps, "speedup_over_none": tps / none,
                        "draft_decodes": sum(r[m]["draft_decodes"] for r in rs),
                        "target_calls": sum(r[m]["target_calls"] for r in rs),
                        "identical_to_none": sum(r[m]["identical"] for r in rs)}
        summary[suite] = entry
    return {"rows": rows, "summary": summary}


def heldout_eval(args: argparse.Namespace, runs: list[dict[str, Any]], held_out: list[tuple[str, Any]]) -> dict[str, Any]:
    """Acceptance of each mode's final draft on prompts the stream did not contain (the next
    prompts of each suite): method chain, greedy, the same settings as the stream; a routed mode
    serves each suite with that suite's draft. One engine holds every final draft as a slot."""
    import pyspec

    slots = {f"{run['mode']}:{dom}": path for run in runs for dom, path in run["final_drafts"].items()}
    options = dict(max_tokens=args.max_tokens, method="chain", n_draft=args.n_draft)
    # per mode: [suite, drafted, accepted] per held-out prompt, in the order served
    prompts: dict[str, list[list[Any]]] = {run["mode"]: [] for run in runs}
    with pyspec.Engine(args.target, n_ctx=args.n_ctx, n_threads=args.threads, drafts=slots) as engine:
        for i, (suite, prompt) in enumerate(held_out):
            for run in runs:
                mode = run["mode"]
                slot = f"{mode}:{suite}" if f"{mode}:{suite}" in slots else f"{mode}:"
                s = engine.generate(prompt, draft=slot, **options).stats
                prompts[mode].append([suite, s.n_drafted, s.n_accepted])
            show_progress(args, "held-out eval", i + 1, len(held_out))
        show_progress(args, "held-out eval", None)
    out = {"n_per_suite": args.heldout, "acceptance": heldout_acceptance(prompts), "prompts": prompts}
    if args.heldout > 8:  # the stream experiment's held-out rows are the first 8 of each suite
        out["acceptance_first_8"] = heldout_acceptance(prompts, 8)
    return out


def heldout_eval_head(args: argparse.Namespace, runs: list[dict[str, Any]],
                      held_out: list[tuple[str, Any]]) -> dict[str, Any]:
    """The held-out prompts served with plain decoding and with each mode's final head (the
    stream's method and options), one engine whose head is swapped between them; per prompt the
    modes run in turn after plain decoding, so machine noise hits all alike. Per mode and suite:
    acceptance pooled and by depth, tokens per target call, decode tokens/s and the median of the
    per-prompt ratios to plain decoding, outputs equal to plain decoding's."""
    import statistics

    import pyspec

    options = stream_options(args)
    finals = {run["mode"]: run["final_drafts"][""] for run in runs}
    rows: list[dict[str, Any]] = []
    with pyspec.Engine(args.target, n_ctx=args.n_ctx, n_threads=args.threads, head=next(iter(finals.values()))) as engine:
        for i, (suite, prompt) in enumerate(held_out):
            plain = engine.generate(prompt, max_tokens=args.max_tokens, method="none")
            row: dict[str, Any] = {"suite": suite, "none": plain.stats.tokens_per_second,
                                   "none_ms_per_call": (plain.stats.t_total_ms - plain.stats.t_prefill_ms)
                                   / max(1, plain.stats.n_target_calls)}
            for mode, path in finals.items():
                if engine.head_path != path:
                    engine.reload_head(path)
                r = engine.generate(prompt, **options)
                s = r.stats
                row[mode] = {"tokens_per_second": s.tokens_per_second, "n_drafted": s.n_drafted, "t_draft_ms": s.t_draft_ms,
                             "n_accepted": s.n_accepted, "n_generated": s.n_generated,
                             "n_target_calls": s.n_target_calls, "accept_histogram": list(s.accept_histogram),
                             "n_empty_drafts": s.n_empty_drafts, "identical": r.tokens == plain.tokens}
            rows.append(row)
            show_progress(args, "held-out eval", i + 1, len(held_out))
        show_progress(args, "held-out eval", None)
    summary: dict[str, Any] = {}
    for suite, rs in by_suite_and_all(rows):
        plain_call = statistics.median(r["none_ms_per_call"] for r in rs)
        entry: dict[str, Any] = {"n_prompts": len(rs), "none_tokens_per_second": statistics.median(r["none"] for r in rs),
                                 "none_ms_per_call": plain_call}
        for mode in finals:
            ms = [r[mode] for r in rs]
            drafted = sum(m["n_drafted"] for m in ms)
            calls = max(1, sum(m["n_target_calls"] for m in ms))
            per_call = sum(m["n_generated"] for m in ms) / calls
            draft_ms = sum(m["t_draft_ms"] for m in ms) / calls
            entry[mode] = {
                "acceptance": sum(m["n_accepted"] for m in ms) / drafted if drafted else None,
                "acceptance_by_depth": acceptance_by_depth(ms),
                "tokens_per_target_call": per_call,
                "draft_ms_per_call": draft_ms,
                # a flat (GPU-like) verification curve: a call of any size costs a plain call,
                # drafting what it cost here
                "flat_curve_speedup": per_call * plain_call / (plain_call + draft_ms),
                "tokens_per_second": statistics.median(m["tokens_per_second"] for m in ms),
                "speedup_over_none": statistics.median(m["tokens_per_second"] / r["none"] for m, r in zip(ms, rs)),
                "identical_to_none": sum(m["identical"] for m in ms)}
        summary[suite] = entry
    return {"n_per_suite": args.heldout, "rows": rows, "summary": summary,
            "acceptance": {mode: {s: e[mode]["acceptance"] for s, e in summary.items() if s != "all"} for mode in finals}}


def acceptance_by_depth(generations: list[dict[str, Any]]) -> list[float | None]:
    """Greedy chains' acceptance at depth 1, 2, ... pooled over generations (records with
    accept_histogram and n_empty_drafts): among the steps that drafted and accepted at least
    k - 1 tokens, the share that accepted at least k (pyspec.results.depth_counts)."""
    depth = max((len(g["accept_histogram"]) for g in generations), default=1) - 1
    pooled = [sum(c) for c in zip(*(depth_counts(g["accept_histogram"], g.get("n_empty_drafts", 0), depth)
                                     for g in generations))]
    return [pooled[k] / pooled[k - 1] if pooled[k - 1] else None for k in range(1, len(pooled))]


def heldout_acceptance(prompts: dict[str, list[list[Any]]], first: int | None = None) -> dict[str, dict[str, Any]]:
    """Per mode and suite: accepted / drafted pooled over the suite's held-out prompts (its
    first `first` of them when given)."""
    out: dict[str, dict[str, Any]] = {}
    for mode, rows in prompts.items():
        counts: dict[str, list[int]] = {}
        for suite, drafted, accepted in rows:
            c = counts.setdefault(suite, [0, 0, 0])
            if first is None or c[2] < first:
                c[0] += drafted
                c[1] += accepted
            c[2] += 1
        out[mode] = {suite: (a / d if d else None) for suite, (d, a, _) in counts.items()}
    return out


def windowed_acceptance(records: list[dict[str, Any]], window: int) -> list[float | None]:
    """Acceptance pooled over the last `window` requests, at every request."""
    out = []
    for i in range(len(records)):
        recent = records[max(0, i + 1 - window): i + 1]
        drafted = sum(r["n_drafted"] for r in recent)
        out.append(sum(r["n_accepted"] for r in recent) / drafted if drafted else None)
    return out


def stream_windows(records: list[dict[str, Any]], window: int) -> list[dict[str, Any]]:
    """The stream cut into consecutive windows of `window` requests (the last one may be
    shorter): pooled acceptance (overall and by depth), tokens per target call, mean decode
    tokens/s, and the drafter version that served the window's last request."""
    out = []
    for start in range(0, len(records), window):
        rs = records[start:start + window]
        drafted = sum(r["n_drafted"] for r in rs)
        calls = sum(r.get("n_target_calls", 0) for r in rs)
        out.append({"first": start, "last": start + len(rs) - 1,
                    "acceptance": sum(r["n_accepted"] for r in rs) / drafted if drafted else None,
                    "tokens_per_target_call": sum(r["n_generated"] for r in rs) / calls if calls else None,
                    "tokens_per_second": sum(r["tokens_per_second"] for r in rs) / len(rs),
                    "acceptance_by_depth": acceptance_by_depth(rs) if "accept_histogram" in rs[0] else None,
                    "draft_version": rs[-1]["draft_version"]})
    return out


def summarize(runs: list[dict[str, Any]], window: int) -> dict[str, Any]:
    base = next((r for r in runs if r["mode"] == "static"), None)
    summary: dict[str, Any] = {}
    for run in runs:
        recs = run["records"]
        series = windowed_acceptance(recs, window)
        by_suite = {}
        for suite in dict.fromkeys(r["suite"] for r in recs):
            rs = [r for r in recs if r["suite"] == suite]
            drafted = sum(r["n_drafted"] for r in rs)
            by_suite[suite] = {
                "acceptance": sum(r["n_accepted"] for r in rs) / drafted if drafted else None,
                "tokens_per_second": sum(r["tokens_per_second"] for r in rs) / len(rs),
            }
        entry = {"final_window_acceptance": series[-1] if series else None, "by_suite": by_suite,
                 "updates": run["updates"], "seconds": round(run["seconds"], 1),
                 "serving_peak_rss_mb": run.get("serving_peak_rss_mb"),
                 "training_positions": sum(r.get("n_positions", 0) for r in recs)}
        windows = stream_windows(recs, window)
        entry["windows"] = windows
        if len(windows) > 1 and windows[0]["tokens_per_second"]:
            entry["last_over_first_window_tokens_per_second"] = (windows[-1]["tokens_per_second"]
                                                                 / windows[0]["tokens_per_second"])
        log = run["update_log"]
        if log:
            ratios = [u["update_seconds"] / u["serve_seconds_of_interval"] for u in log if u["serve_seconds_of_interval"]]
            entry["update_timing"] = {
                "n_updates": len(log),
                "mean_update_seconds": sum(u["update_seconds"] for u in log) / len(log),
                "max_update_seconds": max(u["update_seconds"] for u in log),
                "mean_serve_seconds_of_interval": sum(u["serve_seconds_of_interval"] for u in log) / len(log),
                "max_update_over_interval": max(ratios) if ratios else None,
                "n_updates_slower_than_interval": sum(r >= 1.0 for r in ratios),
            }
        if base is not None:
            entry["identical_to_static"] = sum(a["tokens"] == b["tokens"] for a, b in zip(recs, base["records"]))
            if series and entry["final_window_acceptance"] is not None:
                static_final = windowed_acceptance(base["records"], window)[-1]
                entry["gain_over_static"] = None if static_final is None else series[-1] - static_final
        summary[run["mode"]] = entry
    return summary


def plot(runs: list[dict[str, Any]], window: int, path: str, heldout: dict[str, Any] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if heldout is None:
        fig, (ax, speed) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    else:
        fig, axes = plt.subplots(2, 2, figsize=(13, 7), gridspec_kw={"width_ratios": [3, 1.2]})
        (ax, bars), (speed, unused) = axes
        unused.axis("off")
    for run in runs:  # decode speed of each window of requests, at the window's middle
        ws = stream_windows(run["records"], window)
        speed.plot([(w["first"] + w["last"]) / 2 for w in ws], [w["tokens_per_second"] for w in ws], marker="o",
                   label=run["mode"])
    speed.set_xlabel("request")
    speed.set_ylabel(f"decode tokens/s (windows of {window})")
    speed.set_ylim(bottom=0)
    speed.legend()
    for run in runs:
        series = windowed_acceptance(run["records"], window)
        ax.plot(range(len(series)), [float("nan") if v is None else v for v in series], label=run["mode"])
    recs = runs[0]["records"]
    for i in range(1, len(recs)):
        if recs[i]["suite"] != recs[i - 1]["suite"]:
            ax.axvline(i, color="grey", linestyle="--", linewidth=0.8)
    for suite in dict.fromkeys(r["suite"] for r in recs):
        first = next(r["index"] for r in recs if r["suite"] == suite)
        ax.text(first + 1, 0.02, suite, fontsize=8, color="grey")
    ax.set_ylabel(f"acceptance (last {window} requests)")
    ax.set_ylim(0, 1)
    ax.legend()
    if heldout is not None:
        acceptance = heldout["acceptance"]
        modes = list(acceptance)
        suites = list(dict.fromkeys(s for m in modes for s in acceptance[m]))
        width = 0.8 / len(modes)
        for j, mode in enumerate(modes):
            values = [acceptance[mode].get(s) or 0.0 for s in suites]
            bars.bar([i + j * width for i in range(len(suites))], values, width, label=mode)
        bars.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(suites))], suites, fontsize=8)
        bars.set_ylim(0, 1)
        bars.set_title(f"final drafts, {heldout['n_per_suite']} held-out prompts per suite", fontsize=9)
        bars.set_ylabel("acceptance")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def make_tiny_models(folder: Path) -> tuple[str, str]:
    from pyspec._models.tiny import build_tiny_model

    target = build_tiny_model(folder / "target.gguf", seed=0)
    draft = build_tiny_model(folder / "draft.gguf", seed=300, base_seed=0, perturb=0.3)
    return str(target), str(draft)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default=None, help="draft GGUF or registry name (required unless --tiny or --head)")
    p.add_argument("--head", default=None, metavar="HEAD.gguf",
                   help="fine-tune the engine's draft head instead of a draft model (modes static and online; "
                        "method redrafter unless --method says otherwise; --n-draft: the head chain's length)")
    p.add_argument("--tiny", action="store_true", help="tiny random models (smoke run), raw prompts")
    p.add_argument("--stream", default="humaneval:200,gsm8k:200,mtbench:80", help="suite:n,... in stream order")
    p.add_argument("--modes", default="static,online,routed", help=f"comma-separated: {', '.join(MODES)}")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--n-draft", type=int, default=4)
    p.add_argument("--raw", action="store_true", help="raw prompt text instead of the chat template")
    p.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                   help="put each suite's prompts in a random order (this seed) before taking the stream's and the "
                        "held-out prompts: held-out prompts from the stream's own distribution (default: file order)")
    p.add_argument("--head-depth", type=int, default=1,
                   help="with --head: draft steps an update trains (DistillConfig.head_depth; default 1)")
    p.add_argument("--method", default=None,
                   help="generation method of the stream (default chain; redrafter with --head)")
    p.add_argument("--teacher", choices=["trace", "evaluate"], default="trace",
                   help="where the target's distributions come from (DistillConfig.teacher)")
    p.add_argument("--loss", choices=["fkl", "rkl", "jsd", "ce"], default="fkl")
    p.add_argument("--tau", type=float, default=1.0)
    p.add_argument("--positions", choices=["rejected", "all"], default="rejected")
    p.add_argument("--prompt-positions", action="store_true",
                   help="also train on each prompt's positions (DistillConfig.prompt_positions)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lr-schedule", choices=["constant", "inverse_sqrt"], default="constant")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per optimizer step")
    p.add_argument("--rehearsal", type=float, default=0.0,
                   help="earlier positions replayed per new position in each update (default 0: none)")
    p.add_argument("--rehearsal-limit", type=int, default=16384, help="positions kept for rehearsal")
    p.add_argument("--train-vocab", action=argparse.BooleanOptionalAction, default=DistillConfig.train_vocab,
                   help="train the draft's embedding and output matrices (--no-train-vocab freezes them)")
    p.add_argument("--train-blocks", type=int, default=DistillConfig.train_blocks,
                   help=TRAIN_BLOCKS_HELP)
    p.add_argument("--export-dtype", default="source")
    p.add_argument("--update-interval", type=int, default=8)
    p.add_argument("--buffer-limit", type=int, default=4096)
    p.add_argument("--window", type=int, default=50)
    p.add_argument("--wait-updates", action="store_true",
                   help="finish each update before the next request (deterministic stream; a server would not "
                        "wait, and with fast generation fewer updates land)")
    p.add_argument("--threads", type=int, default=1, help="engine threads (default 1)")
    p.add_argument("--train-threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--auto-eval", type=int, default=0, metavar="N",
                   help="afterwards, serve the next N prompts of each suite with method auto and each mode's "
                        "final draft(s), against plain decoding (tokens/s, draft-model use)")
    p.add_argument("--auto-threads", type=int, default=2, help="engine threads in the auto evaluation")
    p.add_argument("--heldout", type=int, default=0, metavar="N",
                   help="afterwards, the acceptance of each mode's final draft(s) on the next N prompts of each suite "
                        "(method chain)")
    p.add_argument("--keep-drafts", default=None, metavar="DIR", help="copy each mode's final draft(s) here")
    p.add_argument("--reuse", default=None, metavar="JSON",
                   help="take the runs of --reuse-modes from an earlier --json file of the same stream")
    p.add_argument("--reuse-modes", default="static", help="modes taken from --reuse (default static)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--records-log", default=None, metavar="PATH", help="append each request's record here (JSON lines)")
    p.add_argument("--plot", default=None, metavar="PATH", help="PNG of acceptance over the stream")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    modes = [m for m in args.modes.split(",") if m]
    if unknown := sorted(set(modes) - set(MODES)):
        p.error(f"unknown mode(s) {', '.join(unknown)}")
    if args.method is None:
        args.method = "redrafter" if args.head else "chain"
    if args.head:
        if args.tiny or args.draft:
            p.error("--head fine-tunes a draft head: give it without --tiny and --draft")
        if "routed" in modes or args.auto_eval:
            p.error("--head runs modes static and online (one head per engine) and no --auto-eval")
        if not Path(args.head).is_file():
            p.error(f"--head {args.head}: no such file")

    import torch

    torch.set_num_threads(args.train_threads)
    with tempfile.TemporaryDirectory(prefix="pyspec-stream-") as tmp:
        work_dir = Path(tmp)
        if args.tiny:
            args.target, args.draft = make_tiny_models(work_dir)
            args.raw = True
        if args.draft is None and not args.head:
            p.error("--draft or --head is required (see the docstring for deriving a cheap draft)")
        stream, held_out = load_stream(args.stream, args.raw, max(args.auto_eval, args.heldout), args.shuffle)
        reused = reuse_runs(args.reuse, [m for m in args.reuse_modes.split(",") if m], args) if args.reuse else []
        runs = [*reused, *(run_mode(mode, args, stream, work_dir) for mode in modes
                           if mode not in {r["mode"] for r in reused})]
        runs.sort(key=lambda run: MODES.index(run["mode"]))
        by_suite = {}
        for suite, prompt in held_out:
            by_suite.setdefault(suite, []).append((suite, prompt))
        chosen = [x for xs in by_suite.values() for x in xs[: args.heldout]]
        heldout = (None if not args.heldout else heldout_eval_head(args, runs, chosen) if args.head
                   else heldout_eval(args, runs, chosen))
        evaluation = (auto_eval(args, runs, [x for xs in by_suite.values() for x in xs[: args.auto_eval]], work_dir)
                      if args.auto_eval else None)
    summary = summarize(runs, args.window)
    if heldout is not None:
        summary["heldout"] = {key: value for key, value in heldout.items() if key not in ("prompts", "rows")}
    if evaluation is not None:
        summary["auto_eval"] = evaluation["summary"]
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "summary": summary,
                                               "runs": runs, "heldout": heldout, "auto_eval": evaluation},
                                              indent=1) + "\n", encoding="utf-8")
    if args.plot:
        plot(runs, args.window, args.plot, heldout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

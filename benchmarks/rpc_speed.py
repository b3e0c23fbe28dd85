#!/usr/bin/env python3
"""Decode speed with the target on this machine, on one llama.cpp rpc-server and split over two,
for plain decoding and speculative methods, side by side in one run.

The servers are started here over loopback (ggml-rpc-server, `pyspec rpc-server --build`), so
every target call crosses a real TCP connection and the RPC protocol, but no physical network:
the hop cost measured is the protocol's and the kernel's, a floor for a LAN. The draft model stays
local, as Engine(rpc=...) keeps it. An rpc-server computes with ggml's plain CPU buffers (no weight
repacking), so "local-norepack" (Engine(repack="off")) is the local run with the servers' kernels:
the difference between it and "rpc x1" is what the hops cost. Per prompt and method: decode
tokens/s, target calls, time per target call, whether the output equals plain decoding in the same
placement and local plain decoding (greedy), and for each output that differs the logit gap at the
first difference in the target's local one-token row (a near-tie when small: docs/numerics.md).

Needs a libllama with the RPC backend (scripts/rpc_check.sh builds one in a separate environment).

    python benchmarks/rpc_speed.py --humaneval 3 --mtbench 3 --max-tokens 128 --threads 2 \\
        --json benchmarks/results/rpc_speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from typing import Any

from pyspec import Engine
from pyspec.config import DEFAULT_DRAFT, DEFAULT_TARGET
from pyspec.data import load_suite
from pyspec.models import resolve_model
from pyspec.rpc import RpcServer, rpc_supported


def prompts(n_humaneval: int, n_mtbench: int) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for p in load_suite("humaneval", n_humaneval):
        out.append((p.id, [{"role": "user", "content": f"Complete this Python function.\n\n{p.text}"}]))
    for p in load_suite("mtbench", n_mtbench):
        out.append((p.id, [{"role": "user", "content": p.text}]))
    return out


def divergence_gaps(engine: Engine, one: Engine, todo: list[tuple[str, Any]], records: list[dict[str, Any]]) -> None:
    """Adds "divergence" {position, gap, gap_batched} to every record whose tokens differ from
    local plain decoding's: the first differing position and |logit(a) - logit(b)| of the two
    tokens there in the local target's row, evaluated one token at a time (gap: `one`, an engine
    with a batch of 1, as plain decoding runs) and in one batch (gap_batched: `engine`). Batched and one-token logits differ by up to ~1 on this backend, and a
    divergence is a near-tie when either gap is small (docs/numerics.md)."""
    messages = dict(todo)
    reference = {r["id"]: r["tokens"] for r in records if r["config"] == "local" and r["method"] == "none"}
    for rec in records:
        a, b = reference[rec["id"]], rec["tokens"]
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
        if i is None:
            continue
        prompt = engine.prompt_tokens(messages[rec["id"]])
        row = one.evaluate(prompt + a[:i])[0]
        batched = engine.evaluate(prompt + a[:i])[0]
        rec["divergence"] = {"position": i, "gap": float(abs(row[a[i]] - row[b[i]])),
                             "gap_batched": float(abs(batched[a[i]] - batched[b[i]]))}


def run_config(name: str, engine: Engine, todo: list[tuple[str, Any]], methods: list[str],
               max_tokens: int) -> list[dict[str, Any]]:
    engine.calibrate()  # auto's cost curve for this placement (cached per RPC servers)
    records = []
    for pid, messages in todo:
        for method in methods:
            engine.clear_pool()  # every method starts from the same (empty) phrase pool
            r = engine.generate(messages, max_tokens=max_tokens, method=method, temperature=0.0)
            s = r.stats
            t_gen = s.t_total_ms - s.t_prefill_ms
            records.append({"config": name, "id": pid, "method": method, "tokens": list(r.tokens),
                            "n_generated": s.n_generated, "t_generation_ms": t_gen,
                            "tok_s": s.n_generated / t_gen * 1e3, "n_target_calls": s.n_target_calls,
                            "ms_per_step": t_gen / max(1, s.n_target_calls),
                            "t_target_ms": s.t_target_ms, "acceptance": s.acceptance_rate})
            print(f"{name:>8} {pid:>14} {method:>8}: {records[-1]['tok_s']:6.1f} tok/s, "
                  f"{s.n_generated / max(1, s.n_target_calls):.2f} tokens/call", file=sys.stderr)
    return records


def summarize(records: list[dict[str, Any]], configs: list[str], methods: list[str]) -> dict[str, Any]:
    local_none = {r["id"]: r for r in records if r["config"] == "local" and r["method"] == "none"}
    table: dict[str, Any] = {}
    for config in configs:
        none_here = {r["id"]: r for r in records if r["config"] == config and r["method"] == "none"}
        for method in methods:
            rows = [r for r in records if r["config"] == config and r["method"] == method]
            table[f"{config}/{method}"] = {
                "tok_s": sum(r["n_generated"] for r in rows) / sum(r["t_generation_ms"] for r in rows) * 1e3,
                "median_vs_local_none": statistics.median(r["tok_s"] / local_none[r["id"]]["tok_s"] for r in rows),
                "median_vs_none_here": statistics.median(r["tok_s"] / none_here[r["id"]]["tok_s"] for r in rows),
                "tokens_per_call": sum(r["n_generated"] for r in rows) / sum(r["n_target_calls"] for r in rows),
                "ms_per_target_call": sum(r["t_target_ms"] for r in rows) / sum(r["n_target_calls"] for r in rows),
                "ms_per_step": sum(r["t_generation_ms"] for r in rows) / sum(r["n_target_calls"] for r in rows),
                "identical_to_none_here": sum(r["tokens"] == none_here[r["id"]]["tokens"] for r in rows),
                "identical_to_local_none": sum(r["tokens"] == local_none[r["id"]]["tokens"] for r in rows),
                # per divergence, the smaller of its one-token and batched gaps
                "divergence_gaps": sorted(round(min(r["divergence"]["gap"], r["divergence"]["gap_batched"]), 3)
                                          for r in rows if "divergence" in r),
                "prompts": len(rows),
            }
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--humaneval", type=int, default=3)
    ap.add_argument("--mtbench", type=int, default=3)
    ap.add_argument("--methods", default="none,auto,chain,lookup")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="threads of the engine and of each server")
    ap.add_argument("--configs", default="local,local-norepack,1,2",
                    help="placements to compare: local, local-norepack, or a number of rpc-servers")
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--json", help="write every record and the summary here")
    ap.add_argument("--gaps", metavar="FILE", help="only measure the divergence gaps of an earlier --json again")
    args = ap.parse_args(argv)
    if args.gaps:
        with open(args.gaps, encoding="utf-8") as f:
            saved = json.load(f)
        records = saved["records"]
        configs = list(dict.fromkeys(r["config"] for r in records))
        methods = list(dict.fromkeys(r["method"] for r in records))
        ids = list(dict.fromkeys(r["id"] for r in records))
        todo = [t for t in prompts(args.humaneval, args.mtbench) if t[0] in ids]
        with Engine(resolve_model(args.target), n_threads=args.threads) as engine, \
                Engine(resolve_model(args.target), n_threads=args.threads, n_batch=1, prefix_cache=False) as one:
            divergence_gaps(engine, one, todo, records)
        saved["summary"]["table"] = summarize(records, configs, methods)
        print(json.dumps(saved["summary"], indent=2))
        with open(args.gaps, "w", encoding="utf-8") as f:
            json.dump(saved, f)
        return 0
    if not rpc_supported():
        print("this libllama has no RPC backend; see scripts/rpc_check.sh", file=sys.stderr)
        return 1
    methods = args.methods.split(",")
    placements = args.configs.split(",")
    if "local" not in placements:
        ap.error("--configs must include local (the reference)")
    target, draft = resolve_model(args.target, progress=True), resolve_model(args.draft, progress=True)
    todo = prompts(args.humaneval, args.mtbench)
    records: list[dict[str, Any]] = []
    configs = []
    for placement in placements:
        count = int(placement) if placement.isdigit() else 0
        name = f"rpc x{count}" if count else placement
        servers = [RpcServer(threads=args.threads).start() for _ in range(count)]
        try:
            with Engine(target, draft=draft, n_threads=args.threads, rpc=[s.endpoint for s in servers] or None,
                        repack="off" if placement == "local-norepack" else None) as engine:
                records += run_config(name, engine, todo, methods, args.max_tokens)
        finally:
            for s in servers:
                s.stop()
        configs.append(name)
    with Engine(target, n_threads=args.threads) as engine, \
            Engine(target, n_threads=args.threads, n_batch=1, prefix_cache=False) as one:
        divergence_gaps(engine, one, todo, records)
    summary = summarize(records, configs, methods)
    summary_out = {"machine": platform.processor() or platform.machine(), "max_tokens": args.max_tokens,
                   "threads": args.threads, "table": summary}
    print(json.dumps(summary_out, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": summary_out, "records": records}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

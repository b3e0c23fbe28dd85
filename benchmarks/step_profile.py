"""Where a generation step's time goes: drafting, the target call (`llama_decode` of the root and
the draft), and the host work after it (verification with its argmax rows, bookkeeping, KV edits,
the trace), for plain, chain, lookup and tree steps of 1-64 tokens.

Timings come from the engine's own clocks (`GenerationStats`: t_draft_ms, t_target_ms inside
t_verify_ms, t_other_ms), per target call, in microseconds; on a shared machine they move with
the load. `--callgrind` reruns each case under `valgrind --tool=callgrind`, collecting inside
`spec::Engine::generate` only, and reports instructions per step: all of it, inside
`llama_decode` (target and draft model calls), and the host rest; instruction counts repeat under
load where timings do not.

Chains draft with the target itself as the draft model (every token accepted: each step has
exactly 1 + n_draft tokens); lookup drafts from a prompt that repeats a passage; trees use method
tree with the target as the draft.

`--no-graph-reuse` sets llama.cpp's LLAMA_GRAPH_REUSE_DISABLE=1 for the run: every decode then
builds its compute graph anew, as a decode whose shape (tokens, output rows, sequences) differs
from the previous one's always does; the difference from a normal run is what a shape change costs.

`--argmax both` times every case twice, alternating, `--repeats` times: with the rows' argmax
on the host (the logits rows copied out of llama.cpp, then scanned) and on the target's backend
(`backend_argmax=True`: a greedy sampler in the graph, no rows copied), and reports the medians.
`--rpc HOST:PORT` puts the target's layers on llama.cpp rpc-servers (the draft stays here), where
every logits row would cross the network.

    python benchmarks/step_profile.py --model smollm2-135m-instruct --tokens 64
    python benchmarks/step_profile.py --model smollm2-135m-instruct --argmax both --repeats 5
    python benchmarks/step_profile.py --argmax both --rpc 127.0.0.1:50052 --repeats 5
    python benchmarks/step_profile.py --model smollm2-135m-instruct --tokens 64 --no-graph-reuse
    python benchmarks/step_profile.py --tiny --callgrind --tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pyspec import Engine

CASES = [  # (name, method, n_draft): steps of 1 + n_draft tokens for chains
    ("plain", "none", 0),
    ("chain", "chain", 1), ("chain", "chain", 3), ("chain", "chain", 7), ("chain", "chain", 15),
    ("chain", "chain", 31), ("chain", "chain", 63),
    ("lookup", "lookup", 7), ("lookup", "lookup", 31),
    ("tree", "tree", 0),
]
PASSAGE = ("def total(values):\n    result = 0\n    for value in values:\n        result += value\n"
           "    return result\n\n")


def model_path(args: argparse.Namespace) -> str:
    if args.tiny:
        from pyspec._models.tiny import build_tiny_model

        return str(build_tiny_model(Path(tempfile.gettempdir()) / "pyspec-step-profile-tiny.gguf", seed=0))
    from pyspec.models import resolve_model

    return str(resolve_model(args.model))


def case_options(engine: Engine, method: str, n_draft: int, tokens: int, trace_top_k: int) -> tuple[list[int], dict]:
    prompt = engine.tokenize(PASSAGE * 6, add_special=False) if method == "lookup" else engine.tokenize(
        "Write a function that adds the numbers of a list.\n", add_special=False)
    options = dict(max_tokens=tokens, method=method, trace_top_k=trace_top_k)
    if method in ("chain", "lookup"):
        options["n_draft"] = n_draft
    return prompt, options


def step_times(stats) -> dict:
    calls = max(stats.n_target_calls, 1)
    t_target_ms = getattr(stats, "t_target_ms", 0.0)  # 0 from builds that do not time the call apart
    return {
        "steps": stats.n_target_calls,
        "tokens_per_step": round(1 + stats.n_drafted / calls, 2),
        "accepted_per_step": round(stats.n_accepted / calls, 2),
        "draft_us": round(1000 * stats.t_draft_ms / calls, 1),
        "target_us": round(1000 * t_target_ms / calls, 1),
        "host_us": round(1000 * (stats.t_verify_ms - t_target_ms + stats.t_other_ms) / calls, 1),
        "step_us": round(1000 * (stats.t_total_ms - stats.t_prefill_ms) / calls, 1),
    }


def run_case(engine: Engine, method: str, n_draft: int, tokens: int, trace_top_k: int) -> dict:
    prompt, options = case_options(engine, method, n_draft, tokens, trace_top_k)
    engine.generate(prompt, **options)  # warm
    return step_times(engine.generate(prompt, **options).stats)


def compare_argmax(engine: Engine, method: str, n_draft: int, tokens: int, repeats: int) -> dict:
    """The case with the argmax on the host and on the backend, alternating; medians of the
    per-step times, and whether both paths gave the same tokens."""
    prompt, options = case_options(engine, method, n_draft, tokens, 0)
    runs: dict[str, list[dict]] = {"host": [], "backend": []}
    outputs = {}
    for i in range(repeats + 1):  # the first round warms both paths
        for path in ("host", "backend"):
            result = engine.generate(prompt, backend_argmax=path == "backend", **options)
            if result.stats.backend_argmax != (path == "backend"):
                raise RuntimeError(f"backend_argmax={path == 'backend'} did not take effect")
            outputs[path] = result.tokens
            if i > 0:
                runs[path].append(step_times(result.stats))
    row: dict = {"steps": runs["host"][0]["steps"], "tokens_per_step": runs["host"][0]["tokens_per_step"],
                 "same_tokens": outputs["host"] == outputs["backend"]}
    for path, times in runs.items():
        for key in ("target_us", "host_us", "step_us"):
            row[f"{path}_{key}"] = round(statistics.median(t[key] for t in times), 1)
    row["step_ratio"] = round(row["backend_step_us"] / row["host_step_us"], 3)
    return row


def inclusive_ir(out_file: str) -> dict[str, int]:
    """Inclusive instructions of the functions this report names, from callgrind_annotate."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out_file],
                          capture_output=True, text=True, check=True).stdout
    wanted = {"generate": r"spec::Engine::generate\(", "llama_decode": r"\bllama_decode\b",
              "argmax": r"spec::argmax\(", "kv_edits": r"\bllama_memory_seq_(rm|cp|keep)\b",
              "trace": r"record_trace"}
    found: dict[str, int] = {key: 0 for key in wanted}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)", line)
        if not m:
            continue
        ir, name = int(m.group(1).replace(",", "")), m.group(2)
        for key, pattern in wanted.items():
            if re.search(pattern, name) and not found[key]:
                found[key] = ir
            elif key == "kv_edits" and re.search(pattern, name):
                found[key] += ir
    return found


def callgrind_case(args: argparse.Namespace, method: str, n_draft: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
               "--toggle-collect=spec::Engine::generate*", sys.executable, __file__, "--single", method,
               str(n_draft), "--tokens", str(args.tokens), "--trace-top-k", str(args.trace_top_k)]
        cmd += ["--tiny"] if args.tiny else ["--model", args.model]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        steps = json.loads(proc.stdout.strip().splitlines()[-1])["steps"]
        ir = inclusive_ir(out)
    per_step = {key: round(value / max(steps, 1) / 1000, 1) for key, value in ir.items()}
    per_step["host"] = round(per_step["generate"] - per_step["llama_decode"], 1)
    return {"steps": steps, "kIr_per_step": per_step}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tiny", action="store_true", help="the tiny generated test model instead")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per case")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trace-top-k", type=int, default=0, help="the trace's top-k (0: no trace)")
    ap.add_argument("--callgrind", action="store_true", help="instructions per step under callgrind")
    ap.add_argument("--single", nargs=2, metavar=("METHOD", "N_DRAFT"), help=argparse.SUPPRESS)
    ap.add_argument("--no-graph-reuse", action="store_true",
                    help="llama.cpp builds every decode's graph anew (LLAMA_GRAPH_REUSE_DISABLE=1)")
    ap.add_argument("--argmax", choices=("host", "both"), default="host",
                    help="both: each case with the argmax on the host and on the backend, alternating")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each path with --argmax both")
    ap.add_argument("--rpc", action="append", default=[], metavar="HOST:PORT",
                    help="the target's layers on these llama.cpp rpc-servers (repeatable)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    target_options = dict(rpc=args.rpc, n_gpu_layers=-1) if args.rpc else {}
    if args.no_graph_reuse:
        os.environ["LLAMA_GRAPH_REUSE_DISABLE"] = "1"  # read when a context is made; callgrind's child inherits it
    path = model_path(args)
    if args.single:
        with Engine(path, draft=path, n_ctx=2048, n_threads=args.threads) as engine:
            row = run_case(engine, args.single[0], int(args.single[1]), args.tokens, args.trace_top_k)
        print(json.dumps(row))
        return
    rows = []
    with Engine(path, draft=path, n_ctx=2048, n_threads=args.threads, **target_options) as engine:
        for name, method, n_draft in CASES:
            if args.argmax == "both":
                measured = compare_argmax(engine, method, n_draft, args.tokens, args.repeats)
            else:
                measured = run_case(engine, method, n_draft, args.tokens, args.trace_top_k)
            rows.append({"case": name, "n_draft": n_draft, **measured})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.callgrind:
        for row, (name, method, n_draft) in zip(rows, CASES):
            row.update(callgrind_case(args, method, n_draft))
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps({"model": path, "tokens": args.tokens, "graph_reuse": not args.no_graph_reuse,
                                               "argmax": args.argmax, "rpc": args.rpc, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

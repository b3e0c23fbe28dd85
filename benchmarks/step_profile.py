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

    python benchmarks/step_profile.py --model smollm2-135m-instruct --tokens 64
    python benchmarks/step_profile.py --model smollm2-135m-instruct --tokens 64 --no-graph-reuse
    python benchmarks/step_profile.py --tiny --callgrind --tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
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


def run_case(engine: Engine, method: str, n_draft: int, tokens: int, trace_top_k: int) -> dict:
    prompt = engine.tokenize(PASSAGE * 6, add_special=False) if method == "lookup" else engine.tokenize(
        "Write a function that adds the numbers of a list.\n", add_special=False)
    options = dict(max_tokens=tokens, method=method, trace_top_k=trace_top_k)
    if method in ("chain", "lookup"):
        options["n_draft"] = n_draft
    engine.generate(prompt, **options)  # warm
    s = engine.generate(prompt, **options).stats
    calls = max(s.n_target_calls, 1)
    t_target_ms = getattr(s, "t_target_ms", 0.0)  # 0 from builds that do not time the call apart
    return {
        "steps": s.n_target_calls,
        "tokens_per_step": round(1 + s.n_drafted / calls, 2),
        "accepted_per_step": round(s.n_accepted / calls, 2),
        "draft_us": round(1000 * s.t_draft_ms / calls, 1),
        "target_us": round(1000 * t_target_ms / calls, 1),
        "host_us": round(1000 * (s.t_verify_ms - t_target_ms + s.t_other_ms) / calls, 1),
    }


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
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if args.no_graph_reuse:
        os.environ["LLAMA_GRAPH_REUSE_DISABLE"] = "1"  # read when a context is made; callgrind's child inherits it
    path = model_path(args)
    if args.single:
        with Engine(path, draft=path, n_ctx=2048, n_threads=args.threads) as engine:
            row = run_case(engine, args.single[0], int(args.single[1]), args.tokens, args.trace_top_k)
        print(json.dumps(row))
        return
    rows = []
    with Engine(path, draft=path, n_ctx=2048, n_threads=args.threads) as engine:
        for name, method, n_draft in CASES:
            row = {"case": name, "n_draft": n_draft, **run_case(engine, method, n_draft, args.tokens,
                                                                  args.trace_top_k)}
            rows.append(row)
    if args.callgrind:
        for row, (name, method, n_draft) in zip(rows, CASES):
            row.update(callgrind_case(args, method, n_draft))
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps({"model": path, "tokens": args.tokens, "graph_reuse": not args.no_graph_reuse,
                                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

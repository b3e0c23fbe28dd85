"""Where a stream run's outputs differ from static's, is it at a near-tie of the target?

    python benchmarks/online_divergences.py --run stream.json --mode online \
        --static benchmarks/results/online_stream_frozen.json --json divergences.json

Greedy speculative output must equal plain greedy output; batched and one-token logits differ
slightly on this backend and can flip a near-tie (top-2 logit gap < 0.25). For every request of
--mode in --run (a JSON of online_stream.py, or its --records-log JSON lines) whose tokens differ
from the static mode's record of the same request in --static: the first differing position,
the target's top-2 logit gap there and the gap between the two runs' tokens (one
Engine.evaluate of prompt + common prefix), and which of the two outputs plain decoding
(method "none") gives now. The prompts are rebuilt from the records' suites and indices as
online_stream.py builds them (chat template; the stream's order gives each suite's offset).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def read_records(path: str, mode: str) -> list[dict[str, Any]]:
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".jsonl"):
        return [r for r in map(json.loads, text.splitlines()) if r.get("mode", mode) == mode]
    runs = [r for r in json.loads(text)["runs"] if r["mode"] == mode]
    if not runs:
        raise SystemExit(f"{path}: no run of mode {mode!r}")
    return runs[0]["records"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="online_stream.py JSON or records JSON lines")
    p.add_argument("--mode", default="online")
    p.add_argument("--static", required=True, help="JSON holding the static run of the same stream")
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--near-tie", type=float, default=0.25)
    p.add_argument("--json", help="write the list here")
    args = p.parse_args(argv)

    import numpy as np

    import pyspec
    from pyspec.data import load_suite

    records = read_records(args.run, args.mode)
    static = {r["index"]: r for r in read_records(args.static, "static")}
    offsets: dict[str, int] = {}
    for r in sorted(static.values(), key=lambda r: r["index"]):
        offsets.setdefault(r["suite"], r["index"])
    suites = {s: load_suite(s, max(r["index"] for r in static.values() if r["suite"] == s) - off + 1)
              for s, off in offsets.items()}
    out = []
    with pyspec.Engine(args.target, n_ctx=args.n_ctx, n_threads=args.threads) as engine:
        for r in records:
            old, new = static[r["index"]]["tokens"], r["tokens"]
            if new == old:
                continue
            n = min(len(new), len(old))
            at = next((j for j in range(n) if new[j] != old[j]), n)
            prompt = suites[r["suite"]][r["index"] - offsets[r["suite"]]].render(chat=True)
            seq = list(engine.prompt_tokens(prompt)) + new[:at]
            row = np.asarray(engine.evaluate(seq, all_rows=True, first_row=len(seq) - 1)[-1])
            top2 = np.sort(row)[-2:]
            plain = engine.generate(prompt, max_tokens=args.max_tokens, method="none").tokens
            entry = {"index": r["index"], "suite": r["suite"], "draft_version": r.get("draft_version"),
                     "position": at, "run_token": new[at] if at < len(new) else None,
                     "static_token": old[at] if at < len(old) else None,
                     "top2_gap": float(top2[1] - top2[0]),
                     "gap_between_the_two": float(abs(row[new[at]] - row[old[at]])) if at < n else None,
                     "plain_equals_run": plain == new, "plain_equals_static": plain == old}
            out.append(entry)
            print(json.dumps(entry), file=sys.stderr, flush=True)
    gaps = [e["gap_between_the_two"] for e in out if e["gap_between_the_two"] is not None]
    summary = {"args": vars(args), "n_requests": len(records), "n_differ": len(out),
               "max_gap_between_the_two": max(gaps) if gaps else None,
               "all_near_ties": all(g < args.near_tie for g in gaps) and len(gaps) == len(out),
               "divergences": out}
    text = json.dumps(summary, indent=1)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

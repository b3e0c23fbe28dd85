"""Soak: thousands of requests on one engine with the tiny models, draft reloads and pool saves;
resident memory must stay bounded and no request may fail.

    python scripts/soak.py --requests 2000 --out soak.json

Every request takes the next method (auto, none, chain, tree, beam, lookup, ouroboros), greedy or
sampled, on a prompt that varies in length and content (so the phrase pool keeps learning until it
is full); every 10th is a stream cancelled after a few pieces; every 25 requests the default draft
is reloaded (two copies of the same weights in turn, so outputs stay checkable) and a named slot
is reloaded or removed; every 50 the pool is saved, every 100 loaded back. Greedy outputs are
compared with plain decoding of the same prompt. VmRSS is sampled after start-up and every 10% of
the requests. Exit status 1 on any failed request, wrong output, or growth of resident memory over
the second half of the run above --max-growth-mb (default 16).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyspec
from pyspec._models.tiny import build_tiny_model

METHODS = ["auto", "none", "chain", "tree", "beam", "lookup", "ouroboros"]
WORDS = ["def", "return", "value", "list", "index", "count", "for", "in", "range", "if", "else", "print",
         "total", "result", "self", "class", "import", "numpy", "as", "np", "the", "of", "and", "to"]


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS in /proc/self/status")


def make_prompt(rng: random.Random) -> str:
    n = rng.choice([3, 10, 40, 120, 300])
    return " ".join(rng.choice(WORDS) for _ in range(n))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-growth-mb", type=float, default=16.0)
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    errors: list[str] = []
    samples: list[dict[str, float]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pyspec-soak-") as tmp:
        work = Path(tmp)
        target = str(build_tiny_model(work / "target.gguf", seed=0))
        draft = str(build_tiny_model(work / "draft.gguf", seed=100, base_seed=0, perturb=0.1))
        copies = [str(work / "draft_a.gguf"), str(work / "draft_b.gguf")]
        for c in copies:
            shutil.copyfile(draft, c)
        pool_path = work / "soak.pool"
        counts = {"requests": 0, "streams": 0, "reloads": 0, "slot_changes": 0, "pool_saves": 0, "pool_loads": 0,
                  "greedy_checked": 0}
        with pyspec.Engine(target, n_ctx=1024, n_threads=1) as plain, \
                pyspec.Engine(target, draft=copies[0], n_ctx=1024, n_threads=1) as engine:
            samples.append({"request": 0, "rss_mb": rss_mb(), "pool_size": 0})
            for i in range(1, args.requests + 1):
                method = METHODS[i % len(METHODS)]
                prompt = make_prompt(rng)
                greedy = rng.random() < 0.6
                options: dict = dict(max_tokens=rng.choice([16, 32, 64]), method=method)
                if not greedy:
                    options.update(temperature=rng.choice([0.7, 1.0]), top_k=rng.choice([0, 5, 40]),
                                   seed=rng.randrange(10**6))
                try:
                    if i % 10 == 0:
                        stream = engine.stream(prompt, **options)
                        for k, _piece in enumerate(stream):
                            if k >= 3:
                                break
                        stream.close()
                        counts["streams"] += 1
                    else:
                        result = engine.generate(prompt, **options)
                        if greedy and i % 5 == 0:
                            expected = plain.generate(prompt, max_tokens=options["max_tokens"], method="none")
                            counts["greedy_checked"] += 1
                            if result.tokens != expected.tokens:
                                errors.append(f"request {i}: greedy {method} differs from plain decoding")
                    counts["requests"] += 1
                    if i % 25 == 0:
                        engine.reload_draft(copies[(i // 25) % 2])
                        counts["reloads"] += 1
                        if (i // 25) % 3 == 2:
                            engine.remove_draft("alt")
                        else:
                            engine.reload_draft(copies[1], name="alt")
                        counts["slot_changes"] += 1
                    if i % 50 == 0:
                        engine.save_pool(pool_path)
                        counts["pool_saves"] += 1
                    if i % 100 == 0:
                        engine.load_pool(pool_path)
                        counts["pool_loads"] += 1
                except Exception as exc:  # noqa: BLE001 - a soak counts every failure
                    errors.append(f"request {i} ({method}): {type(exc).__name__}: {exc}")
                if i % max(1, args.requests // 10) == 0:
                    stats = engine.pool_stats()
                    samples.append({"request": i, "rss_mb": round(rss_mb(), 1), "pool_size": stats["size"],
                                    "pool_mb": round(stats["memory_bytes"] / 2**20, 1)})
                    print(f"request {i}: RSS {samples[-1]['rss_mb']} MB, pool {stats['size']} phrases "
                          f"({samples[-1]['pool_mb']} MB), {len(errors)} errors, {time.monotonic() - t0:.0f} s",
                          flush=True)
    half = min(samples, key=lambda s: abs(s["request"] - args.requests / 2))
    growth = samples[-1]["rss_mb"] - half["rss_mb"]
    report = {"requests": args.requests, "counts": counts, "errors": errors[:50], "n_errors": len(errors),
              "rss_start_mb": samples[0]["rss_mb"], "rss_end_mb": samples[-1]["rss_mb"],
              "rss_growth_second_half_mb": round(growth, 1), "samples": samples,
              "seconds": round(time.monotonic() - t0, 1)}
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 1 if errors or growth > args.max_growth_mb else 0


if __name__ == "__main__":
    sys.exit(main())

"""Long fuzz run over every input kind of tests/fuzz_cases.py on freshly built tiny models.

    python scripts/fuzz.py --cases 2000 --seed 1 --out fuzz.json

Prints one summary line per kind (cases, ok, typed errors by class, wrong outcomes, crashes) and
exits 1 when any case crashed or ended wrong. Each case is reproducible from (seed, kind, index).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fuzz_cases import KINDS, run_fuzz  # noqa: E402

from pyspec._models.tiny import build_tiny_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=2000, help="cases per kind (default 2000)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write the reports as JSON here")
    args = p.parse_args(argv)
    reports = []
    with tempfile.TemporaryDirectory(prefix="pyspec-fuzz-models-") as tmp:
        target = str(build_tiny_model(Path(tmp) / "target.gguf", seed=0))
        draft = str(build_tiny_model(Path(tmp) / "draft.gguf", seed=100, base_seed=0, perturb=0.1))
        for kind in args.kinds:
            t0 = time.monotonic()
            report = run_fuzz(kind, args.cases, target, draft, seed=args.seed, timeout=24 * 3600)
            print(f"{report.summary()} [{time.monotonic() - t0:.0f} s]", flush=True)
            for line in report.wrong + report.crashes:
                print("   ", line, flush=True)
            reports.append(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump([{"kind": r.kind, "n_cases": r.n_cases, "outcomes": dict(r.outcomes), "errors": dict(r.errors),
                        "wrong": r.wrong, "crashes": r.crashes} for r in reports], f, indent=1)
    total = sum(r.n_cases for r in reports)
    bad = sum(len(r.wrong) + len(r.crashes) for r in reports)
    print(f"total: {total} cases, {sum(len(r.crashes) for r in reports)} crashes, {bad} wrong or crashed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Long concurrency stress run (tests/stress_run.py) on freshly built tiny models.

    python scripts/stress.py --seconds 600 --threads 8

Prints the duration, rounds, calls by operation and typed errors; exits 1 on any failure
(untyped error, wrong greedy output, hung thread).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from stress_run import run_stress  # noqa: E402

from pyspec._models.tiny import build_tiny_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--round-seconds", type=float, default=10)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pyspec-stress-") as tmp:
        target = str(build_tiny_model(Path(tmp) / "target.gguf", seed=0))
        draft = str(build_tiny_model(Path(tmp) / "draft.gguf", seed=100, base_seed=0, perturb=0.1))
        report = run_stress(target, draft, Path(tmp), args.seconds, args.threads, args.seed, args.round_seconds)
    print(report.summary())
    print(json.dumps({"calls": dict(report.calls), "typed_errors": dict(report.typed_errors),
                      "failures": report.failures[:50]}, indent=1))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-token decode cost of a draft as its source file and as an online update would export it.

    python benchmarks/draft_export_cost.py --draft qwen6.gguf --out-dir /tmp/exports

Exports the draft (untrained: the float32 weights it loads) in q8_0 and in source+q8_0 with the
vocabulary and all blocks but the last --train-blocks frozen (copied from the source), then
times plain decoding of each file, round-robin, --rounds times (min of 3 generations each).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyspec
from pyspec.online.config import DistillConfig


def main(argv: list[str] | None = None) -> int:
    from pyspec.online.trainer import DraftTrainer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--train-blocks", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    args = p.parse_args(argv)

    folder = Path(args.out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    files = {"source": Path(args.draft)}
    for name, settings in (("q8_0", {"export_dtype": "q8_0"}),
                           ("source+q8_0", {"export_dtype": "source+q8_0", "train_blocks": args.train_blocks})):
        out = folder / f"{name.replace('+', '_')}.gguf"
        with tempfile.TemporaryDirectory() as work:
            student = DraftTrainer(args.draft, DistillConfig(train_vocab=False, **settings), work).student
            t0 = time.perf_counter()
            student.export(out)
            print(f"{name}: exported in {time.perf_counter() - t0:.1f} s")
        files[name] = out
    prompt = "def fibonacci(n):\n    "
    for round_ in range(args.rounds):
        for name, path in files.items():
            with pyspec.Engine(str(path), n_ctx=1024, n_threads=args.threads) as engine:
                engine.generate(prompt, max_tokens=8, method="none")
                ms = []
                for _ in range(3):
                    r = engine.generate(prompt, max_tokens=args.max_tokens, method="none", stop=[])
                    ms.append(1000.0 / r.stats.tokens_per_second)
            print(f"round {round_} {name}: {min(ms):.2f} ms/token (min of {', '.join(f'{m:.2f}' for m in ms)}), "
                  f"{path.stat().st_size / 1e6:.0f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

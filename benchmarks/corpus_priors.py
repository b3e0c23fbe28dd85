"""How often the n-gram table's next token is the target's, by the confidence bucket method auto
files it under (kind_corpus): the prior means of the corpus kinds (engine/src/schedule.cpp).

Reads recorded greedy outputs of `none` (`pyspec bench --json` files) and, at every position
from the fifth on, asks the table (`pyspec ngram build`) for its prediction after the output so
far, as the engine does with min_total = AutoParams::corpus_min_total (10). No model needed.

    python benchmarks/corpus_priors.py --table ~/.cache/pyspec/ngram/sharegpt-*.ngram \\
        benchmarks/results/vs_llama_cpp_{mtbench,gsm8k,humaneval}_intel_hugepages.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyspec import ngram

BUCKETS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def bucket(confidence: float) -> int:
    return max(i for i, b in enumerate(BUCKETS) if confidence >= b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", nargs="+", type=Path, help="pyspec bench --json files with method none")
    ap.add_argument("--table", type=Path, required=True)
    ap.add_argument("--min-total", type=int, default=10)
    args = ap.parse_args()
    table = ngram.open_table(args.table)
    for path in args.bench:
        report = json.loads(path.read_text(encoding="utf-8"))
        outputs = [p["tokens"] for r in report["results"] if r["method"] == "none" for p in r["per_prompt"]]
        tries, hits = [0] * len(BUCKETS), [0] * len(BUCKETS)
        n_positions = 0
        for tokens in outputs:
            for i in range(4, len(tokens)):
                n_positions += 1
                found = table.predict(tokens[:i], args.min_total)
                if found is None or found[1] / (found[2] + 1) < BUCKETS[0]:
                    continue
                b = bucket(found[1] / (found[2] + 1))
                tries[b] += 1
                hits[b] += found[0] == tokens[i]
        cells = ", ".join(f"c{BUCKETS[b]:g} {hits[b] / tries[b]:.2f} ({tries[b]})" for b in range(len(BUCKETS)) if tries[b])
        covered = sum(tries) / max(n_positions, 1)
        print(f"{report['suite']}: {len(outputs)} outputs, {n_positions} positions, a prediction at {covered:.0%}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

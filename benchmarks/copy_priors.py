"""How often prompt lookup's next node is accepted, by its match length: the facts behind the
priors of `auto`'s context-match node kinds (spec/schedule.h, AcceptanceStats).

At every position of `none`'s outputs in `pyspec bench --json` files, take the node prompt lookup
would propose there (the continuation of the most recent earlier occurrence of the longest
suffix of up to 16 tokens, as engine/src/drafter_lookup.cpp; `match_ambiguity.find_match`), its
effective match length (that suffix extended backwards, up to 65 tokens, bucketed as the node
kinds are), whether it copies the prompt or the output, and whether it is contested (another
occurrence of the suffix goes on differently); it is accepted when the output's token is the proposed one. Each position counts
once: this is P(node accepted | its parent accepted) per bucket, what a node kind's statistics
estimate. Prints, per source, the uncontested nodes' acceptance by bucket, pooled and per suite,
beside the prior m / (m + 2). Positions proposing a control token (where copies stop) are left
out. Then, per suite, the nodes that end a top-level unit of the source (a blank-line token the
copied text follows with a token at the left margin: kind_lookup_boundary) and how often they were
copied, also counted in the table above.

    python benchmarks/copy_priors.py benchmarks/results/vs_llama_cpp_humaneval.json \\
        benchmarks/results/vs_llama_cpp_edit.json benchmarks/results/vs_llama_cpp_longedit_contested_only.json \\
        benchmarks/results/vs_llama_cpp_mtbench.json benchmarks/results/vs_llama_cpp_gsm8k.json
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from auto_replay import TARGET, prompt_tokens, recorded_runs
from match_ambiguity import find_match
from pyspec import Engine

BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 17, 25, 33, 49, 65)  # shortest length of each (spec/schedule.h)


def bucket(match_len: int) -> int:
    return max(b for b in range(len(BUCKETS)) if BUCKETS[b] <= match_len)


def proposals(prompt: list[int], output: list[int], stops: set[int], blank_line: set[int] = frozenset(),
              unit_start: set[int] = frozenset()) -> list[tuple[str, bool, int, bool, bool]]:
    """(source, contested, bucket, accepted, unit end) of lookup's next node at each output
    position, from the drafter's match as benchmarks/match_ambiguity.py finds it."""
    hist = list(prompt)
    index: dict[int, list[int]] = collections.defaultdict(list)  # token -> positions p < len(hist) - 1
    for i in range(len(hist) - 1):
        index[hist[i]].append(i)
    rows = []
    for token in output:
        m = find_match(hist, len(prompt), index)
        if m is not None and hist[m.start] not in stops:
            unit_end = hist[m.start] in blank_line and m.start + 1 < len(hist) and hist[m.start + 1] in unit_start
            rows.append(("prompt" if m.in_prompt else "output", m.contested == 0, bucket(m.n_matched),
                         token == hist[m.start], unit_end))
        index[hist[-1]].append(len(hist) - 1)
        hist.append(token)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", nargs="+", type=Path, help="pyspec bench --json files with none's outputs")
    args = ap.parse_args()
    engine = Engine(TARGET, n_ctx=4096, n_threads=1)
    stops = set(engine._core.control_tokens())
    blank_line, unit_start, _ = (set(tokens) for tokens in engine._core.layout_tokens())
    counts: dict[tuple[str, str, int], list[int]] = collections.defaultdict(lambda: [0, 0])
    unit_ends: dict[tuple[str, str, bool], list[int]] = collections.defaultdict(lambda: [0, 0])
    for path in args.bench:
        suite, runs = recorded_runs(path)
        prompts = prompt_tokens(engine, suite, len(runs))
        for pid, output in runs:
            rows = proposals(prompts[pid], output, stops, blank_line, unit_start) if output else ()
            for source, contested, b, accepted, unit_end in rows:
                if not contested:
                    counts[(source, suite, b)][0] += accepted
                    counts[(source, suite, b)][1] += 1
                if not contested and unit_end:
                    unit_ends[(source, suite, BUCKETS[b] >= 17)][0] += accepted
                    unit_ends[(source, suite, BUCKETS[b] >= 17)][1] += 1
    for source in ("prompt", "output"):
        print(f"\n{source} copies, uncontested: P(accepted) by match length (positions)\n")
        print("| length | prior m/(m+2) | pooled | per suite |")
        print("|---|---|---|---|")
        for b, m in enumerate(BUCKETS):
            cells = sorted((suite, c) for (src, suite, bb), c in counts.items() if src == source and bb == b)
            hits, tries = sum(c[0] for _, c in cells), sum(c[1] for _, c in cells)
            if tries:
                print(f"| {m}{'+' if b == len(BUCKETS) - 1 else ''} | {m / (m + 2):.3f} | {hits / tries:.3f} ({tries}) | "
                      + ", ".join(f"{suite} {c[0] / c[1]:.2f} ({c[1]})" for suite, c in cells) + " |")
    print("\nunit ends (uncontested): copied / positions, after a match of any length; of them, 17 tokens or more\n")
    for (source, suite) in sorted({(src, suite) for src, suite, _ in unit_ends}):
        short, long = unit_ends.get((source, suite, False), [0, 0]), unit_ends.get((source, suite, True), [0, 0])
        print(f"{source} copies, {suite}: {short[0] + long[0]} / {short[1] + long[1]}; {long[0]} / {long[1]}")
    engine.close()


if __name__ == "__main__":
    main()

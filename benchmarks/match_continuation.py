"""How far an earlier occurrence of the text's end predicts what follows, on recorded greedy
outputs: the facts behind `auto`'s node kinds for context matches (spec/schedule.h).

At every position of `none`'s outputs in `pyspec bench --json` files, find the longest earlier
match of the prompt-and-output so far (ties: the most recent, as prompt lookup takes it), then
count how many tokens of what followed that match the output repeats (stopping at the target's
control tokens, as lookup copies do). Prints, per match source (prompt or the output itself)
and root match length, P(the next token follows | the copy has followed d tokens) for d = 0, 1,
2, 4, 8, 16, and for short matches (<= 6 tokens) the share that runs on for 8 and 20 tokens.

    python benchmarks/match_continuation.py benchmarks/results/auto_humaneval.json \\
        benchmarks/results/auto_edit.json benchmarks/results/auto_mtbench.json benchmarks/results/auto_gsm8k.json
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from pyspec import Engine
from pyspec.data import load_suite

GROUPS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 64))
DEPTHS = (0, 1, 2, 4, 8, 16)


def matches(prompt: list[int], output: list[int], stops: set[int]) -> list[tuple[int, bool, int]]:
    """(root match length, whether it lies in the prompt, tokens of its continuation the output
    repeats) at each output position that has a match."""
    hist = prompt + output
    n_prompt = len(prompt)
    index: dict[int, list[int]] = collections.defaultdict(list)  # token -> earlier positions
    for i, t in enumerate(hist[:n_prompt - 1]):
        index[t].append(i)
    out = []
    for cur in range(n_prompt, len(hist)):
        best_len, best_end = 0, -1
        for j in index.get(hist[cur - 1], []):
            n = 1
            while n <= j and n < 64 and hist[j - n] == hist[cur - 1 - n]:
                n += 1
            if n >= best_len:
                best_len, best_end = n, j
        index[hist[cur - 1]].append(cur - 1)
        if best_len == 0:
            continue
        n_ok = 0
        while (cur + n_ok < len(hist) and best_end + 1 + n_ok < cur + n_ok and n_ok < 64
               and hist[best_end + 1 + n_ok] == hist[cur + n_ok] and hist[cur + n_ok] not in stops):
            n_ok += 1
        out.append((best_len, best_end < n_prompt, n_ok))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", nargs="+", type=Path, help="pyspec bench --json files with none's outputs")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    args = ap.parse_args()
    with Engine(args.target, n_ctx=4096, n_threads=1) as engine:
        stops = set(engine._core.control_tokens())
        records: list[tuple[int, bool, int]] = []
        for path in args.bench:
            data = json.loads(path.read_text(encoding="utf-8"))
            none = next(r for r in data["results"] if r["method"] == "none")
            prompts = {str(p.id): p for p in load_suite(data["suite"], n=len(none["per_prompt"]))}
            for run in none["per_prompt"]:
                prompt = engine.prompt_tokens(list(prompts[run["prompt_id"]].messages))
                records += matches(prompt, list(run["tokens"]), stops)
    print(f"{len(records)} positions with a match")
    print("P(next follows | followed d tokens), by source and root match length; cells: d=" +
          ",".join(map(str, DEPTHS)) + " (positions that got that far)")
    for in_prompt in (True, False):
        for lo, hi in GROUPS:
            rows = [ok for n, src, ok in records if src == in_prompt and lo <= n <= hi]
            cells = []
            for d in DEPTHS:
                reach = [ok for ok in rows if ok >= d]
                cells.append(f"{sum(ok >= d + 1 for ok in reach) / len(reach):.2f}({len(reach)})" if reach else "-")
            print(f"  {'prompt' if in_prompt else 'output'} L{lo}-{hi}: " + " ".join(cells))
    for in_prompt in (True, False):
        short = [ok for n, src, ok in records if src == in_prompt and n <= 6]
        if short:
            print(f"matches of <= 6 tokens in the {'prompt' if in_prompt else 'output'}: {len(short)}, "
                  f"run 8+ tokens {sum(ok >= 8 for ok in short) / len(short):.2f}, "
                  f"20+ {sum(ok >= 20 for ok in short) / len(short):.2f}")


if __name__ == "__main__":
    main()

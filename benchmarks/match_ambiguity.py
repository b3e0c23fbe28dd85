"""Whether a prompt-lookup key with several different continuations in the context is worth
drafting (docs/results-speed.md, "Where the scheduler's priors come from": contested copy nodes).

For every recorded prompt of the given `pyspec bench --json` files (their `none` greedy outputs),
three views:
- auto's own drafts: `auto` is replayed without a model on those outputs (as
  benchmarks/auto_replay.py does, the engine's `_core.replay_auto`), and at each step that drafted,
  the prompt-lookup match at that point is recomputed here as the drafter finds it (longest
  suffix of at most 16 tokens with an earlier occurrence, the most recent one): its key length,
  how many distinct tokens follow the key's occurrences in the context (prompt and output so
  far), how many tokens all those continuations share, and the step's drafted and accepted
  tokens.
- every output position (all positions with a match, drafted or not): how many tokens of the
  match's continuation the output repeats, by key length and ambiguity.
- every node of those continuations (as if each position drafted its whole copy, up to 64
  nodes, until the first miss): P(node accepted | its parent accepted) for contested nodes (an
  earlier occurrence of the key whose continuation agreed with the copy so far goes on with a
  different token at this node) against the others, by
  the match's source (prompt or output).

    python benchmarks/match_ambiguity.py benchmarks/results/vs_llama_cpp_longedit.json \\
        benchmarks/results/vs_llama_cpp_edit.json benchmarks/results/vs_llama_cpp_humaneval.json

The replay is of auto as built (whatever its rules); the lookup and node figures describe the
recorded text, not the rules.
"""

from __future__ import annotations

import argparse
import collections
import json
from dataclasses import dataclass
from pathlib import Path

from pyspec import Engine, _core, calibration
from pyspec.config import GenerationConfig
from pyspec.data import load_suite

NGRAM_MAX = 16
MATCH_MAX = 65


@dataclass
class LookupMatch:
    n_key: int          # tokens of the longest suffix (<= NGRAM_MAX) found earlier
    n_matched: int      # that match extended backwards (<= MATCH_MAX)
    start: int          # first continuation token of the most recent occurrence
    in_prompt: bool     # that occurrence lies in the prompt
    n_occurrences: int  # earlier occurrences of the n_key-token key
    n_next: int         # distinct tokens following them
    shared: int         # tokens all their continuations share (capped at 64)
    contested: int      # depth of the first contested node of the copy (-1: none within 64)


def find_match(hist: list[int], n_prompt: int, index: dict[int, list[int]]) -> LookupMatch | None:
    """The drafter's match at the end of hist; index: token -> positions p < len(hist) - 1."""
    cur = len(hist)
    ends = index.get(hist[-1], [])
    best_n, best_end = 0, -1
    lengths = {}
    for e in ends:
        n = 1
        while n < NGRAM_MAX and n <= e and hist[e - n] == hist[cur - 1 - n]:
            n += 1
        lengths[e] = n
        if n >= best_n:  # ties: the most recent occurrence (ends are increasing)
            best_n, best_end = n, e
    if best_n == 0:
        return None
    occ = [e for e, n in lengths.items() if n >= best_n]
    n_matched = best_n
    while n_matched < MATCH_MAX and best_end - n_matched >= 0 and hist[best_end - n_matched] == hist[cur - 1 - n_matched]:
        n_matched += 1
    shared = 0
    while shared < 64 and all(e + 1 + shared < cur for e in occ) and len({hist[e + 1 + shared] for e in occ}) == 1:
        shared += 1
    # The first node where a rival (another occurrence whose continuation agreed so far, followed
    # through the known tokens only) goes on differently: the engine's contested node.
    rivals = [e for e in occ if e != best_end]
    contested = -1
    for d in range(64):
        if best_end + 1 + d >= cur or not rivals:
            break
        rivals = [e for e in rivals if e + 1 + d < cur]
        if any(hist[e + 1 + d] != hist[best_end + 1 + d] for e in rivals):
            contested = d
            break
    return LookupMatch(best_n, n_matched, best_end + 1, best_end < n_prompt, len(occ),
                       len({hist[e + 1] for e in occ}), shared, contested)


def repeated(hist: list[int], start: int, cur: int, stops: set[int]) -> int:
    """Tokens of the continuation at `start` that hist repeats from `cur` on (before a stop)."""
    n = 0
    while cur + n < len(hist) and start + n < cur + n and n < 64 and hist[start + n] == hist[cur + n] \
            and hist[cur + n] not in stops:
        n += 1
    return n


def copy_nodes(full: list[int], cur: int, m: LookupMatch, index: dict[int, list[int]],
               stops: set[int]) -> list[tuple[bool, bool, bool]]:
    """(in prompt, contested, accepted) for each node of the copy of match m at position cur of
    full, up to its first miss. A rival is an earlier occurrence of the key whose continuation has
    agreed with the copy so far (followed through the known tokens full[:cur] only)."""
    key = full[cur - m.n_key:cur]
    rivals = [e for e in index.get(full[cur - 1], []) if e + 1 != m.start and e + 1 >= m.n_key
              and full[e + 1 - m.n_key:e + 1] == key]
    out = []
    for d in range(64):
        pos = m.start + d
        if pos >= cur or cur + d >= len(full) or full[pos] in stops:
            break
        rivals = [e for e in rivals if e + 1 + d < cur]
        contested = any(full[e + 1 + d] != full[pos] for e in rivals)
        accepted = full[cur + d] == full[pos]
        out.append((m.in_prompt, contested, accepted))
        if not accepted:
            break
        rivals = [e for e in rivals if full[e + 1 + d] == full[pos]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", nargs="+", type=Path, help="pyspec bench --json files with none's outputs")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--json", type=Path, help="write the per-draft records here")
    args = ap.parse_args()
    with Engine(args.target, n_ctx=4096, n_threads=1) as engine:
        stops = set(engine._core.control_tokens())
        curve = calibration.load_cached(calibration.cache_key(engine, None))
        if curve is None:
            raise SystemExit("no cached calibration for the target: run `pyspec calibrate` first")
        params = GenerationConfig(method="auto").to_core()
        params.lookup.stop_tokens = sorted(stops)
        report = {}
        for path in args.bench:
            data = json.loads(path.read_text(encoding="utf-8"))
            none = next(r for r in data["results"] if r["method"] == "none")
            prompts = {str(p.id): p for p in load_suite(data["suite"], n=len(none["per_prompt"]))}
            runs = [(engine.prompt_tokens(list(prompts[r["prompt_id"]].messages)), list(r["tokens"]))
                    for r in none["per_prompt"] if r["tokens"]]
            replayed = _core.replay_auto(runs, curve._core(), params.lookup, params.pool, params.scheduler)
            drafts, positions, nodes = [], [], []
            for (prompt, output), (sizes, accepted, _) in zip(runs, replayed):
                hist = list(prompt)
                index: dict[int, list[int]] = collections.defaultdict(list)
                for i in range(len(hist) - 1):
                    index[hist[i]].append(i)
                full = prompt + output
                step_at = {}
                pos = 0
                for size, acc in zip(sizes, accepted):
                    step_at[pos] = (size - 1, acc)
                    pos += acc + 1
                for p in range(len(output)):
                    m = find_match(hist, len(prompt), index)
                    if m is not None:
                        rec = dict(m.__dict__, repeats=repeated(full, m.start, len(hist), stops))
                        positions.append(rec)
                        if p in step_at and step_at[p][0] > 0:
                            drafts.append(dict(rec, drafted=step_at[p][0], accepted=step_at[p][1]))
                        nodes += copy_nodes(full, len(hist), m, index, stops)
                    index[hist[-1]].append(len(hist) - 1)
                    hist.append(output[p])
            report[data["suite"]] = {"drafts": drafts, "positions": positions}
            summarize(data["suite"], drafts, positions, nodes)
        if args.json:
            args.json.write_text(json.dumps(report), encoding="utf-8")


def summarize(suite: str, drafts: list[dict], positions: list[dict], nodes: list[tuple[bool, bool, bool]]) -> None:
    print(f"== {suite}: auto's drafting steps (replayed), by key length and distinct next tokens")
    print("  key  next   steps  drafted  accepted  acc/drafted  first-token hit  shared(median)")
    groups = collections.defaultdict(list)
    for d in drafts:
        groups[(min(d["n_key"], 5), min(d["n_next"], 2))].append(d)
    for (n, amb), rows in sorted(groups.items()):
        dr, ac = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
        hit = sum(r["accepted"] > 0 for r in rows) / len(rows)
        shared = sorted(r["shared"] for r in rows)[len(rows) // 2]
        print(f"  {'5+' if n == 5 else n:>3}  {'1' if amb == 1 else '2+':>4}  {len(rows):6d}  {dr:7d}  {ac:8d}  "
              f"{ac / max(1, dr):11.2f}  {hit:15.2f}  {shared:14d}")
    for amb in (1, 2):
        rows = [d for d in drafts if min(d["n_next"], 2) == amb]
        dr, ac = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
        print(f"  all  {'1' if amb == 1 else '2+':>4}  {len(rows):6d}  {dr:7d}  {ac:8d}  {ac / max(1, dr):11.2f}")
    print(f"== {suite}: every output position with a prompt-lookup match: P(repeats >= 1, >= 8), by key and next tokens")
    groups = collections.defaultdict(list)
    for r in positions:
        groups[(min(r["n_key"], 5), min(r["n_next"], 2))].append(r["repeats"])
    for (n, amb), v in sorted(groups.items()):
        print(f"  key {'5+' if n == 5 else n:>2} next {'1' if amb == 1 else '2+':>2}: n={len(v):5d}  "
              f"P>=1 {sum(x >= 1 for x in v) / len(v):.2f}  P>=8 {sum(x >= 8 for x in v) / len(v):.2f}")

    print(f"== {suite}: copy nodes, P(accepted | parent accepted)")
    for in_prompt in (True, False):
        for contested in (False, True):
            v = [a for p, c, a in nodes if p == in_prompt and c == contested]
            if v:
                print(f"  {'prompt' if in_prompt else 'output'} {'contested' if contested else 'uncontested':<12} "
                      f"n={len(v):6d}  P={sum(v) / len(v):.3f}")

if __name__ == "__main__":
    main()

"""Constrained JSON output on the real target: every output parses and validates against its
schema, speculative output equals constrained plain decoding token for token, and what
speculation gains on JSON against the same tasks answered in free text.

Tasks (chat template, greedy):
- HumanEval i: describe the function as JSON (name, parameters with types, return type, a
  summary): the answer copies names from the prompt;
- GSM8K i: solve the problem as JSON (steps, the final number).
Each task runs five ways, interleaved per task: with the schema (`json_schema`), plain decoding,
METHOD (default auto) and METHOD without grammar drafts (`grammar_drafts=False`: only what the
drafter proposes); without it, asking for the same content in prose, plain decoding and METHOD.
Reported: decode tokens/s (generated tokens / generation time, prefill excluded), ratios to
plain decoding per task (median), parse and validation counts of every JSON output, and greedy
identity with the divergences' logit gaps. The phrase pool and auto's acceptance statistics
carry over from task to task, as in a server; within a task every speculative run starts from
the same pool and statistics (saved before the task, loaded before each run), so no run learns
from another's answer to the same prompt.

    python benchmarks/json_output.py --humaneval 30 --gsm8k 30 --json benchmarks/results/json_output.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspec import Engine
from pyspec.config import DEFAULT_DRAFT, DEFAULT_TARGET
from pyspec.data import load_suite
from pyspec.models import resolve_model

FUNCTION_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "parameters": {"type": "array", "maxItems": 8, "items": {
            "type": "object", "properties": {"name": {"type": "string"}, "type": {"type": "string"}},
            "required": ["name", "type"], "additionalProperties": False}},
        "returns": {"type": "string"},
        "summary": {"type": "string", "maxLength": 200},
    },
    "required": ["name", "parameters", "returns", "summary"],
    "additionalProperties": False,
}
SOLUTION_SCHEMA = {
    "type": "object",
    "properties": {
        "steps": {"type": "array", "maxItems": 5, "items": {"type": "string", "maxLength": 100}},
        "answer": {"type": "number"},
    },
    "required": ["steps", "answer"],
    "additionalProperties": False,
}


def tasks(n_humaneval: int, n_gsm8k: int) -> list[dict[str, Any]]:
    out = []
    for p in load_suite("humaneval", n_humaneval):
        code = f"```python\n{p.text.rstrip()}\n```"
        out.append({"id": p.id, "schema": FUNCTION_SCHEMA,
                    "json": f"Describe this Python function as JSON with its name, its parameters (name and type), "
                            f"its return type and a one-sentence summary.\n\n{code}",
                    "text": f"Describe this Python function: its name, its parameters (name and type), its return "
                            f"type and a one-sentence summary.\n\n{code}"})
    for p in load_suite("gsm8k", n_gsm8k):
        out.append({"id": p.id, "schema": SOLUTION_SCHEMA,
                    "json": f"Solve the problem. Answer as JSON with the steps of the solution and the final "
                            f"number.\n\n{p.text}",
                    "text": f"Solve the problem. Give the steps of the solution and the final number.\n\n{p.text}"})
    return out


def validate(doc: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """What in doc breaks schema: the keywords these schemas use (type, properties, required,
    additionalProperties false, items, maxItems, maxLength)."""
    kind = schema.get("type")
    checks = {"object": dict, "array": list, "string": str}
    if kind == "number":
        if isinstance(doc, bool) or not isinstance(doc, (int, float)):
            return [f"{where}: not a number"]
        return []
    if kind in checks and not isinstance(doc, checks[kind]):
        return [f"{where}: not {kind}"]
    errors = []
    if kind == "object":
        props = schema.get("properties", {})
        errors += [f"{where}: lacks {k}" for k in schema.get("required", []) if k not in doc]
        if schema.get("additionalProperties") is False:
            errors += [f"{where}: extra {k}" for k in doc if k not in props]
        for k, v in doc.items():
            if k in props:
                errors += validate(v, props[k], f"{where}.{k}")
    elif kind == "array":
        if len(doc) > schema.get("maxItems", len(doc)):
            errors.append(f"{where}: {len(doc)} items")
        for i, v in enumerate(doc):
            errors += validate(v, schema.get("items", {}), f"{where}[{i}]")
    elif kind == "string" and len(doc) > schema.get("maxLength", len(doc)):
        errors.append(f"{where}: {len(doc)} characters")
    return errors


def run_one(engine: Engine, messages: list[dict[str, str]] | str, method: str, max_tokens: int,
            schema: dict[str, Any] | None, grammar_drafts: bool = True) -> dict[str, Any]:
    r = engine.generate(messages, max_tokens=max_tokens, method=method, json_schema=schema,
                        grammar_drafts=grammar_drafts)
    s = r.stats
    return {"tokens": r.tokens, "text": r.text, "finish_reason": r.finish_reason, "n_generated": s.n_generated,
            "tok_s": s.tokens_per_second, "n_target_calls": s.n_target_calls, "acceptance": s.acceptance_rate,
            "t_generation_ms": s.t_total_ms - s.t_prefill_ms}


def divergence_gaps(engine: Engine, todo: list[dict[str, Any]], records: list[dict[str, Any]], method: str) -> None:
    """For each JSON output of METHOD that differs from plain decoding: the first differing
    position and the logit gap there between the two outputs' tokens, in the target's one-token
    row (both tokens are ones the schema allows). A gap under 0.25 is a near-tie that batched
    and one-token logits may order differently (docs/numerics.md)."""
    by_id = {t["id"]: t for t in todo}
    for rec in records:
        if rec["identical"]:
            continue
        a, b = rec["json:none"]["tokens"], rec[f"json:{method}"]["tokens"]
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        if i >= min(len(a), len(b)):
            rec["divergence"] = {"position": i, "gap": None}
            continue
        prompt = engine.prompt_tokens([{"role": "user", "content": by_id[rec["id"]]["json"]}])
        row = engine.evaluate(prompt + a[:i])[0]
        rec["divergence"] = {"position": i, "plain_token": a[i], "spec_token": b[i],
                             "gap": float(abs(row[a[i]] - row[b[i]]))}


def summarize(records: list[dict[str, Any]], method: str, max_tokens: int) -> dict[str, Any]:
    """Per suite and overall: median ratio to plain decoding per task, pooled tokens/s, tokens per
    target call, validation, identity and divergence gaps."""
    summary: dict[str, Any] = {"tasks": len(records), "method": method, "max_tokens": max_tokens,
                               "machine": platform.processor() or platform.machine()}
    for suite in ("humaneval", "gsm8k", "all"):
        rows = [r for r in records if suite == "all" or r["id"].lower().startswith(suite)]
        if not rows:
            continue
        s: dict[str, Any] = {"tasks": len(rows)}
        for form, key in (("json", method), ("json-nogd", f"{method}-nogd"), ("text", method)):
            none = [r[f"{form.split('-')[0]}:none"] for r in rows]
            spec = [r[f"{form.split('-')[0]}:{key}"] for r in rows]
            s[form] = {
                "median_ratio": statistics.median(b["tok_s"] / a["tok_s"] for a, b in zip(none, spec)),
                "none_tok_s": sum(a["n_generated"] for a in none) / sum(a["t_generation_ms"] for a in none) * 1e3,
                "spec_tok_s": sum(b["n_generated"] for b in spec) / sum(b["t_generation_ms"] for b in spec) * 1e3,
                "mean_tokens": statistics.mean(a["n_generated"] for a in none),
                "stopped": sum(a["finish_reason"] == "stop" for a in none),
                "tokens_per_call": sum(b["n_generated"] for b in spec) / sum(b["n_target_calls"] for b in spec),
            }
        s["json_requests"] = 3 * len(rows)
        s["json_invalid"] = sum(len(r["errors"]) for r in rows)
        s["identical"] = sum(r["identical"] for r in rows)
        s["identical_nogd"] = sum(r["identical_nogd"] for r in rows)
        s["divergence_gaps"] = [r["divergence"]["gap"] for r in rows if "divergence" in r]
        summary[suite] = s
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--humaneval", type=int, default=50, help="HumanEval tasks (from the first)")
    ap.add_argument("--gsm8k", type=int, default=50, help="GSM8K tasks (from the first)")
    ap.add_argument("--method", default="auto", help="the speculative method compared with none")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--json", help="write every record and the summary here")
    ap.add_argument("--gaps", metavar="FILE", help="only add the divergence gaps to the records of an earlier --json")
    ap.add_argument("--summarize", metavar="FILE", help="only summarize the records of an earlier --json again")
    args = ap.parse_args(argv)
    if args.summarize:
        with open(args.summarize, encoding="utf-8") as f:
            saved = json.load(f)
        old = saved["summary"]
        saved["summary"] = summarize(saved["records"], old["method"], old["max_tokens"]) | {"machine": old["machine"]}
        print(json.dumps(saved["summary"], indent=2))
        with open(args.summarize, "w", encoding="utf-8") as f:
            json.dump(saved, f)
        return 0

    todo = tasks(args.humaneval, args.gsm8k)
    records = []
    with Engine(resolve_model(args.target, progress=True), draft=resolve_model(args.draft, progress=True),
                n_threads=args.threads) as engine:
        if args.gaps:
            with open(args.gaps, encoding="utf-8") as f:
                saved = json.load(f)
            divergence_gaps(engine, todo, saved["records"], saved["summary"]["method"])
            saved["summary"]["divergence_gaps"] = [r["divergence"]["gap"] for r in saved["records"] if "divergence" in r]
            print(json.dumps(saved["summary"]["divergence_gaps"]))
            with open(args.gaps, "w", encoding="utf-8") as f:
                json.dump(saved, f)
            return 0
        engine.generate("warm up", max_tokens=8, method="none")
        t0 = time.time()
        state_dir = Path(tempfile.mkdtemp(prefix="json-output-"))
        pool_file, stats_file = state_dir / "pool.bin", state_dir / "stats.json"

        def run(messages: list[dict[str, str]], method: str, schema: dict[str, Any] | None,
                grammar_drafts: bool = True) -> dict[str, Any]:
            if method != "none":  # the task's starting pool and statistics
                engine.load_pool(pool_file)
                engine.load_stats(stats_file)
            return run_one(engine, messages, method, args.max_tokens, schema, grammar_drafts)

        for i, task in enumerate(todo):
            engine.save_pool(pool_file)
            if engine.cost_model() is not None:
                engine.save_stats(stats_file)
            else:  # before the first auto run: nothing learnt yet
                run_one(engine, "warm up", args.method, 8, None, True)
                engine.save_stats(stats_file)
            rec: dict[str, Any] = {"id": task["id"]}
            json_messages = [{"role": "user", "content": task["json"]}]
            text_messages = [{"role": "user", "content": task["text"]}]
            rec["json:none"] = run(json_messages, "none", task["schema"])
            rec[f"json:{args.method}-nogd"] = run(json_messages, args.method, task["schema"], grammar_drafts=False)
            rec[f"json:{args.method}"] = run(json_messages, args.method, task["schema"])
            rec["text:none"] = run(text_messages, "none", None)
            rec[f"text:{args.method}"] = run(text_messages, args.method, None)
            plain = rec["json:none"]
            rec["identical"] = rec[f"json:{args.method}"]["tokens"] == plain["tokens"]
            rec["identical_nogd"] = rec[f"json:{args.method}-nogd"]["tokens"] == plain["tokens"]
            rec["errors"] = {}
            for key in ("json:none", f"json:{args.method}", f"json:{args.method}-nogd"):
                try:
                    errors = validate(json.loads(rec[key]["text"]), task["schema"])
                except json.JSONDecodeError as exc:
                    errors = [f"does not parse: {exc}"]
                if errors:
                    rec["errors"][key] = errors
            rec["parsed"] = not any("does not parse" in e[0] for e in rec["errors"].values())
            records.append(rec)
            print(f"[{i + 1}/{len(todo)}] {task['id']}: json {plain['n_generated']} tokens "
                  f"{rec[f'json:{args.method}']['tok_s'] / max(plain['tok_s'], 1e-9):.2f}x "
                  f"(no grammar drafts {rec[f'json:{args.method}-nogd']['tok_s'] / max(plain['tok_s'], 1e-9):.2f}x), "
                  f"text {rec['text:none']['n_generated']} tokens "
                  f"{rec[f'text:{args.method}']['tok_s'] / max(rec['text:none']['tok_s'], 1e-9):.2f}x, "
                  f"{'valid' if not rec['errors'] else rec['errors']}"
                  f"{'' if rec['identical'] else ', NOT IDENTICAL'}  ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
        divergence_gaps(engine, todo, records, args.method)

    summary = summarize(records, args.method, args.max_tokens)
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": summary, "records": records}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

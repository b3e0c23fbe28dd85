"""Multi-turn conversations through OpenAI-compatible servers, side by side in one run: `pyspec
serve` with its prefix cache, `pyspec serve --no-prefix-cache` (every turn re-processes the whole
conversation), llama-cpp-python's own server (`python -m llama_cpp.server`, which also keeps
the KV cache of the previous prompt) and llama.cpp's `llama-server` with its defaults (slots,
prompt cache), plain and with its own n-gram speculation, all on the same GGUF with the same
threads.

Conversations (each server generates its own answers, which become the next turn's history):
- MT-Bench: the two turns of --mtbench questions, then --followups follow-up turns;
- code sessions: a HumanEval function written, then edited and refined over --code-turns turns.
Each turn streams (greedy, max_tokens --max-tokens) and records time to first token (first
non-empty content chunk), decode speed (completion tokens after the first / time after the first
chunk; tokens counted with the model's tokenizer on the answer text, the same for every server)
and end-to-end time.

    python benchmarks/serve_multiturn.py --threads 2 --json benchmarks/results/serve_multiturn.json
    python -m pyspec.bench.llamacpp --server     # once: llama-server from the pinned llama.cpp
    python benchmarks/serve_multiturn.py --servers pyspec,llama-server,llama-server-ngram --threads 2

Needs the server extra, the openai client and llama-cpp-python's server extras:
pip install "pyspec-engine[server]" openai "llama-cpp-python[server]==0.3.36".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import openai

from pyspec.bench.child_server import (ChildServer, add_server_bench_options, llama_cpp_python_command,
                                       llama_server_command, pyspec_command)
from pyspec.bench.llamacpp import find_llama_server
from pyspec.data import dataset_file, read_jsonl
from pyspec.models import resolve_model
from pyspec.rpc import free_port

MTBENCH_CATEGORIES = ("coding", "writing", "reasoning", "math", "extraction", "humanities", "stem", "roleplay")
FOLLOWUPS = (
    "Summarize your previous answer in three bullet points.",
    "Which part of your answer is the most likely to be wrong, and why?",
)
CODE_TURNS = (
    "Complete the following Python function. Reply with the whole function in one ```python block.\n\n"
    "```python\n{prompt}```",
    "Add type hints to the function and a docstring that explains the parameters. Show the whole function.",
    "Make the function raise ValueError with a clear message on invalid input. Show the whole function.",
    "Write three pytest tests for the function.",
    "Rename the local variables so that the code reads better, and show the final version of the function.",
)


@dataclass(frozen=True)
class Conversation:
    name: str
    kind: str  # "mtbench" | "code"
    turns: tuple[str, ...]


@dataclass
class TurnRecord:
    server: str
    conversation: str
    kind: str
    turn: int  # from 1
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    decode_tokens_per_s: float
    e2e_s: float
    cached_tokens: int | None  # what the server reported (pyspec: usage.prompt_tokens_details)


def conversations(n_mtbench: int, n_followups: int, n_code: int, code_turns: int) -> list[Conversation]:
    out: list[Conversation] = []
    records = read_jsonl(dataset_file("mtbench"))
    by_category: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_category.setdefault(r["category"], []).append(r)
    picked = [by_category[c][0] for c in MTBENCH_CATEGORIES if c in by_category][:n_mtbench]
    for r in picked:
        out.append(Conversation(f"mtbench/{r['question_id']}/{r['category']}", "mtbench",
                                tuple(r["turns"][:2]) + FOLLOWUPS[:n_followups]))
    for r in read_jsonl(dataset_file("humaneval"))[:n_code]:
        first = CODE_TURNS[0].format(prompt=r["prompt"])
        out.append(Conversation(f"code/{r['task_id']}", "code", (first,) + CODE_TURNS[1:code_turns]))
    return out


def run_conversation(client: openai.OpenAI, server: ChildServer, conv: Conversation, max_tokens: int,
                     count_tokens: Any) -> list[TurnRecord]:
    messages: list[dict[str, str]] = []
    records = []
    for i, text in enumerate(conv.turns, start=1):
        messages.append({"role": "user", "content": text})
        t0 = time.perf_counter()
        t_first = None
        pieces: list[str] = []
        usage = None
        # pyspec and llama-server report usage (with the cached prompt tokens) in a last chunk when asked.
        extra = {"stream_options": {"include_usage": True}} if not server.name.startswith("llama-cpp-python") else {}
        stream = client.chat.completions.create(model=server.model, messages=messages, max_tokens=max_tokens,
                                                temperature=0.0, stream=True, **extra)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if t_first is None:
                    t_first = time.perf_counter()
                pieces.append(chunk.choices[0].delta.content)
            if getattr(chunk, "usage", None):
                usage = chunk.usage
        t_end = time.perf_counter()
        answer = "".join(pieces)
        n_out = count_tokens(answer)
        t_first = t_first if t_first is not None else t_end
        cached = None
        if usage is not None and getattr(usage, "prompt_tokens_details", None) is not None:
            cached = usage.prompt_tokens_details.cached_tokens
        prompt_tokens = usage.prompt_tokens if usage is not None else -1
        decode_s = t_end - t_first
        records.append(TurnRecord(server.name, conv.name, conv.kind, i, prompt_tokens, n_out, t_first - t0,
                                  (n_out - 1) / decode_s if n_out > 1 and decode_s > 0 else 0.0, t_end - t0, cached))
        messages.append({"role": "assistant", "content": answer})
        print(f"  {server.name:22s} {conv.name:28s} turn {i}: ttft {t_first - t0:6.2f} s, "
              f"{records[-1].decode_tokens_per_s:5.1f} tok/s, {n_out:4d} tokens, e2e {t_end - t0:6.2f} s"
              + (f", cached {cached}" if cached is not None else ""), flush=True)
    return records


def server_commands(args: argparse.Namespace, target: str, draft: str, port: int) -> dict[str, list[str]]:
    pyspec = pyspec_command(target, draft, port, threads=args.threads, n_ctx=args.n_ctx, method=args.method)
    commands = {
        "pyspec": pyspec,
        "pyspec-no-prefix-cache": pyspec + ["--no-prefix-cache"],
        "llama-cpp-python": llama_cpp_python_command(target, port, threads=args.threads, n_ctx=args.n_ctx),
    }
    if any(name.startswith("llama-server") for name in args.servers.split(",")):
        binary = find_llama_server()
        commands["llama-server"] = llama_server_command(binary, target, port, threads=args.threads, n_ctx=args.n_ctx)
        commands["llama-server-ngram"] = llama_server_command(binary, target, port, threads=args.threads,
                                                              n_ctx=args.n_ctx, spec_type=args.llama_server_spec)
    return commands


def summarize(records: list[TurnRecord], servers: list[str]) -> dict[str, Any]:
    """Means per server, kind and turn; the ratios docs/results-server.md states."""
    def mean(values: list[float]) -> float | None:
        return statistics.fmean(values) if values else None

    table: dict[str, Any] = {}
    for server in servers:
        mine = [r for r in records if r.server == server]
        table[server] = {
            kind: {
                "ttft_s_by_turn": {t: mean([r.ttft_s for r in mine if r.kind == kind and r.turn == t])
                                   for t in sorted({r.turn for r in mine if r.kind == kind})},
                "decode_tok_s_by_turn": {t: mean([r.decode_tokens_per_s for r in mine if r.kind == kind and r.turn == t])
                                         for t in sorted({r.turn for r in mine if r.kind == kind})},
                "e2e_s_total": sum(r.e2e_s for r in mine if r.kind == kind),
                "ttft_s_turn2_on": mean([r.ttft_s for r in mine if r.kind == kind and r.turn >= 2]),
            }
            for kind in sorted({r.kind for r in mine})
        }
    ratios: dict[str, Any] = {}
    if "pyspec" in table and "pyspec-no-prefix-cache" in table:
        mine, cold = table["pyspec"], table["pyspec-no-prefix-cache"]
        ratios["ttft_turn2_on_prefix_vs_no_prefix"] = {
            k: mine[k]["ttft_s_turn2_on"] / cold[k]["ttft_s_turn2_on"] for k in mine if cold[k]["ttft_s_turn2_on"]}
    if "pyspec" in table and "llama-cpp-python" in table:
        mine, peer = table["pyspec"], table["llama-cpp-python"]
        ratios["e2e_pyspec_vs_llama_cpp_python"] = {k: mine[k]["e2e_s_total"] / peer[k]["e2e_s_total"] for k in mine}
        ratios["ttft_turn2_on_pyspec_vs_llama_cpp_python"] = {
            k: mine[k]["ttft_s_turn2_on"] / peer[k]["ttft_s_turn2_on"] for k in mine if peer[k]["ttft_s_turn2_on"]}
    if "pyspec" in table:
        mine = table["pyspec"]
        for peer_name in ("llama-server", "llama-server-ngram"):
            if peer_name not in table:
                continue
            peer = table[peer_name]
            ratios[f"ttft_turn2_on_pyspec_vs_{peer_name}"] = {
                k: mine[k]["ttft_s_turn2_on"] / peer[k]["ttft_s_turn2_on"] for k in mine
                if k in peer and peer[k]["ttft_s_turn2_on"]}
            ratios[f"e2e_pyspec_vs_{peer_name}"] = {k: mine[k]["e2e_s_total"] / peer[k]["e2e_s_total"]
                                                   for k in mine if k in peer}
            ratios[f"decode_pyspec_vs_{peer_name}"] = {
                k: _mean_decode(records, "pyspec", k) / _mean_decode(records, peer_name, k) for k in mine
                if k in peer and _mean_decode(records, peer_name, k)}
    return {"by_server": table, "ratios": ratios}


def _mean_decode(records: list[TurnRecord], server: str, kind: str) -> float:
    """Mean decode tokens/s over a server's turns of one kind that produced more than one token."""
    values = [r.decode_tokens_per_s for r in records
              if r.server == server and r.kind == kind and r.completion_tokens > 1]
    return statistics.fmean(values) if values else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_bench_options(p)
    p.add_argument("--method", default="auto", help="pyspec's method (default auto)")
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens per answer (default 128)")
    p.add_argument("--mtbench", type=int, default=6, help="MT-Bench conversations (default 6)")
    p.add_argument("--followups", type=int, default=1, help=f"turns after MT-Bench's two (<= {len(FOLLOWUPS)})")
    p.add_argument("--code", type=int, default=4, help="code sessions (default 4)")
    p.add_argument("--code-turns", type=int, default=4, help=f"turns per code session (<= {len(CODE_TURNS)})")
    p.add_argument("--servers", default="pyspec,pyspec-no-prefix-cache,llama-cpp-python",
                   help="comma-separated: pyspec, pyspec-no-prefix-cache, llama-cpp-python, llama-server (llama.cpp's, "
                        "built by `python -m pyspec.bench.llamacpp --server`), llama-server-ngram (the same with "
                        "--llama-server-spec)")
    p.add_argument("--llama-server-spec", default="ngram-mod",
                   help="llama-server-ngram's --spec-type (default ngram-mod)")
    p.add_argument("--json", default=None, help="write every turn's record and the summary here")
    args = p.parse_args(argv)

    target, draft = resolve_model(args.target), resolve_model(args.draft)
    convs = conversations(args.mtbench, args.followups, args.code, args.code_turns)
    print(f"{len(convs)} conversations, {sum(len(c.turns) for c in convs)} turns per server", flush=True)
    from llama_cpp import Llama

    vocab = Llama(model_path=target, vocab_only=True, verbose=False)

    def count_tokens(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    names = args.servers.split(",")
    records: list[TurnRecord] = []
    log_dir = Path(tempfile.mkdtemp(prefix="pyspec-serve-bench-"))
    for name in names:
        port = free_port()
        commands = server_commands(args, target, draft, port)
        if name not in commands:
            raise SystemExit(f"unknown server {name!r}; known: {', '.join(commands)}")
        server = ChildServer(name, commands[name], port, log_dir)
        try:
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=1800)
            # Warm-up (not timed): first-use allocations; pyspec measures its cost curves if missing.
            client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=8, temperature=0.0)
            for conv in convs:
                records += run_conversation(client, server, conv, args.max_tokens, count_tokens)
        finally:
            server.stop()
    summary = summarize(records, names)
    print(json.dumps(summary, indent=2))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "cpu_count": os.cpu_count(), "records": [asdict(r) for r in records],
                       "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

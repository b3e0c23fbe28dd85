"""The request shapes OpenAI-compatible clients send, replayed against `pyspec serve` and llama.cpp's
`llama-server` side by side (same GGUF, same threads and context).

Each case is one request as a kind of client sends it, extra fields included: a chat UI's
sampling fields and `user`, the `openai` client's newer `developer` role and
`max_completion_tokens`, content as a list of parts, reasoning and template extras, penalties and
`logit_bias`, stop lists with log-probabilities, JSON mode and JSON schemas, tools with each
`tool_choice` and a tool-result round trip, streaming with usage, legacy completions with a
fill-in-the-middle `suffix`, and the non-OpenAI endpoints llama.cpp clients use (`/health`,
`/tokenize`, `/detokenize`). A case passes when the server answers 200 with the response's
documented shape (and, for JSON, text that parses and validates; for tools, a call of a named
tool with JSON arguments); the report shows every case's status and a short reason per server.

    python -m pyspec.bench.llamacpp --server     # once: llama-server from the pinned llama.cpp
    python benchmarks/server_compat.py --threads 2 --json benchmarks/results/server_compat.json
    python benchmarks/server_compat.py --url http://127.0.0.1:8000   # a server already running

tests/test_server_compat.py runs every case against `pyspec serve` on the tiny test models.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from pyspec.bench.child_server import ChildServer, add_server_bench_options, llama_server_command, pyspec_command
from pyspec.bench.llamacpp import find_llama_server
from pyspec.rpc import free_port

QUESTION = "Name three primary colours."
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CUT = "cut at max_tokens"  # a constrained answer (JSON, a tool call) that the token limit ended unfinished
PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                 "required": ["name", "age"], "additionalProperties": False}


@dataclass
class Outcome:
    case: str
    server: str
    status: int  # HTTP status (0: no answer)
    ok: bool
    detail: str  # why it failed, or a short look at what came back


@dataclass(frozen=True)
class Case:
    name: str
    sender: str  # the kind of client whose request this is
    method: str
    path: str
    body: dict[str, Any] | None
    # (reply, request) -> why it fails, None when it passes; a stream's reply is its chunks
    check: Callable[[Any, dict[str, Any] | None], str | None]

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))


def _message(reply: dict[str, Any]) -> dict[str, Any]:
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0].get("message"), dict):
        raise ValueError("no choices[0].message")
    return choices[0]["message"]


def check_chat(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    message = _message(reply)
    if not isinstance(message.get("content"), str) and not message.get("tool_calls"):
        return "message has neither content nor tool_calls"
    if reply["choices"][0].get("finish_reason") not in ("stop", "length", "tool_calls"):
        return f"finish_reason {reply['choices'][0].get('finish_reason')!r}"
    return None


def check_logprobs(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    why = check_chat(reply, body)
    if why:
        return why
    content = (reply["choices"][0].get("logprobs") or {}).get("content")
    if not content or not all("logprob" in t and len(t.get("top_logprobs", [])) == body["top_logprobs"]
                              for t in content):
        return "logprobs.content missing or without top_logprobs"
    return None


def _json_content(reply: dict[str, Any]) -> tuple[Any, str | None]:
    message = _message(reply)
    if reply["choices"][0].get("finish_reason") != "stop":
        return None, f"{CUT} ({reply['choices'][0].get('finish_reason')!r})"
    try:
        return json.loads(message.get("content") or ""), None
    except json.JSONDecodeError:
        return None, f"content is not JSON: {str(message.get('content'))[:60]!r}"


def check_json_object(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    value, why = _json_content(reply)
    if why:
        return why
    return None if isinstance(value, dict) else "content is JSON but not an object"


def check_json_schema(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    value, why = _json_content(reply)
    if why:
        return why
    try:
        import jsonschema
    except ImportError:  # the check without the validator: the schema's required keys and types
        ok = isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("age"), int)
        return None if ok else f"does not match the schema: {value!r}"[:100]
    errors = list(jsonschema.Draft202012Validator(PERSON_SCHEMA).iter_errors(value))
    return f"does not match the schema: {errors[0].message}"[:100] if errors else None


def check_tool_call(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    message = _message(reply)
    calls = message.get("tool_calls") or []
    if not calls:
        finish = reply["choices"][0].get("finish_reason")
        return f"{CUT} ({finish!r})" if finish == "length" else f"no tool_calls (finish_reason {finish!r})"
    names = {t["function"]["name"] for t in (body or {}).get("tools", [])}
    for call in calls:
        function = call.get("function") or {}
        if function.get("name") not in names:
            return f"called an unknown tool {function.get('name')!r}"
        try:
            json.loads(function.get("arguments") or "")
        except json.JSONDecodeError:
            return f"arguments are not JSON: {function.get('arguments')!r}"[:100]
        if not call.get("id"):
            return "a tool call without an id"
    return None


def check_named_tool(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    why = check_tool_call(reply, body)
    if why:
        return why
    wanted = body["tool_choice"]["function"]["name"]  # type: ignore[index]
    got = _message(reply)["tool_calls"][0]["function"]["name"]
    return None if got == wanted else f"called {got!r}, not the named {wanted!r}"


def check_completion(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0].get("text"), str):
        return "no choices[0].text"
    return None


def check_models(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    data = reply.get("data")
    return None if isinstance(data, list) and data and all("id" in m for m in data) else "no data[].id"


def check_health(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    return None  # the 200 itself is the answer (run_case checks the status of every case)


def check_tokenize(reply: dict[str, Any], body: dict[str, Any] | None) -> str | None:
    tokens = reply.get("tokens")
    return None if isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens) else "no tokens[]"


def check_stream(chunks: list[dict[str, Any]], body: dict[str, Any] | None) -> str | None:
    """A stream's chunks (the JSON of each `data:` line before [DONE])."""
    if not chunks:
        return "no chunks"
    chat = body is not None and "messages" in body
    text, calls, usage, finish = "", 0, None, None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            finish = choice.get("finish_reason") or finish
            if chat:
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    return "a chunk without choices[].delta"
                text += delta.get("content") or ""
                calls += len(delta.get("tool_calls") or [])
            else:
                text += choice.get("text") or ""
    if body and body.get("tool_choice") == "required" and not calls:
        return f"{CUT} ('length')" if finish == "length" else "no tool_calls in the stream"
    if not text and not calls:
        return "the stream carried no text"
    if body and (body.get("stream_options") or {}).get("include_usage") and not usage:
        return "no usage chunk although stream_options.include_usage"
    return None


def cases() -> list[Case]:
    system = {"role": "system", "content": "You are a helpful assistant."}
    user = {"role": "user", "content": QUESTION}
    chat = [system, user]
    tools_body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                  "tools": [WEATHER_TOOL, TIME_TOOL], "max_tokens": 96, "temperature": 0}
    return [
        Case("chat, minimal", "openai client", "POST", "/v1/chat/completions",
             {"model": "gpt-4o-mini", "messages": chat, "max_tokens": 32, "temperature": 0}, check_chat),
        Case("chat, developer role and max_completion_tokens", "openai client (newer models)", "POST",
             "/v1/chat/completions",
             {"model": "gpt-4o", "messages": [{"role": "developer", "content": "Answer briefly."}, user],
              "max_completion_tokens": 32, "temperature": 0}, check_chat),
        Case("chat, content as a list of parts", "chat UIs with attachments", "POST", "/v1/chat/completions",
             {"model": "local", "messages": [system, {"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
              "max_tokens": 32, "temperature": 0}, check_chat),
        Case("chat, a chat UI's sampling fields and user", "chat UIs", "POST", "/v1/chat/completions",
             {"model": "llama3.1:8b", "messages": chat, "max_tokens": 32, "temperature": 0.7, "top_p": 0.9,
              "seed": 42, "n": 1, "user": "user-1234", "presence_penalty": 0, "frequency_penalty": 0}, check_chat),
        Case("chat, reasoning and template extras", "agent frameworks", "POST", "/v1/chat/completions",
             {"model": "target", "messages": chat, "max_tokens": 32, "temperature": 0, "reasoning_effort": "low",
              "chat_template_kwargs": {"enable_thinking": False}, "store": False, "metadata": {"session": "a"},
              "parallel_tool_calls": False}, check_chat),
        Case("chat, penalties, logit_bias and repetition_penalty", "llama.cpp and vLLM clients", "POST",
             "/v1/chat/completions",
             {"model": "target", "messages": chat, "max_tokens": 32, "temperature": 0, "presence_penalty": 0.5,
              "frequency_penalty": 0.3, "logit_bias": {"15": -100}, "repetition_penalty": 1.1}, check_chat),
        Case("chat, stop list and top_logprobs", "LangChain", "POST", "/v1/chat/completions",
             {"model": "target", "messages": chat, "max_tokens": 24, "temperature": 0, "stop": ["\n\n\n", "###"],
              "logprobs": True, "top_logprobs": 2}, check_logprobs),
        Case("chat, stream with usage", "chat UIs", "POST", "/v1/chat/completions",
             {"model": "target", "messages": chat, "max_tokens": 32, "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}}, check_stream),
        Case("json_object", "'give me JSON' apps", "POST", "/v1/chat/completions",
             {"model": "target", "max_tokens": 96, "temperature": 0, "response_format": {"type": "json_object"},
              "messages": [{"role": "user", "content": "Reply with a JSON object with keys colour and hex for red."}]},
             check_json_object),
        Case("json_schema, strict", "structured-output libraries", "POST", "/v1/chat/completions",
             {"model": "target", "max_tokens": 96, "temperature": 0,
              "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": True,
                                                                         "schema": PERSON_SCHEMA}},
              "messages": [{"role": "user", "content": "Invent a person: their name and age, as JSON."}]},
             check_json_schema),
        Case("tools, tool_choice auto", "agent frameworks", "POST", "/v1/chat/completions",
             {"model": "target", **tools_body, "tool_choice": "auto"}, check_chat),
        Case("tools, tool_choice required", "agent frameworks", "POST", "/v1/chat/completions",
             {"model": "target", **tools_body, "tool_choice": "required"}, check_tool_call),
        Case("tools, a named function", "agent frameworks", "POST", "/v1/chat/completions",
             {"model": "target", **tools_body, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
             check_named_tool),
        Case("tools, a tool result round trip", "agent frameworks", "POST", "/v1/chat/completions",
             {"model": "target", "tools": [WEATHER_TOOL], "max_tokens": 48, "temperature": 0, "messages": [
                 {"role": "user", "content": "What is the weather in Paris?"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature_c\": 18, \"sky\": \"clear\"}"}]},
             check_chat),
        Case("tools, streamed required call", "agent frameworks", "POST", "/v1/chat/completions",
             {"model": "target", **tools_body, "tool_choice": "required", "stream": True}, check_stream),
        Case("completion, prompt and stop", "legacy completions", "POST", "/v1/completions",
             {"model": "target", "prompt": "def add(a, b):\n", "max_tokens": 32, "temperature": 0, "stop": ["\ndef "]},
             check_completion),
        Case("completion, fill in the middle (suffix)", "editor assistants", "POST", "/v1/completions",
             {"model": "target", "prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))\n",
              "max_tokens": 24, "temperature": 0}, check_completion),
        Case("completion, stream", "editor assistants", "POST", "/v1/completions",
             {"model": "target", "prompt": "def add(a, b):\n", "max_tokens": 24, "temperature": 0, "stream": True},
             check_stream),
        Case("models", "every client", "GET", "/v1/models", None, check_models),
        Case("health", "llama.cpp clients, load balancers", "GET", "/health", None, check_health),
        Case("tokenize", "llama.cpp clients", "POST", "/tokenize", {"content": "Hello, world"}, check_tokenize),
    ]


def run_case(client: httpx.Client, base_url: str, server: str, case: Case) -> Outcome:
    url = base_url + case.path
    try:
        if case.stream:
            chunks: list[dict[str, Any]] = []
            done = False
            with client.stream(case.method, url, json=case.body) as reply:
                if reply.status_code != 200:
                    reply.read()
                    return Outcome(case.name, server, reply.status_code, False, _error(reply))
                for line in reply.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunks.append(json.loads(data))
            why = case.check(chunks, case.body) if done else "the stream ended without [DONE]"
            return Outcome(case.name, server, 200, why is None, why or f"{len(chunks)} chunks")
        reply = client.request(case.method, url, json=case.body)
        if reply.status_code != 200:
            return Outcome(case.name, server, reply.status_code, False, _error(reply))
        body = reply.json() if case.path != "/health" else {}
        why = case.check(body, case.body)
        return Outcome(case.name, server, 200, why is None, why or _glimpse(body))
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        return Outcome(case.name, server, 0, False, f"{type(exc).__name__}: {exc}"[:120])


def _error(reply: httpx.Response) -> str:
    try:
        error = reply.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except ValueError:
        message = reply.text
    return str(message)[:120]


def _glimpse(body: dict[str, Any]) -> str:
    try:
        message = _message(body)
        if message.get("tool_calls"):
            f = message["tool_calls"][0]["function"]
            return f"{f['name']}({f['arguments']})"[:60]
        return repr(message.get("content"))[:60]
    except ValueError:
        return ""


def replay(base_url: str, server: str, timeout: float = 600.0) -> list[Outcome]:
    with httpx.Client(timeout=timeout) as client:
        return [run_case(client, base_url, server, case) for case in cases()]


def table(outcomes: list[Outcome], servers: list[str]) -> str:
    by = {(o.case, o.server): o for o in outcomes}
    lines = ["| case | sent by | " + " | ".join(servers) + " |", "|---|---|" + "---|" * len(servers)]
    for case in cases():
        cells = []
        for s in servers:
            o = by.get((case.name, s))
            cells.append("-" if o is None else ("ok" if o.ok else f"**{o.status or 'no answer'}**: {o.detail}")
                         .replace("|", "/").replace("\n", " "))
        lines.append(f"| {case.name} | {case.sender} | " + " | ".join(cells) + " |")
    lines.append("| answered | | " + " | ".join(
        f"{sum(o.ok for o in outcomes if o.server == s)}/{len(cases())}" for s in servers) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_bench_options(p)
    p.add_argument("--servers", default="pyspec,llama-server",
                   help="comma-separated: pyspec, llama-server (default both)")
    p.add_argument("--url", default=None, help="replay against a server already running here instead")
    p.add_argument("--json", default=None, help="write every outcome here")
    args = p.parse_args(argv)

    if args.url:
        outcomes = replay(args.url.rstrip("/"), args.url)
        names = [args.url]
    else:
        from pyspec.models import resolve_model

        target = resolve_model(args.target)
        draft = resolve_model(args.draft) if args.draft else None
        names = args.servers.split(",")
        outcomes = []
        log_dir = Path(tempfile.mkdtemp(prefix="pyspec-compat-"))
        for name in names:
            port = free_port()
            if name == "pyspec":
                command = pyspec_command(target, draft, port, threads=args.threads, n_ctx=args.n_ctx)
            elif name == "llama-server":
                command = llama_server_command(find_llama_server(), target, port, threads=args.threads,
                                               n_ctx=args.n_ctx)
            else:
                raise SystemExit(f"unknown server {name!r}: pyspec or llama-server")
            with ChildServer(name, command, port, log_dir) as server:
                outcomes += replay(server.base_url, name)
            print(f"{name}: {sum(o.ok for o in outcomes if o.server == name)}/{len(cases())} answered "
                  f"(log {server.log_path})", flush=True)
    print(table(outcomes, names))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "outcomes": [asdict(o) for o in outcomes]},
                                              indent=1) + "\n")
    return 0 if all(o.ok for o in outcomes if o.server == names[0]) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Tool calls for /v1/chat/completions: OpenAI's `tools` and `tool_choice` given to the chat
template, calls parsed back out of the output, and a grammar that makes the model call when the
request requires it.

The call format is the one Qwen2.5 and Hermes-style templates teach their models:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A template that does not render `tools` gets them described in a system message that asks for
this format. tool_choice "auto" generates freely and parses; "required" or a named function
constrains the output with a grammar (GenerationConfig.grammar) to one or more well-formed calls
whose arguments follow the function's JSON schema; "none" leaves the tools out.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ..grammar import json_schema_grammar
from .protocol import OpenAIError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS = 8  # calls in one reply when a call is required and parallel calls are allowed
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str

    def wire(self, index: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "type": "function",
                                "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            body["index"] = index
        return body


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools and tool_choice ask for. choice: "auto", "required" or the name of
    the one function to call."""

    tools: tuple[dict[str, Any], ...]  # {"type": "function", "function": {name, description, parameters}}
    choice: str
    parallel: bool = True  # a required call may be several (at most MAX_CALLS)

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def grammar(self) -> str | None:
        """The GBNF grammar of the output when a call is required: one call (up to MAX_CALLS with
        parallel calls), each a JSON object {"name": ..., "arguments": ...} whose arguments follow
        that function's schema."""
        if self.choice == "auto":
            return None
        chosen = [t["function"] for t in self.tools if self.choice == "required" or t["function"]["name"] == self.choice]
        options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                    "properties": {"name": {"const": f["name"]},
                                   "arguments": f.get("parameters") or {"type": "object"}}} for f in chosen]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        call = json_schema_grammar(schema)
        # The converter's start rule becomes `call`; `root` is the tagged list of calls.
        call = re.sub(r"^root ::=", "call ::=", call, flags=re.M)
        call = re.sub(r"(?<![\w-])root(?![\w-])", "call", call)
        more = f' ("\\n" tool-call){{0,{MAX_CALLS - 1}}}' if self.parallel else ""
        return f'root ::= tool-call{more}\ntool-call ::= "{OPEN}\\n" call "\\n{CLOSE}"\n{call}'

    def system_text(self) -> str:
        """The tools described for a template that does not render them itself."""
        lines = ["# Tools", "", "You may call one or more functions to assist with the user query.",
                 "You are provided with function signatures within <tools></tools> XML tags:", "<tools>"]
        lines += [json.dumps(t, ensure_ascii=False) for t in self.tools]
        lines += ["</tools>", "", "For each function call, return a json object with function name and arguments "
                  f"within {OPEN}{CLOSE} XML tags:", OPEN, '{"name": <function-name>, "arguments": <args-json-object>}',
                  CLOSE]
        return "\n".join(lines)


def plan(tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool | None = None) -> ToolPlan | None:
    """The request's tool plan (None: no tools, or tool_choice "none"). Raises OpenAIError (400)
    naming what is malformed."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise OpenAIError(400, "tool_choice needs tools", param="tool_choice")
        return None
    checked = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise OpenAIError(400, f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}",
                              param=f"tools.{i}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise OpenAIError(400, f"tools[{i}].function.name must be a non-empty string", param=f"tools.{i}")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise OpenAIError(400, f"tools[{i}].function.parameters must be a JSON schema object",
                              param=f"tools.{i}")
        checked.append({"type": "function", "function": fn})
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise OpenAIError(400, "tools have duplicate function names", param="tools")
    if tool_choice is None or tool_choice == "auto":
        choice = "auto"
    elif tool_choice == "none":
        return None
    elif tool_choice == "required":
        choice = "required"
    elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        choice = tool_choice["function"].get("name")
        if choice not in names:
            raise OpenAIError(400, f"tool_choice names function {choice!r}, which is not among the tools",
                              param="tool_choice")
    else:
        raise OpenAIError(400, "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                               "\"function\": {\"name\": ...}}", param="tool_choice")
    return ToolPlan(tuple(checked), choice, parallel is not False)


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as tool-aware templates read them: an assistant's tool_calls with their arguments
    as objects (OpenAI sends JSON text; templates write them with tojson)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and isinstance(calls, list):
            fixed = []
            for call in calls:
                fn = dict(call.get("function") or {}) if isinstance(call, dict) else {}
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass  # kept as text
                fixed.append({**call, "function": fn} if isinstance(call, dict) else call)
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


def plain_messages(messages: list[dict[str, Any]], tools: ToolPlan | None) -> list[dict[str, Any]]:
    """Messages for a template that knows nothing of tools: the tools described in the system
    message, earlier calls and tool results written out as text in the call format."""
    out = []
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = [f"{OPEN}\n{json.dumps(_call_object(c), ensure_ascii=False)}\n{CLOSE}" for c in m["tool_calls"]]
            content = "\n".join(([content] if content else []) + calls)
        elif role == "tool":
            role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    if tools is not None:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + tools.system_text()}
        else:
            out.insert(0, {"role": "system", "content": tools.system_text()})
    return out


def _call_object(call: Any) -> dict[str, Any]:
    fn = call.get("function", {}) if isinstance(call, dict) else {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    return {"name": fn.get("name", ""), "arguments": args}


def parse_calls(text: str, tools: ToolPlan) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of an output: the text before the first call as content (None when
    empty), every complete call to a known function; without tags, an output that is only call
    objects. An output with a malformed or unknown call is all content, no calls."""
    start = text.find(OPEN)
    if start < 0:
        bare = _bare_calls(text, tools)
        return (None, bare) if bare else (text, [])
    calls = []
    for match in _CALL.finditer(text, start):
        obj = _loads_call(match.group(1))
        if obj is None:
            return text, []
        if not isinstance(obj, dict) or obj.get("name") not in tools.names:
            return text, []
        args = obj.get("arguments", {})
        calls.append(ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                              "call_" + uuid.uuid4().hex[:24]))
    if not calls:
        return text, []
    content = text[:start].strip()
    return content or None, calls


def _loads_call(body: str) -> Any:
    """The JSON of a call; also `{{...}}`, which Qwen2.5's template shows its model as the format
    (its `{{` inside a Jinja string stays doubled) and the model then writes. None: not JSON."""
    for text in (body, body[1:-1] if body.startswith("{{") and body.endswith("}}") else None):
        if text is None:
            continue
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    return None


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def _bare_calls(text: str, tools: ToolPlan) -> list[ToolCall]:
    """Calls written without the tags: an output that is only a call object (or a list of them),
    maybe in a ```json fence, as coder models often write it. Anything else: no calls."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    if not body.startswith(("{", "[")):
        return []
    obj = _loads_call(body)
    if obj is None:
        return []
    objs = obj if isinstance(obj, list) else [obj]
    calls = []
    for o in objs:
        if not isinstance(o, dict) or o.get("name") not in tools.names or set(o) - {"name", "arguments"}:
            return []
        args = o.get("arguments", {})
        calls.append(ToolCall(o["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                              "call_" + uuid.uuid4().hex[:24]))
    return calls


class ContentFilter:
    """Streams the content of an output that may end in tool calls: text is passed on until the
    call marker starts (a piece that may be its beginning is held back until it is not); an
    output that opens like a bare call object is held whole."""

    def __init__(self) -> None:
        self._held = ""
        self.in_call = False
        self._opening = ""  # the output until its first non-space character
        self.maybe_bare = False  # it opens like a bare call ({, [ or ```): all held to the end

    def feed(self, piece: str) -> str:
        if self.in_call or self.maybe_bare:
            return ""
        if self._opening.strip() == "":
            self._opening += piece
            head = self._opening.lstrip()
            if head == "":
                return ""
            if head.startswith(("{", "[", "`")):
                self.maybe_bare = True
                return ""
            piece, self._opening = self._opening, "x"
        text = self._held + piece
        at = text.find(OPEN)
        if at >= 0:
            self.in_call = True
            self._held = ""
            return text[:at]
        keep = next((k for k in range(min(len(OPEN) - 1, len(text)), 0, -1) if OPEN.startswith(text[-k:])), 0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """What was held back, once the output ended without a call."""
        held, self._held = self._held, ""
        return "" if self.in_call or self.maybe_bare else held

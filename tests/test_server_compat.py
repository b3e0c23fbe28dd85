"""benchmarks/server_compat.py's client request shapes against a real `pyspec serve` (a tiny
model with fill-in-the-middle tokens, drafting for itself): every request answered with its
documented shape, JSON that validates and tool calls of a named tool included."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from server_process import ServerProcess

from pyspec._models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parent.parent


def _load_script():
    spec = importlib.util.spec_from_file_location("server_compat", REPO / "benchmarks" / "server_compat.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["server_compat"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compat():
    return _load_script()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("compat")
    target = build_tiny_model(work / "fim.gguf", fim=True)  # fill-in-the-middle tokens, for `suffix`
    proc = ServerProcess("--target", str(target), "--draft", str(target), "--n-ctx", "1024", "--threads", "1",
                         "--method", "auto", log_path=work / "server.log")
    yield proc
    assert proc.stop() == 0, proc.log()


def test_every_client_shape_is_answered(compat, server: ServerProcess) -> None:
    outcomes = compat.replay(server.base_url, "pyspec", timeout=120)
    assert [o.case for o in outcomes] == [c.name for c in compat.cases()]
    assert all(o.status == 200 and o.ok for o in outcomes), compat.table(outcomes, ["pyspec"])


def test_the_checks_reject_what_a_client_could_not_use(compat) -> None:
    """Each check fails on a reply a client would trip over, so a pass above means something."""
    body = {"tools": [compat.WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "top_logprobs": 2}
    ok_chat = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}
    assert compat.check_chat(ok_chat, body) is None
    assert compat.check_chat({"choices": [{"message": {}, "finish_reason": "stop"}]}, body)
    assert compat.check_chat({"choices": [{"message": {"content": "x"}, "finish_reason": "eos"}]}, body)
    assert compat.check_logprobs(ok_chat, body)  # no logprobs.content
    assert compat.check_json_object({"choices": [{"message": {"content": "[1]"}, "finish_reason": "stop"}]}, body)
    assert compat.check_json_object({"choices": [{"message": {"content": "{\"a\""}, "finish_reason": "stop"}]}, body)
    assert compat.check_json_schema(
        {"choices": [{"message": {"content": "{\"name\": \"A\", \"age\": \"3\"}"}, "finish_reason": "stop"}]}, body)
    assert compat.check_json_schema(
        {"choices": [{"message": {"content": "{\"name\": \"A\", \"age\": 3}"}, "finish_reason": "stop"}]}, body) is None
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"P\"}"}}
    good_call = {"choices": [{"message": {"content": None, "tool_calls": [call]}, "finish_reason": "tool_calls"}]}
    assert compat.check_named_tool(good_call, body) is None
    for bad in ({**call, "function": {"name": "rm", "arguments": "{}"}}, {**call, "id": ""},
                {**call, "function": {"name": "get_weather", "arguments": "{city"}}):
        assert compat.check_tool_call({"choices": [{"message": {"tool_calls": [bad]}, "finish_reason": "tool_calls"}]},
                                      body)
    assert compat.check_tool_call(ok_chat, body).startswith("no tool_calls")
    stream_body = {"messages": [], "stream_options": {"include_usage": True}}
    chunks = [{"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}]
    assert compat.check_stream(chunks, stream_body) == "no usage chunk although stream_options.include_usage"
    assert compat.check_stream(chunks + [{"choices": [], "usage": {"total_tokens": 3}}], stream_body) is None
    assert compat.check_stream([], stream_body) == "no chunks"

"""`pyspec serve` as clients expect the OpenAI protocol: extra fields and any model name accepted
(refused with --strict), what the target's sampling cannot apply refused by name, llama-server's
/tokenize and /detokenize, fill-in-the-middle, chat templates (the GGUF's Jinja template, a file,
a llama.cpp built-in name, chat_template_kwargs). Real server processes on the tiny models."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from server_process import ServerProcess

import pyspec
from pyspec._models.tiny import build_tiny_model

GREEDY = {"temperature": 0.0}
MESSAGES = [{"role": "system", "content": "You write Python."},
            {"role": "user", "content": "Write a function that adds two numbers."}]


@pytest.fixture(scope="module")
def server(tiny_target: str, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("protocol") / "server.log"
    proc = ServerProcess("--target", tiny_target, "--model-name", "tiny", "--model-alias", "gpt-4o-mini",
                         "--model-alias", "coder", "--n-ctx", "1024", "--threads", "1", "--method", "none",
                         log_path=log)
    yield proc
    assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tiny_target: str):
    with pyspec.Engine(tiny_target, n_ctx=1024, n_threads=1) as engine:
        yield engine


def test_models_lists_the_aliases_and_any_name_is_served(server: ServerProcess, client: openai.OpenAI,
                                                         reference: pyspec.Engine) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny", "gpt-4o-mini", "coder"]
    expected = reference.generate(MESSAGES, max_tokens=8, method="none").text
    for name in ("tiny", "gpt-4o-mini", "gpt-4", "llama3.1:8b"):
        r = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=8, **GREEDY)
        assert r.choices[0].message.content == expected, name
    assert client.models.retrieve("whatever-a-client-asks").id == "whatever-a-client-asks"


def test_unknown_fields_are_ignored_and_logged_once_per_name(server: ServerProcess) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "reasoning_effort": "low",
            "n_probs": 0, "user": "u-1", "parallel_tool_calls": False, "cache_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False}, "tool_choice": "none"}
    for _ in range(2):
        r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    log = server.log()
    lines = [line for line in log.splitlines() if "ignoring request field(s)" in line]
    assert any("n_probs" in line and "reasoning_effort" in line for line in lines), log
    assert sum("n_probs" in line for line in lines) == 1  # once per name, not per request


def test_penalties_and_logit_bias_are_applied(client: openai.OpenAI, reference: pyspec.Engine) -> None:
    """OpenAI's presence/frequency penalties and logit_bias, and the repetition_penalty clients
    send as an extra field, reach the target's sampling: the server's greedy output is the
    reference engine's penalised plain decoding, and differs from the unpenalised one."""
    plain = reference.generate(MESSAGES, max_tokens=32, method="none")
    banned = plain.tokens[0]
    # negative penalties: the greedy output repeats no token, so only a reward for repeats shows
    cases = [({"presence_penalty": -2.0, "frequency_penalty": -1.0}, dict(presence_penalty=-2.0, frequency_penalty=-1.0)),
             ({"logit_bias": {str(banned): -100}}, dict(logit_bias={banned: -100.0})),
             ({"extra_body": {"repetition_penalty": 1.8}}, dict(repetition_penalty=1.8))]
    for fields, options in cases:
        expected = reference.generate(MESSAGES, max_tokens=32, method="none", **options)
        assert expected.tokens != plain.tokens, options  # the setting changes this output
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=32, **GREEDY, **fields)
        assert r.choices[0].message.content == expected.text, fields
    for bad, param in (({"presence_penalty": 2.5}, None), ({"logit_bias": {"x": 1}}, "logit_bias"),
                       ({"logit_bias": {"7": 150}}, None)):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **bad)
        assert param is None or e.value.body["param"] == param


def test_tokenize_and_detokenize(server: ServerProcess, reference: pyspec.Engine) -> None:
    text = "def add(a, b):\n    return a + b<|im_end|>"
    r = httpx.post(server.base_url + "/tokenize", json={"content": text}).json()
    assert r["tokens"] == reference.tokenize(text, add_special=False)
    plain = httpx.post(server.base_url + "/tokenize", json={"content": text, "parse_special": False}).json()
    assert len(plain["tokens"]) > len(r["tokens"])  # the marker text spelled out, not one control token
    pieces = httpx.post(server.base_url + "/tokenize", json={"content": "héllo", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == reference.tokenize("héllo", add_special=False)
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert joined == "héllo".encode()
    back = httpx.post(server.base_url + "/detokenize", json={"tokens": reference.tokenize("def add(a, b):")}).json()
    assert back == {"content": "def add(a, b):"}
    bad = httpx.post(server.base_url + "/detokenize", json={"tokens": [1, reference.n_vocab]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_embeddings_are_a_clear_501(server: ServerProcess, client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        client.embeddings.create(model="tiny", input="hello")
    assert e.value.status_code == 501 and "embeddings are not served" in e.value.message


def test_suffix_without_fim_tokens_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="def f(x):\n", suffix="\n    return y\n", max_tokens=4)
    assert e.value.body["param"] == "suffix" and "fill-in-the-middle" in e.value.body["message"]


def test_the_models_jinja_template_formats_chats_as_llama_cpp_does(server: ServerProcess,
                                                                   reference: pyspec.Engine) -> None:
    r = httpx.post(server.base_url + "/apply-template", json={"messages": MESSAGES}).json()
    assert r["formatted_by"] == "jinja"
    assert r["prompt"] == reference.apply_chat_template(MESSAGES)  # the tiny model's template is chatml


# -- strict mode, a template file and kwargs -----------------------------------------------------

KWARGS_TEMPLATE = (
    "{% if persona %}[{{ persona }}]\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def strict_server(tiny_target: str, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("strict")
    template = work / "persona.jinja"
    template.write_text(KWARGS_TEMPLATE, encoding="utf-8")
    proc = ServerProcess("--target", tiny_target, "--model-name", "tiny", "--model-alias", "gpt-4o-mini", "--strict",
                         "--chat-template", str(template), "--n-ctx", "1024", "--threads", "1", "--method", "none",
                         log_path=work / "server.log")
    yield proc
    assert proc.stop() == 0, proc.log()


def test_strict_refuses_unknown_fields_and_names(strict_server: ServerProcess) -> None:
    c = openai.OpenAI(base_url=strict_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4", messages=MESSAGES, max_tokens=4)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, extra_body={"bogus_option": 1})
    assert e.value.body["param"] == "bogus_option"
    assert c.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=4).choices[0].message


def test_a_template_file_with_chat_template_kwargs(strict_server: ServerProcess, reference: pyspec.Engine) -> None:
    c = openai.OpenAI(base_url=strict_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    url = strict_server.base_url + "/apply-template"
    plain = httpx.post(url, json={"messages": MESSAGES}).json()
    assert plain == {"prompt": reference.apply_chat_template(MESSAGES), "formatted_by": "jinja"}
    kw = {"persona": "pirate"}
    dressed = httpx.post(url, json={"messages": MESSAGES, "chat_template_kwargs": kw}).json()["prompt"]
    assert dressed == "[pirate]\n" + plain["prompt"]
    r = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12,
                                  extra_body={"chat_template_kwargs": kw}, **GREEDY)
    expected = reference.generate(reference.tokenize(dressed), max_tokens=12, method="none")
    assert r.usage.prompt_tokens == len(expected.prompt_tokens)
    assert r.choices[0].message.content == expected.text


def test_a_builtin_template_name_and_a_failing_template_fall_back(tiny_target: str, tmp_path: Path,
                                                                  reference: pyspec.Engine) -> None:
    proc = ServerProcess("--target", tiny_target, "--chat-template", "llama3", "--n-ctx", "512", "--threads", "1",
                         log_path=tmp_path / "llama3.log")
    try:
        r = httpx.post(proc.base_url + "/apply-template", json={"messages": MESSAGES}).json()
    finally:
        assert proc.stop() == 0, proc.log()
    assert r["formatted_by"] == "llama.cpp"
    assert r["prompt"] == reference.apply_chat_template(MESSAGES, template="llama3")
    assert "<|start_header_id|>user<|end_header_id|>" in r["prompt"]

    refusing = tmp_path / "refusing.jinja"
    refusing.write_text("{{ raise_exception('roles must alternate') }}", encoding="utf-8")
    proc = ServerProcess("--target", tiny_target, "--chat-template", str(refusing), "--n-ctx", "512", "--threads",
                         "1", log_path=tmp_path / "refusing.log")
    try:
        r = httpx.post(proc.base_url + "/apply-template", json={"messages": MESSAGES}).json()
        assert r == {"prompt": reference.apply_chat_template(MESSAGES), "formatted_by": "llama.cpp"}
    finally:
        assert proc.stop() == 0, proc.log()
    assert "roles must alternate" in proc.log()
    with pytest.raises(RuntimeError, match="neither a file nor one of llama.cpp's built-in templates"):
        ServerProcess("--target", tiny_target, "--chat-template", "no-such-template", "--threads", "1",
                      log_path=tmp_path / "bad.log", timeout=60)


def test_a_template_cannot_reach_python_internals(tiny_target: str, tmp_path: Path) -> None:
    """The sandbox: attribute access to Python internals fails the render (then the fallback formats)."""
    escape = tmp_path / "escape.jinja"
    escape.write_text("{{ messages.__class__.__mro__[1].__subclasses__() }}", encoding="utf-8")
    proc = ServerProcess("--target", tiny_target, "--chat-template", str(escape), "--n-ctx", "512", "--threads", "1",
                         log_path=tmp_path / "escape.log")
    try:
        r = httpx.post(proc.base_url + "/apply-template", json={"messages": MESSAGES}).json()
    finally:
        assert proc.stop() == 0, proc.log()
    assert r["formatted_by"] == "llama.cpp" and "subclasses" not in r["prompt"]
    assert "SecurityError" in proc.log() or "unsafe" in proc.log()


# -- fill-in-the-middle --------------------------------------------------------------------------


def test_fill_in_the_middle_on_a_model_with_fim_tokens(tmp_path: Path) -> None:
    target = build_tiny_model(tmp_path / "fim.gguf", fim=True)
    proc = ServerProcess("--target", str(target), "--model-name", "fim", "--n-ctx", "512", "--threads", "1",
                         "--method", "none", log_path=tmp_path / "fim.log")
    try:
        c = openai.OpenAI(base_url=proc.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        prefix, suffix = "def area(r):\n    <|fim_suffix|>", "\n    return a\n"
        r = c.completions.create(model="fim", prompt=prefix, suffix=suffix, max_tokens=10, **GREEDY)
    finally:
        assert proc.stop() == 0, proc.log()
    with pyspec.Engine(str(target), n_ctx=512, n_threads=1) as engine:
        special = engine.special_tokens
        text = [engine.tokenize(t, add_special=False, parse_special=False) for t in (prefix, suffix)]
        tokens = [special["fim_prefix"], *text[0], special["fim_suffix"], *text[1], special["fim_middle"]]
        expected = engine.generate(tokens, max_tokens=10, method="none")
    assert text[0].count(special["fim_suffix"]) == 0  # marker text in the prefix stays text
    assert r.usage.prompt_tokens == len(tokens)
    assert r.choices[0].text == expected.text


@pytest.mark.model
def test_qwen_coder_fim_and_its_jinja_template(tmp_path: Path) -> None:
    """The real coder model: its own FIM markers and its GGUF template (which adds its default
    system prompt when the conversation has none, as the template says)."""
    proc = ServerProcess("--target", "qwen2.5-coder-0.5b-instruct", "--model-name", "coder", "--n-ctx", "512",
                         "--threads", "2", "--method", "none", log_path=tmp_path / "qwen.log", timeout=300)
    prefix, suffix = "def area(radius):\n    ", "\n    return result\n"
    try:
        c = openai.OpenAI(base_url=proc.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = c.completions.create(model="coder", prompt=prefix, suffix=suffix, max_tokens=12, **GREEDY)
        shown = httpx.post(proc.base_url + "/apply-template", json={"messages": [{"role": "user", "content": "hi"}]},
                           timeout=60).json()
    finally:
        assert proc.stop() == 0, proc.log()
    assert shown["formatted_by"] == "jinja" and shown["prompt"].startswith("<|im_start|>system\nYou are Qwen")
    with pyspec.Engine("qwen2.5-coder-0.5b-instruct", n_ctx=512, n_threads=2) as engine:
        ids = [engine.tokenize(t, add_special=False, parse_special=False) for t in (prefix, suffix)]
        pre, suf, mid = (engine.tokenize(t, add_special=False) for t in ("<|fim_prefix|>", "<|fim_suffix|>",
                                                                          "<|fim_middle|>"))
        expected = engine.generate(pre + ids[0] + suf + ids[1] + mid, max_tokens=12, method="none")
    assert len(pre) == len(suf) == len(mid) == 1
    assert r.choices[0].text == expected.text


JSON_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "count"],
               "properties": {"name": {"type": "string", "maxLength": 10}, "count": {"type": "integer", "maximum": 99}}}


def test_response_format_json_schema_and_json_object(client: openai.OpenAI, reference: pyspec.Engine) -> None:
    import json

    expected = reference.generate(MESSAGES, max_tokens=80, method="none", json_schema=JSON_SCHEMA)
    assert expected.finish_reason == "stop", expected.text
    for extra in ({}, {"method": "lookup"}):
        r = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=80, **GREEDY, extra_body=extra,
            response_format={"type": "json_schema", "json_schema": {"name": "item", "schema": JSON_SCHEMA, "strict": True}})
        assert r.choices[0].message.content == expected.text and r.choices[0].finish_reason == "stop"
    doc = json.loads(expected.text)
    assert set(doc) == {"name", "count"} and isinstance(doc["count"], int) and len(doc["name"]) <= 10, doc
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, **GREEDY,
                                       response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{") and (r.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict)), text
    r = client.completions.create(model="tiny", prompt="A record:", max_tokens=80, **GREEDY,
                                  extra_body={"response_format": {"type": "json_object", "schema": JSON_SCHEMA}})
    assert set(json.loads(r.choices[0].text)) == {"name", "count"}


def test_grammar_field_and_bad_constraints(client: openai.OpenAI, reference: pyspec.Engine) -> None:
    grammar = 'root ::= "yes" | "no"'
    expected = reference.generate(MESSAGES, max_tokens=8, method="none", grammar=grammar).text
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, **GREEDY,
                                       extra_body={"grammar": grammar})
    assert r.choices[0].message.content == expected and expected in ("yes", "no")
    bad = [({"response_format": {"type": "xml"}}, "response_format"),
           ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema"),
           ({"grammar": "root ::= ("}, "grammar could not be parsed"),
           ({"grammar": grammar, "response_format": {"type": "json_object"}}, "not both")]
    for body, words in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, extra_body=body)
        assert words in str(e.value.body), (body, e.value.body)


WEATHER_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "to_fahrenheit", "description": "Converts degrees Celsius to Fahrenheit.",
        "parameters": {"type": "object", "properties": {"celsius": {"type": "number"}},
                       "required": ["celsius"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice_returns_well_formed_calls(client: openai.OpenAI, stream: bool) -> None:
    """A template without tools (the tiny model's chatml) gets them as a system message; a named
    tool_choice constrains the output to calls of that function with schema-valid arguments."""
    import json

    choice = {"type": "function", "function": {"name": "get_weather"}}
    request = dict(model="tiny", messages=MESSAGES, max_tokens=200, tools=WEATHER_TOOLS, tool_choice=choice,
                   parallel_tool_calls=False, **GREEDY)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **request))
        calls = [c for ch in chunks for c in (ch.choices[0].delta.tool_calls or []) if ch.choices]
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        assert content == "" and finish == ["tool_calls"], (content, finish)
        functions = [c.function for c in calls]
    else:
        r = client.chat.completions.create(**request)
        assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
        functions = [c.function for c in r.choices[0].message.tool_calls]
        assert all(c.id.startswith("call_") and c.type == "function" for c in r.choices[0].message.tool_calls)
    assert len(functions) == 1 and functions[0].name == "get_weather"
    for f in functions:
        args = json.loads(f.arguments)
        assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 20, args


def test_bad_tools_are_refused_by_name(client: openai.OpenAI) -> None:
    bad = [({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0"),
           ({"tools": WEATHER_TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
           ({"tools": WEATHER_TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
           ({"tools": WEATHER_TOOLS + WEATHER_TOOLS[:1]}, "tools"),
           ({"tools": WEATHER_TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice")]
    for body, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, extra_body=body)
        assert e.value.body["param"] == param, (body, e.value.body)


def test_tool_turns_reach_a_template_without_tools_as_text(server: ServerProcess) -> None:
    """An agent's second request (its call and the tool's result) renders on a template that
    knows nothing of tools: the call and the result are written out in the call format."""
    from pyspec.server.templates import ChatTemplate  # noqa: F401  (the module the server uses)

    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"}]
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": history, "max_tokens": 4, "tools": WEATHER_TOOLS, **GREEDY})
    assert r.status_code == 200, r.text
    prompt = httpx.post(server.base_url + "/apply-template", json={"messages": history}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in prompt
    assert "<tool_response>\n4 degrees, rain\n</tool_response>" in prompt

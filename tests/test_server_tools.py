"""Tool calls without a server: the calls parsed out of an output, the content streamed before
them, the grammar of a required call, and a tool-aware Jinja template given the tools."""

from __future__ import annotations

import json

import pytest

from pyspec.server.protocol import OpenAIError
from pyspec.server.tools import ContentFilter, ToolPlan, parse_calls, plan

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
         {"type": "function", "function": {"name": "now"}}]


def test_calls_are_parsed_after_the_content() -> None:
    tools = plan(TOOLS, "auto")
    text = 'Let me add them.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n' \
           '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    content, calls = parse_calls(text, tools)
    assert content == "Let me add them."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2}), ("now", {})]
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize("text", ["no call here", '<tool_call>{"name": "add", "arguments": {"a": 1',
                                  '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
                                  '<tool_call>not json</tool_call>'])
def test_outputs_without_a_complete_known_call_are_content(text: str) -> None:
    assert parse_calls(text, plan(TOOLS, "auto")) == (text, [])


def test_the_content_filter_holds_back_what_may_start_a_call() -> None:
    f = ContentFilter()
    out = [f.feed(p) for p in ["Sure", ", <", "tool", "_call>", '{"name"']]
    assert out == ["Sure", ", ", "", "", ""] and f.in_call
    g = ContentFilter()
    assert [g.feed(p) for p in ["a <to", "y> b"]] == ["a ", "<toy> b"] and g.flush() == ""
    h = ContentFilter()
    assert h.feed("x <tool") == "x " and h.flush() == "<tool"


def test_plans_and_their_errors() -> None:
    assert plan(None, None) is None and plan(TOOLS, "none") is None
    assert plan(TOOLS, None).choice == "auto" and plan(TOOLS, "required").choice == "required"
    assert plan(TOOLS, {"type": "function", "function": {"name": "now"}}).choice == "now"
    for tools, choice in [(TOOLS, "always"), (TOOLS, {"type": "function", "function": {"name": "sub"}}),
                          ([{"type": "function", "function": {"name": ""}}], None), (None, "required")]:
        with pytest.raises(OpenAIError):
            plan(tools, choice)


def test_the_required_grammar_names_each_function_and_its_arguments() -> None:
    grammar = plan(TOOLS, "required").grammar()
    assert grammar.startswith('root ::= tool-call ("\\n" tool-call){0,7}\n')
    assert plan(TOOLS, "required", parallel=False).grammar().startswith("root ::= tool-call\n")
    assert '"\\"add\\""' in grammar and '"\\"now\\""' in grammar
    assert plan(TOOLS, "auto").grammar() is None
    only = plan(TOOLS, {"type": "function", "function": {"name": "now"}}).grammar()
    assert '"\\"now\\""' in only and '"\\"add\\""' not in only
    assert isinstance(ToolPlan(tuple(TOOLS), "auto").names, list)


def test_a_tool_aware_template_gets_the_tools_and_object_arguments(tiny_target: str, tmp_path) -> None:
    import pyspec
    from pyspec.server.templates import ChatTemplate

    path = tmp_path / "tools.jinja"
    path.write_text("{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
                    "{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}"
                    "{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}")
    messages = [{"role": "user", "content": "1+2?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                {"role": "tool", "content": "3"}]
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=1) as engine:
        text = ChatTemplate(engine, str(path)).render(messages, tools=plan(TOOLS, "auto")).text
    assert text == '[add][now]<user>1+2?<assistant>{"a": 1, "b": 2}<tool>3'


def test_bare_call_objects_are_calls_and_held_back_when_streamed() -> None:
    tools = plan(TOOLS, "auto")
    fenced = '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```'
    content, calls = parse_calls(fenced, tools)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert parse_calls('{"name": "add", "arguments": {}, "extra": 1}', tools)[1] == []
    assert parse_calls('{"value": 3}', tools)[1] == []
    doubled = parse_calls('{{"name": "now", "arguments": {}}}', tools)[1]
    assert [c.name for c in doubled] == ["now"]
    f = ContentFilter()
    assert [f.feed(p) for p in ["\n", "```", "json"]] == ["", "", ""] and f.maybe_bare and f.flush() == ""
    g = ContentFilter()
    assert [g.feed(p) for p in [" ", "Hi", " there"]] == ["", " Hi", " there"]

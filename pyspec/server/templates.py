"""Chat messages to prompt text. The model's own Jinja template (the GGUF's
`tokenizer.chat_template`), or one given with --chat-template (a Jinja file, or the name of one
of llama.cpp's built-in templates), is rendered in Jinja2's immutable sandbox: a template is data
from a downloaded file and must not reach Python objects beyond what it is given. Where the
Jinja template cannot be compiled or rendered, llama.cpp's built-in formatter (which recognises
the common template families by their text) formats the conversation instead."""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _core
from ..engine import Engine
from ..errors import InvalidArgumentError
from .tools import ToolPlan, plain_messages, template_messages

log = logging.getLogger("pyspec.server")

# Variables the server sets itself; chat_template_kwargs cannot replace them.
_RESERVED = ("messages", "add_generation_prompt", "bos_token", "eos_token")


class TemplateError(InvalidArgumentError):
    """The conversation cannot be formatted (the client's messages, or a template that fails)."""


def builtin_template_names() -> list[str]:
    return list(_core.chat_builtin_templates())


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    source: str  # "jinja" or "llama.cpp": what formatted it


class ChatTemplate:
    """How the server formats chat requests. `override`: None (the model's template), a path to a
    Jinja template file, or a llama.cpp built-in template name. Raises ValueError at start for an
    override that is neither, or a template file that does not compile."""

    def __init__(self, engine: Engine, override: str | None = None) -> None:
        self.engine = engine
        self.builtin_name: str | None = None  # the llama.cpp template used for the fallback (None: the model's)
        self._jinja: Any = None
        self.renders_tools = False  # the Jinja template reads `tools` (else tools go in a system message)
        self.description = ""
        text: str | None
        if override is not None:
            path = Path(override)
            if path.is_file():
                text = path.read_text(encoding="utf-8")
                self._jinja = _compile(text)  # a broken file is the operator's error: fail the start
                self.renders_tools = "tools" in text
                self.description = f"Jinja template from {path}"
            elif override in builtin_template_names():
                self.builtin_name = override
                self.description = f"llama.cpp's built-in template {override!r}"
            else:
                raise ValueError(f"--chat-template {override!r} is neither a file nor one of llama.cpp's built-in "
                                 f"templates ({', '.join(builtin_template_names())})")
        else:
            text = engine.chat_template
            if text is None:
                self.description = "none in the model (chat requests fail unless --chat-template is given)"
            else:
                try:
                    self._jinja = _compile(text)
                    self.renders_tools = "tools" in text
                    self.description = "the model's Jinja template (tokenizer.chat_template)"
                except Exception as exc:  # noqa: BLE001 - any compile failure means: use the fallback
                    log.warning("the model's chat template does not compile with Jinja2 (%s); llama.cpp's built-in "
                                "formatter is used instead", exc)
                    self.description = "llama.cpp's built-in formatter (the model's template does not compile)"
        special = engine.special_tokens
        self.add_bos = bool(special["add_bos"])
        self.bos_token = self._token_text(special["bos"])
        self.eos_token = self._token_text(special["eos"])
        self._warned_fallback = False

    def _token_text(self, token: int) -> str:
        return self.engine.detokenize([token], special=True) if token >= 0 else ""

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               kwargs: dict[str, Any] | None = None, tools: ToolPlan | None = None) -> RenderedPrompt:
        """The prompt text for `messages` (dicts with role, content as text, and any other fields
        the client sent: name, tool_calls, ...) and the request's tools (a template that does not
        render tools gets them, and earlier calls and results, as text). Raises TemplateError when
        neither the Jinja template nor llama.cpp's formatter can format them."""
        jinja_error: Exception | None = None
        if self._jinja is not None:
            context = dict(kwargs or {})
            for name in _RESERVED:
                context.pop(name, None)
            if self.renders_tools:
                jinja_messages = template_messages(messages)
                if tools is not None:
                    context["tools"] = list(tools.tools)
            else:
                jinja_messages = plain_messages(messages, tools) if tools or _has_tool_turns(messages) else messages
            context.setdefault("tools", None)
            try:
                text = self._jinja.render(messages=jinja_messages, add_generation_prompt=add_generation_prompt,
                                          bos_token=self.bos_token, eos_token=self.eos_token, **context)
                return RenderedPrompt(text, "jinja")
            except Exception as exc:  # noqa: BLE001 - the template's own errors included (raise_exception)
                jinja_error = exc
                if not self._warned_fallback:
                    self._warned_fallback = True
                    log.warning("the chat template failed to render (%s: %s); llama.cpp's built-in formatter is "
                                "used for such requests", type(exc).__name__, exc)
        try:
            pairs = plain_messages(messages, tools)
            text = self.engine.apply_chat_template(pairs, add_generation_prompt=add_generation_prompt,
                                                   template=self.builtin_name)
        except InvalidArgumentError as exc:
            if jinja_error is not None:
                raise TemplateError(f"the chat template failed ({type(jinja_error).__name__}: {jinja_error}) and "
                                    f"llama.cpp's formatter too ({exc})") from exc
            raise TemplateError(str(exc)) from exc
        return RenderedPrompt(text, "llama.cpp")

    def tokens(self, text: str) -> list[int]:
        """Token ids of a rendered prompt: a template that writes the bos token itself does not get
        a second one from the tokenizer."""
        add_special = not (self.add_bos and self.bos_token and text.startswith(self.bos_token))
        return self.engine.tokenize(text, add_special=add_special)


def _has_tool_turns(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def _compile(text: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(text)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False,
            separators: Any = None) -> str:
    # Templates write JSON into the prompt: plain json.dumps, not Jinja's HTML-safe variant.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=separators)


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)

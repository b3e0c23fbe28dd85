"""The OpenAI wire format: request models that mirror the API's schema, the error object, and
the response and stream-chunk bodies built from pyspec results. Nothing here touches the engine."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from ..config import GenerationConfig
from ..engine import message_text  # a pure function: content parts to text
from ..errors import InvalidArgumentError
from ..grammar import ANY_JSON_OBJECT
from ..results import GenerationResult, TokenLogprobs

# Per-request settings accepted as extra body fields (the openai client's `extra_body`):
# GenerationConfig fields that have no OpenAI counterpart (the speculative settings, and a GBNF
# grammar or JSON schema the output must follow).
SPECULATIVE_FIELDS = (
    "grammar", "grammar_root", "json_schema", "grammar_drafts",
    "method", "draft", "n_draft", "top_k", "min_p",
    "auto_max_depth", "auto_max_nodes", "auto_max_gamma", "auto_draft_model", "auto_head", "auto_head_tree_nodes",
    "auto_corpus",
    "auto_corpus_max_depth", "auto_corpus_min_total", "auto_adapt_costs",
    "lookup_ngram_max", "lookup_ngram_min", "lookup_unit_ends", "lookup_substitutions", "lookup_resync",
    "lookup_loose_substitutions", "lookup_fences",
    "tree_nodes", "tree_depth", "tree_branching", "tree_expand", "beams", "beam_length",
    "pool", "pool_branches", "pool_phrase_len", "pool_max_nodes",
    "harvest_prompt", "harvest_generated", "harvest_verification",
    "acceptance", "typical_epsilon", "typical_delta", "repetition_penalty",
)


class OpenAIError(Exception):
    """An error answered as OpenAI's error object: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class ResponseFormat(BaseModel):
    """{"type": "text" | "json_object" | "json_schema"}: json_schema carries {"name", "schema",
    "strict"} (OpenAI); json_object may carry a "schema" (llama-cpp-python's form)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")

    def schema_for_output(self) -> dict[str, Any] | None:
        """The JSON schema the output must follow; None for text."""
        if self.type == "json_object":
            return self.schema_ if self.schema_ is not None else ANY_JSON_OBJECT
        if self.type == "json_schema":
            spec = self.json_schema or {}
            schema = spec.get("schema")
            if not isinstance(schema, dict):
                raise OpenAIError(400, "response_format json_schema needs json_schema.schema, a JSON schema object",
                                  param="response_format")
            return schema
        return None


class _SamplingRequest(BaseModel):
    """Fields the chat and completion endpoints share. Extra fields are kept for the
    speculative settings (SPECULATIVE_FIELDS); other unknown fields are ignored (clients send
    their own extras), or refused in strict mode."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None  # any name: the one model serves it
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Applied to the target's logits (GenerationConfig): exact under every method.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string, OpenAI's form) -> bias
    user: str | None = None
    response_format: ResponseFormat | None = None

    def check_supported(self, strict: bool = False) -> list[str]:
        """Raises OpenAIError (400) for what is valid OpenAI but not served here. Returns the
        unknown fields the request carries (ignored); strict: they are a 400 instead."""
        if self.n != 1:
            raise OpenAIError(400, f"n={self.n} is not supported: this server returns one choice (n=1)", param="n")
        if isinstance(self.stop, list) and any(not s for s in self.stop) or self.stop == "":
            raise OpenAIError(400, "stop strings must not be empty", param="stop")
        unknown = sorted(set(self.model_extra or {}) - set(SPECULATIVE_FIELDS) - set(self._ignored_fields()))
        if unknown and strict:
            raise OpenAIError(400, f"unrecognized request argument(s): {', '.join(unknown)}; pyspec settings: "
                                   f"{', '.join(SPECULATIVE_FIELDS)}", param=unknown[0])
        return unknown

    @staticmethod
    def _ignored_fields() -> tuple[str, ...]:
        # OpenAI fields that change nothing here (bookkeeping on OpenAI's side).
        return ("store", "metadata", "service_tier", "modalities", "prediction")

    def generation_config(self, defaults: GenerationConfig, max_tokens: int, logprobs: int | None) -> GenerationConfig:
        """The engine settings: the server's defaults, then this request's fields."""
        options: dict[str, Any] = {"max_tokens": max_tokens, "logprobs": logprobs}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if self.top_p is not None:
            options["top_p"] = self.top_p
        if self.stop is not None:
            options["stop"] = self.stop
        if self.seed is not None:
            options["seed"] = self.seed
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        if self.logit_bias:
            try:
                options["logit_bias"] = {int(token): bias for token, bias in self.logit_bias.items()}
            except ValueError:
                raise OpenAIError(400, "logit_bias keys must be token ids (integers as strings)",
                                  param="logit_bias") from None
        for name, value in (self.model_extra or {}).items():
            if name in SPECULATIVE_FIELDS:
                options[name] = value
        schema = self.response_format.schema_for_output() if self.response_format is not None else None
        if schema is not None:
            if "grammar" in options or "json_schema" in options:
                raise OpenAIError(400, "give response_format or a grammar / json_schema field, not both",
                                  param="response_format")
            options["json_schema"] = schema
        try:
            config = defaults.replace(**options)
            config.to_core()  # every value checked here, before the request waits in the queue
        except (TypeError, InvalidArgumentError) as exc:  # a field of the wrong type or out of range
            raise OpenAIError(400, str(exc)) from exc
        return config


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, tool_call_id, ...: given to Jinja templates

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables for the Jinja chat template

    def check_supported(self, strict: bool = False) -> list[str]:
        unknown = super().check_supported(strict)
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        return unknown

    def engine_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def messages_for_template(self) -> list[dict[str, Any]]:
        """The messages as a chat template reads them: content as text (content parts joined),
        every other field the client sent kept."""
        out = []
        for i, m in enumerate(self.messages):
            try:
                content = message_text(m.content, i)
            except (InvalidArgumentError, TypeError) as exc:
                raise OpenAIError(400, str(exc), param=f"messages.{i}.content") from exc
            out.append({**(m.model_extra or {}), "role": m.role, "content": content})
        return out


class CompletionRequest(_SamplingRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def check_supported(self, strict: bool = False) -> list[str]:
        unknown = super().check_supported(strict)
        if self.echo:
            raise OpenAIError(400, "echo is not supported", param="echo")
        if self.best_of not in (None, 1):
            raise OpenAIError(400, "best_of is not supported (n=1)", param="best_of")
        if self.suffix and not isinstance(self.single_prompt(), str):
            raise OpenAIError(400, "suffix (fill-in-the-middle) needs the prompt as text, not token ids",
                              param="suffix")
        return unknown

    def single_prompt(self) -> str | list[int]:
        """The one prompt, as text or token ids; a batch of several is an error."""
        p = self.prompt
        if isinstance(p, str):
            return p
        if p and all(isinstance(t, int) for t in p):
            return list(p)  # type: ignore[arg-type]
        if len(p) == 1:
            only = p[0]
            return only if isinstance(only, str) else list(only)  # type: ignore[arg-type]
        raise OpenAIError(400, f"a batch of {len(p)} prompts is not supported: send one prompt per request",
                          param="prompt")

    def token_limit(self) -> int | None:
        return self.max_tokens


class TokenizeRequest(BaseModel):
    """POST /tokenize, in llama-server's shape."""

    model_config = ConfigDict(extra="ignore")
    content: str
    add_special: bool = False    # bos where the model wants one
    parse_special: bool = True   # special-token text ("<|im_start|>") becomes that token
    with_pieces: bool = False    # [{"id", "piece"}] instead of ids


class DetokenizeRequest(BaseModel):
    """POST /detokenize, in llama-server's shape."""

    model_config = ConfigDict(extra="ignore")
    tokens: list[int]


class ApplyTemplateRequest(BaseModel):
    """POST /apply-template: the prompt a chat request would be given, without generating."""

    model_config = ConfigDict(extra="ignore")
    messages: list[ChatMessage] = Field(min_length=1)
    chat_template_kwargs: dict[str, Any] | None = None

    def messages_for_template(self) -> list[dict[str, Any]]:
        return ChatCompletionRequest.messages_for_template(self)  # type: ignore[arg-type]


# -- responses ---------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(result: GenerationResult) -> dict[str, Any]:
    n_prompt, n_out = len(result.prompt_tokens), len(result.tokens)
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        # OpenAI's field for prompt tokens served from its prompt cache: here the prefix cache.
        "prompt_tokens_details": {"cached_tokens": result.stats.n_prompt_cached},
    }


def speculation_summary(result: GenerationResult) -> dict[str, Any]:
    """What pyspec adds to a response (an extra field OpenAI clients keep but do not read)."""
    s = result.stats
    return {
        "method": result.method,
        "draft": result.draft,
        "draft_version": result.draft_version,
        "head_version": result.head_version,
        "n_drafted": s.n_drafted,
        "n_accepted": s.n_accepted,
        "acceptance_rate": s.acceptance_rate,
        "tokens_per_target_call": s.tokens_per_target_call,
        "n_target_calls": s.n_target_calls,
        "t_prefill_ms": s.t_prefill_ms,
        "tokens_per_second": s.tokens_per_second,
    }


TokenText = Any  # Callable[[int], bytes]: a token's bytes


def chat_logprobs(lp: TokenLogprobs, token_bytes: TokenText) -> dict[str, Any]:
    """OpenAI chat format: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        raw = token_bytes(token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": float(logprob), "bytes": list(raw)}

    content = []
    for i, token in enumerate(lp.tokens):
        item = entry(token, lp.token_logprobs[i])
        item["top_logprobs"] = [entry(int(t), v) for t, v in zip(lp.top_ids[i], lp.top_logprobs[i])]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(lp: TokenLogprobs, token_bytes: TokenText, text_offset: int) -> dict[str, Any]:
    """Legacy completions format: tokens, token_logprobs, top_logprobs (dicts), text_offset."""
    tokens, offsets, tops = [], [], []
    offset = text_offset
    for i, token in enumerate(lp.tokens):
        text = token_bytes(token).decode("utf-8", errors="replace")
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        tops.append({token_bytes(int(t)).decode("utf-8", errors="replace"): float(v)
                     for t, v in zip(lp.top_ids[i], lp.top_logprobs[i])})
    return {"tokens": tokens, "token_logprobs": [float(v) for v in lp.token_logprobs],
            "top_logprobs": tops, "text_offset": offsets}


def chat_response(result: GenerationResult, model: str, token_bytes: TokenText) -> dict[str, Any]:
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": result.text, "refusal": None},
            "logprobs": chat_logprobs(result.logprobs, token_bytes) if result.logprobs is not None else None,
            "finish_reason": result.finish_reason,
        }],
        "usage": usage(result),
        "pyspec": speculation_summary(result),
    }


def completion_response(result: GenerationResult, model: str, token_bytes: TokenText) -> dict[str, Any]:
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "text": result.text,
            "logprobs": completion_logprobs(result.logprobs, token_bytes, 0) if result.logprobs is not None else None,
            "finish_reason": result.finish_reason,
        }],
        "usage": usage(result),
        "pyspec": speculation_summary(result),
    }

"""Running one generation request: queue it, wait for it (or for its client to leave), and answer
with one JSON body or a stream of server-sent events. A stream that waits in the queue longer
than the keep-alive interval starts with comment lines (": keep-alive") so that proxies and
clients do not drop it; a stream cut by the server's shutdown ends with an error event and
[DONE]."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..config import GenerationConfig
from ..errors import ContextOverflowError, EngineClosedError, InvalidArgumentError
from ..results import StreamChunk
from . import protocol
from .protocol import OpenAIError
from .queue import STREAM_END, Job, JobCancelled, QueueClosed, QueueFull
from .tools import ContentFilter, ToolPlan, parse_calls

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("pyspec.server")

RETRY_AFTER_S = 2  # what a 503 tells the client to wait before it tries again

SHUTTING_DOWN = OpenAIError(503, "the server is shutting down; the generation was stopped", type="server_error",
                            code="server_shutting_down")


def error_response(error: OpenAIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def from_engine_error(exc: BaseException) -> OpenAIError:
    """The error a failed generation is answered with: 400 for what the request asked wrongly
    (the engine's argument checks), 503 when the engine is closing, 500 for everything else."""
    if isinstance(exc, ContextOverflowError):
        return OpenAIError(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, InvalidArgumentError):
        return OpenAIError(400, str(exc))
    if isinstance(exc, EngineClosedError):
        return SHUTTING_DOWN
    log.error("generation failed", exc_info=exc)
    return OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")


@dataclass(frozen=True)
class Reply:
    """How a response is labelled: the endpoint ("chat" or "completion") and the model name it carries."""

    endpoint: str
    model: str
    stream: bool
    include_usage: bool
    tools: ToolPlan | None = None  # chat with tools: calls are parsed out of the output


async def serve(request: Request, state: "ServerState", reply: Reply, tokens: list[int],
                config: GenerationConfig) -> Response:
    loop = asyncio.get_running_loop()
    endpoint = reply.endpoint
    job = Job(tokens=tokens, config=config, loop=loop, future=loop.create_future(),
              chunks=asyncio.Queue() if reply.stream else None, endpoint=endpoint)
    # A handler that returned early (its client left) never reads the outcome: mark it read.
    job.future.add_done_callback(lambda f: f.cancelled() or f.exception())
    try:
        state.queue.submit(job)
    except QueueFull as exc:
        state.metrics.count_request(endpoint, "rejected")
        return error_response(OpenAIError(503, f"the server is busy: {exc}; try again later", type="server_error",
                                          code="server_busy"), headers={"Retry-After": str(RETRY_AFTER_S)})
    except QueueClosed:
        state.metrics.count_request(endpoint, "rejected")
        return error_response(SHUTTING_DOWN)
    watcher = asyncio.create_task(_wait_for_disconnect(request, job))
    # Wait for the result (or, streaming, the first piece, for at most the keep-alive interval):
    # errors found when the generation starts (bad settings) are still answered with their
    # status, before any stream begins.
    first: Any = asyncio.ensure_future(job.chunks.get()) if job.chunks is not None else job.future
    timeout = state.settings.keepalive_s if reply.stream else None
    try:
        await asyncio.wait({first, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        job.cancel()
        watcher.cancel()
        raise
    if watcher.done():  # the client went away: its generation stops at its next piece
        first.cancel()
        job.cancel()
        state.metrics.count_request(endpoint, "cancelled")
        return Response(status_code=499)
    if reply.stream:
        item = first.result() if first.done() else first  # still waiting: the stream keeps it alive
        if item is STREAM_END:  # ended before any text: an error still gets its status
            await asyncio.wait({job.future})
        if item is not STREAM_END or job.future.exception() is None:
            return StreamingResponse(_stream(state, reply, job, item, watcher), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    watcher.cancel()
    try:
        result = job.future.result()
    except JobCancelled:
        if state.queue.closed:
            state.metrics.count_request(endpoint, "error")
            return error_response(SHUTTING_DOWN)
        state.metrics.count_request(endpoint, "cancelled")
        return Response(status_code=499)
    except Exception as exc:
        state.metrics.count_request(endpoint, "error")
        return error_response(from_engine_error(exc))
    if result.finish_reason == "cancelled" and state.queue.closed:
        state.metrics.count_request(endpoint, "error")
        return error_response(SHUTTING_DOWN)
    state.metrics.count_request(endpoint, "ok")
    if endpoint != "chat":
        return JSONResponse(protocol.completion_response(result, reply.model, state.engine.token_bytes))
    body = protocol.chat_response(result, reply.model, state.engine.token_bytes)
    if reply.tools is not None:
        content, calls = parse_calls(result.text, reply.tools)
        if calls:
            choice = body["choices"][0]
            choice["message"].update(content=content, tool_calls=[c.wire() for c in calls])
            if choice["finish_reason"] == "stop":
                choice["finish_reason"] = "tool_calls"
    return JSONResponse(body)


async def _wait_for_disconnect(request: Request, job: Job) -> None:
    """Returns when the client disconnects (the body has been read: the next ASGI message is the
    disconnect) and cancels the job then."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


KEEPALIVE = ": keep-alive\n\n"  # an SSE comment: clients skip it, proxies see bytes


async def _stream(state: "ServerState", reply: Reply, job: Job, first: Any, watcher: "asyncio.Task[None]"
                  ) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, then `data: [DONE]`. `first` is the first
    item of the job's chunk queue, or the task still waiting for it. Cancelling this generator
    (Starlette does when the client disconnects) cancels the generation."""
    chat = reply.endpoint == "chat"
    ident = protocol.new_id("chatcmpl" if chat else "cmpl")
    created = int(time.time())
    token_bytes = state.engine.token_bytes
    n_text = 0  # characters streamed so far (completions' text_offset)

    def chunk(choice: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                                "created": created, "model": reply.model, "choices": [choice] if choice else []}
        if reply.include_usage:
            body["usage"] = usage
        return body

    def piece(item: StreamChunk) -> dict[str, Any]:
        nonlocal n_text
        if chat:
            lp = protocol.chat_logprobs(item.logprobs, token_bytes) if item.logprobs is not None else None
            choice = {"index": 0, "delta": {"content": item.text}, "logprobs": lp, "finish_reason": None}
        else:
            lp = protocol.completion_logprobs(item.logprobs, token_bytes, n_text) if item.logprobs is not None else None
            choice = {"index": 0, "text": item.text, "logprobs": lp, "finish_reason": None}
        n_text += len(item.text)
        return chunk(choice)

    calls_filter = ContentFilter() if chat and reply.tools is not None else None
    n_content = 0  # characters of content streamed (tools: the part before the calls)

    def content_piece(item: StreamChunk) -> StreamChunk:
        nonlocal n_content
        if calls_filter is not None:
            item = StreamChunk(calls_filter.feed(item.text), item.tokens, item.logprobs)
        n_content += len(item.text)
        return item

    outcome = "cancelled"
    assert job.chunks is not None
    try:
        if chat:
            yield _sse(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}))
        if isinstance(first, asyncio.Future):  # still queued: keep the connection alive meanwhile
            while True:
                done, _ = await asyncio.wait({first}, timeout=state.settings.keepalive_s)
                if done:
                    break
                yield KEEPALIVE
            first = first.result()
        item = first
        while item is not STREAM_END:
            item = content_piece(item)
            if item.text or item.logprobs is not None:
                yield _sse(piece(item))
            item = await job.chunks.get()
        try:
            result = await job.future
        except JobCancelled:
            result = None
        except Exception as exc:  # the stream has started: the error goes in the stream
            outcome = "error"
            yield _sse(from_engine_error(exc).body())
            yield "data: [DONE]\n\n"
            return
        if result is None or result.finish_reason == "cancelled":
            if state.queue.closed:  # stopped by the shutdown, not by the client: say so
                outcome = "error"
                yield _sse(SHUTTING_DOWN.body())
                yield "data: [DONE]\n\n"
            return
        finish_reason = result.finish_reason
        if calls_filter is not None:
            held = calls_filter.in_call or calls_filter.maybe_bare
            content, calls = parse_calls(result.text, reply.tools) if held else (None, [])
            if calls:
                yield _sse(chunk({"index": 0, "delta": {"tool_calls": [c.wire(i) for i, c in enumerate(calls)]},
                                  "logprobs": None, "finish_reason": None}))
                finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
            elif len(result.text) > n_content:  # no call after all: the held-back text is content
                yield _sse(chunk({"index": 0, "delta": {"content": result.text[n_content:]}, "logprobs": None,
                                  "finish_reason": None}))
        final = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        final.update({"delta": {}} if chat else {"text": ""})
        body = chunk(final)
        body["pyspec"] = protocol.speculation_summary(result)
        yield _sse(body)
        if reply.include_usage:
            yield _sse(chunk({}, protocol.usage(result)))
        outcome = "ok"
        yield "data: [DONE]\n\n"
    finally:
        if isinstance(first, asyncio.Future):
            first.cancel()
        job.cancel()  # no-op once finished; stops the generation when the client went away
        watcher.cancel()
        state.metrics.count_request(reply.endpoint, outcome)

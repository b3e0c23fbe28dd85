"""The HTTP layer: one FastAPI route per endpoint over one Engine behind one FIFO queue. Routes
turn OpenAI requests into GenerationConfigs and results into OpenAI bodies (protocol.py); the
engine knows nothing about HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import SERVER_TEMPERATURE, GenerationConfig
from ..engine import Engine
from ..errors import ContextOverflowError, EngineClosedError, InvalidArgumentError
from ..results import GenerationResult, StreamChunk
from . import protocol
from .metrics import ServerMetrics
from .online import OnlineLoop, OnlineSettings
from .keepers import PoolKeeper, StatsKeeper
from .protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from .queue import STREAM_END, GenerationQueue, Job, JobCancelled

log = logging.getLogger("pyspec.server")


@dataclass(frozen=True)
class ServerSettings:
    """Everything `pyspec serve` is started with (the command line's options)."""

    target: str
    draft: str | None = None
    model_name: str | None = None     # the id clients send as "model" (default: the target's file stem)
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int | None = None  # None: $PYSPEC_N_GPU_LAYERS, else 0
    seed: int = 0
    prefix_cache: bool = True
    pool_capacity: int | None = None  # phrases the phrase pool keeps at most (None: the engine's default)
    repack: bool | str | None = None  # Engine's repack (None: weights on CPUs with AMX, all elsewhere)
    huge_pages: bool = True  # Engine's huge_pages
    flash_attn: bool = False  # Engine's flash_attn
    ngram: str | None = None  # Engine's ngram: an n-gram table auto also drafts from ("default": the cached ShareGPT one)
    # Defaults of every request; a request's own fields (OpenAI's and the speculative extra
    # fields) override them. temperature 1.0 and top_p 1.0 are OpenAI's defaults.
    defaults: GenerationConfig = field(default_factory=lambda: GenerationConfig(temperature=SERVER_TEMPERATURE))
    pool_file: str | None = None
    pool_save_interval_s: float = 60.0
    # method auto's acceptance statistics across restarts: loaded at start, saved every
    # stats_save_interval_s when generations ran since the last save, and at shutdown
    stats_file: str | None = None
    stats_save_interval_s: float = 60.0
    online: OnlineSettings | None = None  # None: the draft stays as loaded


@dataclass
class ServerState:
    settings: ServerSettings
    engine: Engine
    model_name: str
    queue: GenerationQueue
    metrics: ServerMetrics
    pool: PoolKeeper | None
    online: OnlineLoop | None
    stats: StatsKeeper | None
    started: float


def create_app(settings: ServerSettings, engine: Engine | None = None) -> FastAPI:
    """The ASGI application. The engine is loaded at startup (uvicorn accepts connections once
    it is ready) unless one is given; it is closed at shutdown either way."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await asyncio.to_thread(_start, settings, engine)
        app.state.pyspec = state
        try:
            yield
        finally:
            await asyncio.to_thread(_stop, state)

    app = FastAPI(title="pyspec", version="0.1.0", lifespan=lifespan)
    _add_error_handlers(app)
    _add_routes(app)
    return app


def _start(settings: ServerSettings, engine: Engine | None) -> ServerState:
    if engine is None:
        engine = Engine(settings.target, draft=settings.draft, n_ctx=settings.n_ctx, n_batch=settings.n_batch,
                        n_threads=settings.n_threads, n_gpu_layers=settings.n_gpu_layers, seed=settings.seed,
                        prefix_cache=settings.prefix_cache, pool_capacity=settings.pool_capacity,
                        repack=settings.repack, huge_pages=settings.huge_pages, ngram=settings.ngram,
                        flash_attn=settings.flash_attn)
    metrics = ServerMetrics()
    pool = None
    if settings.pool_file:
        pool = PoolKeeper(engine, settings.pool_file, settings.pool_save_interval_s, metrics)
        pool.load()
        pool.start()
    stats = None
    if settings.stats_file:
        stats = StatsKeeper(engine, settings.stats_file, settings.stats_save_interval_s, metrics)
        stats.load()
        stats.start()
    online = OnlineLoop(engine, settings.online) if settings.online is not None else None

    def observe(job: Job, result: GenerationResult | None, error: BaseException | None, waited: float) -> None:
        if result is not None:
            metrics.add_generation(result, waited)
            if online is not None and result.finish_reason != "cancelled":
                online.submit(result)

    name = settings.model_name or Path(engine.target_path).name.removesuffix(".gguf")
    log.info("serving %s (draft: %s)", name, engine.draft_path)
    return ServerState(settings, engine, name, GenerationQueue(engine, [observe]), metrics, pool, online,
                       stats, time.time())


def _stop(state: ServerState) -> None:
    state.queue.close()
    if state.online is not None:
        state.online.close()
    if state.pool is not None:
        state.pool.close()
    if state.stats is not None:
        state.stats.close()
    state.engine.close()


# -- errors ------------------------------------------------------------------------------------


def _error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def _from_engine_error(exc: Exception) -> OpenAIError:
    if isinstance(exc, ContextOverflowError):
        return OpenAIError(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, (InvalidArgumentError, TypeError, ValueError)):
        return OpenAIError(400, str(exc))
    if isinstance(exc, EngineClosedError):
        return OpenAIError(503, "the server is shutting down", type="server_error")
    log.error("generation failed", exc_info=exc)
    return OpenAIError(500, f"{type(exc).__name__}: {exc}", type="server_error")


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            return _error_response(OpenAIError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', '')}"))
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        where = ".".join(loc)
        message = f"{where}: {first.get('msg', 'invalid value')}" if where else str(first.get("msg", "invalid body"))
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        return _error_response(OpenAIError(400, message, param=where or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error_response(OpenAIError(exc.status_code, str(exc.detail), type=kind))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error", exc_info=exc)
        return _error_response(OpenAIError(500, f"{type(exc).__name__}: {exc}", type="server_error"))


# -- routes ------------------------------------------------------------------------------------


def _state(request: Request) -> ServerState:
    return request.app.state.pyspec  # type: ignore[no-any-return]


def _add_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        state = _state(request)
        return {"status": "ok", "model": state.model_name, "queue_depth": state.queue.depth,
                "draft_version": state.engine.draft_version}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(_state(request))]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict[str, Any]:
        state = _state(request)
        _check_model(state, model_id)
        return _model_card(state)

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        state = _state(request)
        text = state.metrics.render(_gauges(state))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        state = _state(request)
        body.check_supported()
        _check_model(state, body.model)
        try:
            tokens = state.engine.prompt_tokens(body.messages_for_template())
        except (InvalidArgumentError, TypeError) as exc:
            raise OpenAIError(400, str(exc), param="messages") from exc
        config = _config(state, body, tokens, body.engine_logprobs(), "messages")
        return await _serve(request, state, "chat", tokens, config, body.stream, body.stream_options)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        state = _state(request)
        body.check_supported()
        _check_model(state, body.model)
        prompt = body.single_prompt()
        try:
            tokens = state.engine.prompt_tokens(prompt)
        except (InvalidArgumentError, TypeError) as exc:
            raise OpenAIError(400, str(exc), param="prompt") from exc
        config = _config(state, body, tokens, body.logprobs, "prompt")
        return await _serve(request, state, "completion", tokens, config, body.stream, body.stream_options)


def _model_card(state: ServerState) -> dict[str, Any]:
    return {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "pyspec"}


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise OpenAIError(404, f"The model '{model}' does not exist; this server serves '{state.model_name}'",
                          param="model", code="model_not_found", type="not_found_error")


def _config(state: ServerState, body: Any, tokens: list[int], logprobs: int | None, prompt_param: str
            ) -> GenerationConfig:
    n_ctx = state.engine.n_ctx
    if not tokens:
        raise OpenAIError(400, "the prompt is empty", param=prompt_param)
    if len(tokens) >= n_ctx:
        raise OpenAIError(400, f"This model's maximum context length is {n_ctx} tokens, but the prompt has "
                               f"{len(tokens)} tokens (at least one token must be left to generate)",
                          param=prompt_param, code="context_length_exceeded")
    limit = body.token_limit()
    max_tokens = limit if limit is not None else n_ctx - len(tokens)
    config = body.generation_config(state.settings.defaults, max_tokens, logprobs)
    # The trace feeds the online distiller only: not computed when nobody reads it.
    return config.replace(trace_top_k=config.trace_top_k if state.online is not None else 0)


def _gauges(state: ServerState) -> Iterable[tuple[str, str, str, float]]:
    yield "pyspec_queue_depth", "Requests waiting for the engine plus the one running.", "", state.queue.depth
    for slot, version in sorted(state.engine.draft_versions.items()):
        yield "pyspec_draft_version", "Models the draft slot has held (1: as loaded, +1 per reload).", \
            f'{{slot="{slot}"}}', version
    pool = state.engine.pool_stats()
    yield "pyspec_pool_phrases", "Phrases in the phrase pool.", "", pool["size"]
    yield "pyspec_pool_capacity", "Phrases the phrase pool holds at most (--pool-capacity).", "", pool["capacity"]
    yield "pyspec_pool_bytes", "Memory the phrase pool takes (its rows and hash tables).", "", pool["memory_bytes"]
    yield "pyspec_uptime_seconds", "Seconds since the server started.", "", time.time() - state.started
    if state.online is not None:
        yield from state.online.gauges()


# -- running a request -------------------------------------------------------------------------


async def _serve(request: Request, state: ServerState, endpoint: str, tokens: list[int], config: GenerationConfig,
                 stream: bool, stream_options: Any) -> Response:
    loop = asyncio.get_running_loop()
    job = Job(tokens=tokens, config=config, loop=loop, future=loop.create_future(),
              chunks=asyncio.Queue() if stream else None, endpoint=endpoint)
    # A handler that returned early (its client left) never reads the outcome: mark it read.
    job.future.add_done_callback(lambda f: f.cancelled() or f.exception())
    state.queue.submit(job)
    watcher = asyncio.create_task(_wait_for_disconnect(request, job))
    # Wait for the result (or, streaming, the first piece): errors found when the generation
    # starts (bad settings) are still answered with their status, before any stream begins.
    assert job.chunks is not None or not stream
    first: Any = asyncio.ensure_future(job.chunks.get()) if job.chunks is not None else job.future
    try:
        await asyncio.wait({first, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        job.cancel()
        watcher.cancel()
        raise
    if not first.done():  # the client went away: its generation stops at its next piece
        first.cancel()
        job.cancel()
        state.metrics.count_request(endpoint, "cancelled")
        return Response(status_code=499)
    if stream:
        item = first.result()
        if item is STREAM_END:  # ended before any text: an error still gets its status
            await asyncio.wait({job.future})
        if item is not STREAM_END or job.future.exception() is None:
            include_usage = bool(stream_options and stream_options.include_usage)
            return StreamingResponse(_stream(state, endpoint, job, item, watcher, include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    watcher.cancel()
    try:
        result = job.future.result()
    except JobCancelled:
        state.metrics.count_request(endpoint, "cancelled")
        return Response(status_code=499)
    except Exception as exc:
        state.metrics.count_request(endpoint, "error")
        return _error_response(_from_engine_error(exc))
    state.metrics.count_request(endpoint, "ok")
    token_bytes = state.engine.token_bytes
    body = (protocol.chat_response if endpoint == "chat" else protocol.completion_response)(
        result, state.model_name, token_bytes)
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


async def _stream(state: ServerState, endpoint: str, job: Job, first: object, watcher: "asyncio.Task[None]",
                  include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, then `data: [DONE]`. Cancelling this
    generator (Starlette does when the client disconnects) cancels the generation."""
    chat = endpoint == "chat"
    ident = protocol.new_id("chatcmpl" if chat else "cmpl")
    created = int(time.time())
    token_bytes = state.engine.token_bytes
    n_text = 0  # characters streamed so far (completions' text_offset)

    def chunk(choice: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                                "created": created, "model": state.model_name,
                                "choices": [choice] if choice else []}
        if include_usage:
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

    outcome = "cancelled"
    try:
        if chat:
            yield _sse(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}))
        assert job.chunks is not None
        item = first
        while item is not STREAM_END:
            if item.text or item.logprobs is not None:  # type: ignore[attr-defined]
                yield _sse(piece(item))  # type: ignore[arg-type]
            item = await job.chunks.get()
        try:
            result = await job.future
        except JobCancelled:
            return
        except Exception as exc:  # the stream has started: the error goes in the stream
            outcome = "error"
            yield _sse(_from_engine_error(exc).body())
            yield "data: [DONE]\n\n"
            return
        if result.finish_reason == "cancelled":
            return
        final = {"index": 0, "finish_reason": result.finish_reason, "logprobs": None}
        final.update({"delta": {}} if chat else {"text": ""})
        body = chunk(final)
        body["pyspec"] = protocol.speculation_summary(result)
        yield _sse(body)
        if include_usage:
            yield _sse(chunk({}, protocol.usage(result)))
        outcome = "ok"
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()  # no-op once finished; stops the generation when the client went away
        watcher.cancel()
        state.metrics.count_request(endpoint, outcome)

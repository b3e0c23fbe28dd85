"""The HTTP layer: one FastAPI route per endpoint over one Engine behind one FIFO queue. Routes
turn OpenAI requests into GenerationConfigs and results into OpenAI bodies (protocol.py, serving.py);
the engine knows nothing about HTTP. Chat templating and tokenization run on worker threads, never
on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import SERVER_TEMPERATURE, GenerationConfig
from ..engine import Engine
from ..errors import InvalidArgumentError
from ..results import GenerationResult
from . import tools
from .guards import ApiKeyGuard, BodyLimit
from .keepers import PoolKeeper, StatsKeeper
from .metrics import ServerMetrics
from .online import OnlineLoop, OnlineSettings
from .protocol import (ApplyTemplateRequest, ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                       OpenAIError, TokenizeRequest)
from .queue import GenerationQueue, Job
from .serving import Reply, error_response, serve
from .templates import ChatTemplate, TemplateError

log = logging.getLogger("pyspec.server")


@dataclass(frozen=True)
class ServerSettings:
    """Everything `pyspec serve` is started with (the command line's options)."""

    target: str
    draft: str | None = None
    head: str | bool | None = None  # Engine's head: a draft head GGUF, None: the one known for the target, False: none
    model_name: str | None = None     # the id clients send as "model" (default: the target's file stem)
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int | None = None  # None: $PYSPEC_N_GPU_LAYERS, else 0 (all of them with rpc)
    rpc: str | None = None  # Engine's rpc: llama.cpp rpc-servers holding the target's layers
    seed: int = 0
    prefix_cache: bool = True
    pool_capacity: int | None = None  # phrases the phrase pool keeps at most (None: the engine's default)
    repack: bool | str | None = None  # Engine's repack (None: weights on CPUs with AMX, all elsewhere)
    huge_pages: bool = True  # Engine's huge_pages
    flash_attn: bool | str | None = None  # Engine's flash_attn (None: auto, or $PYSPEC_FLASH_ATTN)
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
    online: OnlineSettings | None = None  # None: the draft (or head) stays as loaded
    # Protocol: other names /v1/models lists for the model (any name is served); strict: unknown
    # request fields are a 400 instead of being ignored.
    model_aliases: tuple[str, ...] = ()
    strict: bool = False
    chat_template: str | None = None  # a Jinja file or a llama.cpp built-in name (None: the model's own)
    # Operations
    api_key: str | None = None          # requests but /health need "Authorization: Bearer <key>"
    cors_origins: tuple[str, ...] = ()  # browser origins allowed ("*": any)
    max_queue: int | None = None        # requests waiting besides the running one; 503 beyond (None: no limit)
    max_body_bytes: int = 8 * 1024 * 1024
    max_tokens_default: int | None = 2048  # max_tokens of a request that sets none (None: the rest of the context)
    keepalive_s: float = 10.0           # a queued stream gets a ": keep-alive" comment this often
    shutdown_timeout_s: float = 30.0    # the whole shutdown (generation stop, saves, distiller, engine)


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
    template: ChatTemplate
    model_names: tuple[str, ...] = ()  # the name and the aliases, as /v1/models lists them
    ignored_fields: set[str] = field(default_factory=set)  # unknown request fields logged once each


def create_app(settings: ServerSettings, engine: Engine | None = None) -> FastAPI:
    """The ASGI application. The engine is loaded at startup (uvicorn accepts connections once
    it is ready) unless one is given; it is closed at shutdown either way. Call begin_shutdown(app)
    when the shutdown starts (the command line does on SIGINT/SIGTERM) to stop the generations
    before the server waits for open connections."""

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
    # The last added is the outermost: CORS (its preflights need no key), then the key, then the body limit.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if settings.api_key:
        app.add_middleware(ApiKeyGuard, api_key=settings.api_key)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["*"],
                           allow_headers=["*"], allow_credentials="*" not in settings.cors_origins)
    return app


def begin_shutdown(app: FastAPI) -> None:
    """Refuses new generations and stops the running and waiting ones (streams end with an error
    event and [DONE], waiting requests get 503). Safe from a signal handler; returns at once."""
    state: ServerState | None = getattr(app.state, "pyspec", None)
    if state is not None:
        state.queue.cancel_all()


def _start(settings: ServerSettings, engine: Engine | None) -> ServerState:
    if engine is None:
        engine = Engine(settings.target, draft=settings.draft, head=settings.head, n_ctx=settings.n_ctx,
                        n_batch=settings.n_batch,
                        n_threads=settings.n_threads, n_gpu_layers=settings.n_gpu_layers, seed=settings.seed,
                        prefix_cache=settings.prefix_cache, pool_capacity=settings.pool_capacity,
                        repack=settings.repack, huge_pages=settings.huge_pages, ngram=settings.ngram,
                        flash_attn=settings.flash_attn, rpc=settings.rpc)
    template = ChatTemplate(engine, settings.chat_template)
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
    names = tuple(dict.fromkeys((name, *settings.model_aliases)))
    log.info("serving %s (draft: %s, head: %s); chat template: %s", name, engine.draft_path, engine.head_path,
             template.description)
    queue = GenerationQueue(engine, [observe], max_waiting=settings.max_queue)
    return ServerState(settings, engine, name, queue, metrics, pool, online, stats, time.time(), template, names)


def _stop(state: ServerState) -> None:
    """Stops the generations, saves the pool and the statistics, then closes the distiller and the
    engine: what must reach the disk comes first, and every wait has a share of
    settings.shutdown_timeout_s, so that a supervisor's kill after that time loses nothing saved."""
    deadline = time.monotonic() + state.settings.shutdown_timeout_s

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    t0 = time.monotonic()
    state.queue.close(timeout=left())
    for keeper in (state.pool, state.stats):
        if keeper is not None:
            _within(keeper.close, left(), f"saving the {keeper.what}")
    if state.online is not None:
        _within(lambda: state.online.close(timeout=left()), left(), "closing the online distiller")  # type: ignore[union-attr]
    _within(state.engine.close, left(), "closing the engine")
    log.info("shut down in %.1f s", time.monotonic() - t0)


def _within(fn: Callable[[], object], timeout: float, what: str) -> bool:
    """Runs fn on a thread of its own and waits at most `timeout` seconds; False (logged) when it
    had not finished (it goes on in the background, a daemon thread the process exit ends)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # reported below
            failure.append(exc)

    thread = threading.Thread(target=run, name="pyspec-shutdown", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        log.error("%s did not finish within %.1f s; going on with the shutdown", what, timeout)
        return False
    if failure:
        log.error("%s failed: %s", what, failure[0], exc_info=failure[0])
        return False
    return True


# -- errors ------------------------------------------------------------------------------------


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            return error_response(OpenAIError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', '')}"))
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        where = ".".join(loc)
        message = f"{where}: {first.get('msg', 'invalid value')}" if where else str(first.get("msg", "invalid body"))
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        return error_response(OpenAIError(400, message, param=where or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(OpenAIError(exc.status_code, str(exc.detail), type=kind))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error", exc_info=exc)
        return error_response(OpenAIError(500, f"{type(exc).__name__}: {exc}", type="server_error"))


# -- routes ------------------------------------------------------------------------------------


def _state(request: Request) -> ServerState:
    return request.app.state.pyspec  # type: ignore[no-any-return]


def _add_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        state = _state(request)
        return {"status": "stopping" if state.queue.closed else "ok", "model": state.model_name,
                "queue_depth": state.queue.depth, "draft_version": state.engine.draft_version}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        state = _state(request)
        return {"object": "list", "data": [_model_card(state, name) for name in state.model_names]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict[str, Any]:
        state = _state(request)
        if state.settings.strict and model_id not in state.model_names:
            raise _unknown_model(state, model_id)
        return _model_card(state, model_id)

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        state = _state(request)
        text = state.metrics.render(_gauges(state))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        state = _state(request)
        _check_request(state, body, body.check_supported(state.settings.strict))
        messages = body.messages_for_template()
        tool_plan = tools.plan(body.tools, body.tool_choice, body.parallel_tool_calls)

        def prepare() -> list[int]:
            rendered = state.template.render(messages, kwargs=body.chat_template_kwargs, tools=tool_plan)
            return state.template.tokens(rendered.text)

        tokens = await _off_loop(prepare, "messages")
        config = _config(state, body, tokens, body.engine_logprobs(), "messages")
        grammar = await _off_loop(tool_plan.grammar, "tools") if tool_plan is not None else None
        if grammar is not None:
            if config.grammar is not None or config.json_schema is not None:
                raise OpenAIError(400, f"tool_choice {body.tool_choice!r} constrains the output to tool calls: give "
                                       f"no response_format, grammar or json_schema with it", param="tool_choice")
            config = config.replace(grammar=grammar, grammar_root="root")
        return await serve(request, state, _reply(state, body, "chat", tool_plan), tokens, config)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        state = _state(request)
        _check_request(state, body, body.check_supported(state.settings.strict))
        prompt = body.single_prompt()
        if body.suffix:
            assert isinstance(prompt, str)  # check_supported refused token ids with a suffix
            tokens = await _off_loop(lambda: _fill_in_the_middle(state.engine, prompt, body.suffix or ""), "suffix")
        else:
            tokens = await _off_loop(lambda: state.engine.prompt_tokens(prompt), "prompt")
        config = _config(state, body, tokens, body.logprobs, "prompt")
        return await serve(request, state, _reply(state, body, "completion"), tokens, config)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return error_response(OpenAIError(501, "embeddings are not served: pyspec runs a generation model (its "
                                               "hidden states are not a trained sentence embedding); use an "
                                               "embedding model's server", type="not_implemented_error",
                                          code="not_implemented"))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
        engine = _state(request).engine
        ids = await _off_loop(lambda: engine.tokenize(body.content, add_special=body.add_special,
                                                      parse_special=body.parse_special), "content")
        if not body.with_pieces:
            return {"tokens": ids}
        pieces = []
        for token in ids:
            raw = engine.token_bytes(token)
            try:
                pieces.append({"id": token, "piece": raw.decode("utf-8")})
            except UnicodeDecodeError:  # part of a character: its bytes, as llama-server gives them
                pieces.append({"id": token, "piece": list(raw)})
        return {"tokens": pieces}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
        engine = _state(request).engine
        n_vocab = engine.n_vocab
        for i, token in enumerate(body.tokens):
            if not 0 <= token < n_vocab:
                raise OpenAIError(400, f"tokens[{i}] = {token} is outside the vocabulary [0, {n_vocab})",
                                  param="tokens")
        return {"content": await _off_loop(lambda: engine.detokenize(body.tokens), "tokens")}

    @app.post("/apply-template")
    async def apply_template(body: ApplyTemplateRequest, request: Request) -> dict[str, Any]:
        state = _state(request)
        messages = body.messages_for_template()
        rendered = await _off_loop(lambda: state.template.render(messages, kwargs=body.chat_template_kwargs),
                                   "messages")
        return {"prompt": rendered.text, "formatted_by": rendered.source}


async def _off_loop(fn: Callable[[], Any], param: str) -> Any:
    """Runs fn (templating, tokenizing) on a worker thread; its argument errors are a 400 on `param`."""
    try:
        return await asyncio.to_thread(fn)
    except (InvalidArgumentError, TemplateError, TypeError) as exc:
        raise OpenAIError(400, str(exc), param=param) from exc


def _fill_in_the_middle(engine: Engine, prefix: str, suffix: str) -> list[int]:
    """The prompt of a fill-in-the-middle completion: <prefix marker> prefix <suffix marker>
    suffix <middle marker>, the marker tokens being the model's own (Qwen2.5-Coder:
    <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>); the text in between is tokenized as plain
    text (marker text inside it is not a marker)."""
    special = engine.special_tokens
    markers = (special["fim_prefix"], special["fim_suffix"], special["fim_middle"])
    if min(markers) < 0:
        raise OpenAIError(400, "suffix (fill-in-the-middle) needs a model with fill-in-the-middle tokens; this "
                               "model has none (a coder model such as Qwen2.5-Coder has them)", param="suffix")
    pre, suf, mid = markers
    start = engine.tokenize("", add_special=True, parse_special=False)  # bos where the model wants one
    text = (lambda t: engine.tokenize(t, add_special=False, parse_special=False))
    return [*start, pre, *text(prefix), suf, *text(suffix), mid]


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(state.started), "owned_by": "pyspec"}


def _unknown_model(state: ServerState, model: str) -> OpenAIError:
    return OpenAIError(404, f"The model '{model}' does not exist; this server serves "
                            f"{', '.join(repr(n) for n in state.model_names)}",
                       param="model", code="model_not_found", type="not_found_error")


def _check_request(state: ServerState, body: Any, unknown: list[str]) -> None:
    """Strict mode: only the served names. Otherwise: unknown fields logged, once per name."""
    if state.settings.strict and body.model is not None and body.model not in state.model_names:
        raise _unknown_model(state, body.model)
    new = [name for name in unknown if name not in state.ignored_fields]
    if new:
        state.ignored_fields.update(new)
        log.warning("ignoring request field(s) this server does not know: %s (logged once per name; --strict "
                    "refuses them)", ", ".join(new))


def _reply(state: ServerState, body: Any, endpoint: str, tool_plan: tools.ToolPlan | None = None) -> Reply:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return Reply(endpoint, state.model_name, body.stream, include_usage, tool_plan)


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
    if limit is None:
        limit = state.settings.max_tokens_default
    room = n_ctx - len(tokens)
    max_tokens = min(limit, room) if limit is not None else room
    config = body.generation_config(state.settings.defaults, max_tokens, logprobs)
    # The trace's top-k feeds the online distiller only: not computed when nobody reads it.
    return config.replace(trace_top_k=state.online.trace_top_k if state.online is not None else 0)


def _gauges(state: ServerState) -> Iterable[tuple[str, str, str, float]]:
    yield "pyspec_queue_depth", "Requests waiting for the engine plus the one running.", "", state.queue.depth
    for slot, version in sorted(state.engine.draft_versions.items()):
        yield "pyspec_draft_version", "Models the draft slot has held (1: as loaded, +1 per reload).", \
            f'{{slot="{slot}"}}', version
    if state.engine.head_path is not None:
        yield "pyspec_head_version", "Heads the engine has held (1: as loaded, +1 per reload).", "", \
            state.engine.head_version
    pool = state.engine.pool_stats()
    yield "pyspec_pool_phrases", "Phrases in the phrase pool.", "", pool["size"]
    yield "pyspec_pool_capacity", "Phrases the phrase pool holds at most (--pool-capacity).", "", pool["capacity"]
    yield "pyspec_pool_bytes", "Memory the phrase pool takes (its rows and hash tables).", "", pool["memory_bytes"]
    yield "pyspec_uptime_seconds", "Seconds since the server started.", "", time.time() - state.started
    if state.online is not None:
        yield from state.online.gauges()

"""`pyspec serve`: an OpenAI-compatible HTTP server over one Engine (needs the `server` extra:
`pip install "pyspec-engine[server]"`, FastAPI + uvicorn).

    from pyspec.server import ServerSettings, create_app
    app = create_app(ServerSettings(target="qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct"))
    # uvicorn.run(app, host="127.0.0.1", port=8000)

Endpoints: POST /v1/chat/completions and /v1/completions (streamed as server-sent events or
not), GET /v1/models, /health, /metrics (Prometheus text), POST /tokenize, /detokenize,
/apply-template; POST /v1/embeddings answers 501. Requests run one at a time in arrival order; a
client that disconnects cancels its generation. docs/server.md describes every option.
"""

from __future__ import annotations

try:
    import fastapi  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('pyspec serve needs FastAPI and uvicorn: pip install "pyspec-engine[server]"') from exc

from .app import ServerSettings, begin_shutdown, create_app
from .online import OnlineSettings

__all__ = ["ServerSettings", "OnlineSettings", "begin_shutdown", "create_app"]

"""What stands between the network and the routes: the API key (--api-key), the request body limit
(--max-body-bytes) and CORS (--cors-origin). Plain ASGI middleware; refusals are OpenAI error
objects like every other error."""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})  # answered without the API key (load balancers, supervisors)


async def send_error(send: Send, status: int, message: str, *, code: str | None = None,
                     headers: dict[str, str] | None = None, type: str = "invalid_request_error") -> None:
    body = json.dumps({"error": {"message": message, "type": type, "param": None, "code": code}}).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class ApiKeyGuard:
    """Every HTTP request but OPEN_PATHS (and CORS preflights, answered further out) must carry
    `Authorization: Bearer <key>`; 401 otherwise. The key is compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key:
            raise ValueError("the API key must not be empty")
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        if not hmac.compare_digest(given, self._expected):
            message = ("this server needs an API key: send 'Authorization: Bearer <key>'" if not given
                       else "the API key is not valid")
            await send_error(send, 401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuses request bodies over `max_bytes` with 413: at once when Content-Length says so, else
    (a chunked body) once that many bytes arrived; the body is then read no further."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"the body limit must be >= 1 byte, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
                break
        if length is not None:
            if length > self.max_bytes:
                await self._refuse(send, length)
                return
            await self.app(scope, receive, send)
            return
        # No length given: read the body here, up to the limit, and hand it on as received.
        messages: list[Message] = []
        n_bytes = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            n_bytes += len(message.get("body", b""))
            if n_bytes > self.max_bytes:
                await self._refuse(send, None)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, length: int | None) -> None:
        size = f"{length} bytes" if length is not None else "more bytes"
        await send_error(send, 413, f"the request body is too large ({size}; this server takes at most "
                                    f"{self.max_bytes}, --max-body-bytes)", code="request_too_large")

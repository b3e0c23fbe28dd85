"""Load check of `pyspec serve`: --clients concurrent clients each send one chat request at once
against a running server (started with --max-queue N). Counts answers by status: the excess over
the queue should get 503 with Retry-After, the rest 200, and no client may wait past --timeout
(a hang). Prints a JSON summary.

    pyspec serve --target qwen2.5-coder-1.5b-instruct --max-queue 16 &
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --clients 200 --max-tokens 32
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from typing import Any

import httpx


def run_load(url: str, clients: int, max_tokens: int = 16, timeout: float = 300.0, api_key: str | None = None,
             stream: bool = False) -> dict[str, Any]:
    """Sends `clients` requests at once; returns counts by status ("hung" for those past
    `timeout`), whether every 503 carried Retry-After, and the slowest answer in seconds."""
    statuses: Counter[str] = Counter()
    retry_after_missing = 0
    slowest = 0.0
    lock = threading.Lock()
    start = threading.Barrier(clients)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def one(i: int) -> None:
        nonlocal retry_after_missing, slowest
        body = {"model": "any", "messages": [{"role": "user", "content": f"Write function number {i}."}],
                "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        start.wait()
        t0 = time.monotonic()
        try:
            with httpx.stream("POST", url.rstrip("/") + "/v1/chat/completions", json=body, headers=headers,
                              timeout=httpx.Timeout(timeout)) as r:
                r.read()
                status = str(r.status_code)
                missing = r.status_code == 503 and "retry-after" not in r.headers
        except httpx.TimeoutException:
            status, missing = "hung", False
        except httpx.HTTPError as exc:
            status, missing = type(exc).__name__, False
        with lock:
            statuses[status] += 1
            retry_after_missing += missing
            slowest = max(slowest, time.monotonic() - t0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"clients": clients, "statuses": dict(statuses), "retry_after_missing": retry_after_missing,
            "slowest_s": round(slowest, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a client waits before it counts as hung")
    p.add_argument("--api-key", default=None)
    p.add_argument("--stream", action="store_true")
    args = p.parse_args(argv)
    summary = run_load(args.url, args.clients, args.max_tokens, args.timeout, args.api_key, args.stream)
    print(json.dumps(summary, indent=2))
    ok = "hung" not in summary["statuses"] and summary["retry_after_missing"] == 0 and \
        set(summary["statuses"]) <= {"200", "503"}
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

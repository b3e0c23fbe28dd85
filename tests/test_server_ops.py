"""`pyspec serve` operations: API key, CORS, body limit, bounded queue (503 + Retry-After),
default max_tokens, SSE keep-alive while queued, shutdown that ends streams with an error event
and saves before it closes the distiller, per-request random streams, internal errors as 500,
the queue's close, the tokenizer off the GIL. Real server processes on the tiny models."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from server_process import ServerProcess

import pyspec
from pyspec.errors import InvalidArgumentError

GREEDY = {"temperature": 0.0}
MESSAGES = [{"role": "user", "content": "Count forever."}]
REPO = Path(__file__).resolve().parents[1]


def _client(proc: ServerProcess, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.base_url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_api_key_cors_and_body_limit(tiny_target: str, tmp_path: Path) -> None:
    proc = ServerProcess("--target", tiny_target, "--model-name", "tiny", "--n-ctx", "512", "--threads", "1",
                         "--api-key", "s3cret", "--cors-origin", "https://app.example", "--max-body-bytes", "4000",
                         "--max-tokens-default", "7", log_path=tmp_path / "ops.log")
    try:
        base = proc.base_url
        assert httpx.get(base + "/health").status_code == 200  # open for supervisors
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.get(base + "/v1/models", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", headers
        assert httpx.get(base + "/metrics").status_code == 401
        with pytest.raises(openai.AuthenticationError):
            _client(proc, "wrong").models.list()
        c = _client(proc, "s3cret")
        assert [m.id for m in c.models.list().data] == ["tiny"]
        # No max_tokens: the server's default (7) applies; the tiny model never ends on its own.
        r = c.completions.create(model="tiny", prompt="x = 1\n", **GREEDY)
        assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
        # CORS: a preflight from the allowed origin passes without the key; another origin gets no grant.
        pre = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization,content-type"}
        ok = httpx.options(base + "/v1/chat/completions", headers=pre)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        other = httpx.options(base + "/v1/chat/completions", headers={**pre, "Origin": "https://evil.example"})
        assert other.headers.get("access-control-allow-origin") is None
        # Bodies over the limit: 413, with Content-Length and chunked.
        big = {"model": "tiny", "prompt": "word " * 2000, "max_tokens": 1}
        auth = {"Authorization": "Bearer s3cret"}
        r = httpx.post(base + "/v1/completions", json=big, headers=auth)
        assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]["message"]
        payload = json.dumps(big).encode()
        chunked = httpx.post(base + "/v1/completions", headers={**auth, "Content-Type": "application/json"},
                             content=(payload[i:i + 1000] for i in range(0, len(payload), 1000)))
        assert chunked.status_code == 413
        assert c.completions.create(model="tiny", prompt="ok", max_tokens=2).choices[0].text is not None
    finally:
        assert proc.stop() == 0, proc.log()


def _open_stream(base: str, max_tokens: int) -> tuple[httpx.Client, "httpx.Response"]:
    http = httpx.Client(timeout=120)
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "method": "none"}
    response = http.send(http.build_request("POST", base + "/v1/chat/completions", json=body), stream=True)
    return http, response


def test_bounded_queue_keepalive_and_a_stream_cut_by_shutdown(tiny_target: str, tmp_path: Path) -> None:
    # A context long enough that the running generation outlasts the rest of the test on a fast
    # machine (2,000 tokens of the tiny model took about a second on a Zen 4).
    proc = ServerProcess("--target", tiny_target, "--model-name", "tiny", "--n-ctx", "8192", "--threads", "1",
                         "--max-queue", "1", "--sse-keepalive", "0.2", log_path=tmp_path / "queue.log")
    try:
        base = proc.base_url
        http1, running = _open_stream(base, 8000)
        lines = running.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # it runs
        http2, waiting = _open_stream(base, 4)  # waits behind it: keep-alive comments meanwhile
        deadline = time.monotonic() + 30
        while proc.metric("pyspec_queue_depth") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = httpx.post(base + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 2})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "server_busy"
        waiting_lines = waiting.iter_lines()
        first_two = [next(waiting_lines) for _ in range(4)]
        assert ": keep-alive" in first_two, first_two
        # SIGINT while both run/wait: the running stream ends with an error event and [DONE].
        proc.process.send_signal(signal.SIGINT)
        rest = [line for line in lines if line.startswith("data:")]
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2].removeprefix("data: "))
        assert error["error"]["code"] == "server_shutting_down"
        waited = [line for line in waiting_lines if line.startswith("data:")]
        assert waited[-1] == "data: [DONE]" and "server_shutting_down" in waited[-2]
        proc.process.wait(30)
        for http in (http1, http2):
            http.close()
    finally:
        assert proc.stop() == 0, proc.log()


def test_load_script_counts_200_and_503_and_nothing_hangs(tiny_target: str, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("serve_load", REPO / "benchmarks" / "serve_load.py")
    assert spec is not None and spec.loader is not None
    serve_load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve_load)
    proc = ServerProcess("--target", tiny_target, "--n-ctx", "1024", "--threads", "1", "--max-queue", "2",
                         "--method", "none", log_path=tmp_path / "load.log")
    try:
        summary = serve_load.run_load(proc.base_url, clients=16, max_tokens=200, timeout=120)
    finally:
        assert proc.stop() == 0, proc.log()
    statuses = summary["statuses"]
    assert set(statuses) <= {"200", "503"}, summary
    assert sum(statuses.values()) == 16 and statuses.get("503", 0) >= 1 and statuses.get("200", 0) >= 1
    assert summary["retry_after_missing"] == 0


def test_a_seeded_request_leaves_the_shared_stream(tiny_target: str) -> None:
    """Two engines seeded alike: a seeded request on one of them does not change what the next
    unseeded request draws."""
    sampled = dict(max_tokens=24, temperature=1.0, method="none")
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=1, seed=3) as a, \
            pyspec.Engine(tiny_target, n_ctx=256, n_threads=1, seed=3) as b:
        plain = a.generate("x = ", **sampled).tokens
        seeded = b.generate("x = ", seed=99, **sampled).tokens
        after = b.generate("x = ", **sampled).tokens
        assert after == plain
        assert b.generate("x = ", seed=99, **sampled).tokens == seeded


def test_internal_errors_are_500_and_argument_errors_400() -> None:
    from pyspec.server.serving import from_engine_error

    assert from_engine_error(InvalidArgumentError("max_tokens out of range")).status == 400
    assert from_engine_error(ValueError("a bug")).status == 500
    assert from_engine_error(TypeError("a bug")).status == 500


class _SlowEngine:
    """Stands in for the engine in the queue tests: a generation that runs until cancelled."""

    def generate(self, tokens, config, on_chunk):  # noqa: ANN001
        while on_chunk(None):
            time.sleep(0.005)
        return "cancelled"


def test_queue_close_resolves_every_job_and_submit_after_close_fails() -> None:
    from pyspec.server.queue import GenerationQueue, Job, QueueClosed, QueueFull

    async def run() -> None:
        loop = asyncio.get_running_loop()
        def job() -> Job:
            return Job(tokens=[1], config=None, loop=loop, future=loop.create_future())  # type: ignore[arg-type]

        full = GenerationQueue(_SlowEngine(), max_waiting=2)  # type: ignore[arg-type]
        first = full.submit(job())
        while full.depth and full._running is not first:  # the worker has taken it
            await asyncio.sleep(0.001)
        full.submit(job())
        full.submit(job())
        with pytest.raises(QueueFull):
            full.submit(job())
        assert await asyncio.to_thread(full.close, 5.0)
        for _ in range(20):  # the worker picks a job up while close() runs: never left uncancelled
            q = GenerationQueue(_SlowEngine())  # type: ignore[arg-type]
            jobs = [q.submit(job()) for _ in range(3)]
            assert await asyncio.to_thread(q.close, 5.0)
            await asyncio.wait_for(asyncio.gather(*(j.future for j in jobs), return_exceptions=True), 5)
            with pytest.raises(QueueClosed):
                q.submit(job())

    asyncio.run(run())


def test_shutdown_saves_before_a_stuck_distiller_and_keeps_its_deadline(tiny_target: str, tmp_path: Path) -> None:
    from pyspec.server.app import ServerSettings, _start, _stop

    settings = ServerSettings(target=tiny_target, n_ctx=256, n_threads=1, pool_file=str(tmp_path / "pool.bin"),
                              stats_file=str(tmp_path / "stats.json"), shutdown_timeout_s=3.0)
    state = _start(settings, None)
    state.engine.generate("for i in range(3):\n    print(i)\n", max_tokens=8, method="lookup", temperature=0)
    state.metrics.add_generation(state.engine.generate("x = 1\n", max_tokens=4, method="auto", temperature=0), 0.0)

    release = threading.Event()

    class StuckDistiller:  # an update that would take a minute
        def close(self, timeout: float | None = None) -> None:
            release.wait(60)

    state.online = StuckDistiller()  # type: ignore[assignment]
    t0 = time.monotonic()
    _stop(state)
    took = time.monotonic() - t0
    release.set()
    assert took < 5.0
    assert (tmp_path / "pool.bin").exists() and (tmp_path / "stats.json").exists()


def test_sigterm_during_a_real_online_update_saves_within_the_deadline(tiny_target: str, tiny_drafts: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """A real server distilling its draft gets SIGTERM while an update runs, as a supervisor sends
    it; the supervisor kills it if it is still alive past --shutdown-timeout. The pool and the
    statistics must be on disk, and the server must have exited by itself before the kill."""
    deadline_s = 6.0
    pool, stats = tmp_path / "pool.bin", tmp_path / "stats.json"
    proc = ServerProcess("--target", tiny_target, "--draft", tiny_drafts["perturbed"], "--n-ctx", "512",
                         "--threads", "1", "--method", "ouroboros", "--online", "--online-interval", "2",
                         "--online-work-dir", str(tmp_path / "drafts"), "--pool-file", str(pool),
                         "--stats-file", str(stats), "--shutdown-timeout", str(deadline_s), log_path=tmp_path / "s.log")
    try:
        c = _client(proc)
        started = time.monotonic()
        i = 0
        while proc.metric("pyspec_online_updating") < 1:
            assert time.monotonic() - started < 120, "no online update started\n" + proc.log()
            c.completions.create(model="tiny", prompt=f"def f{i}(x):\n    return x * {i}\n", max_tokens=24, **GREEDY)
            i += 1
        t0 = time.monotonic()
        proc.process.send_signal(signal.SIGTERM)
        try:
            proc.process.wait(deadline_s + 2.0)
            killed = False
        except subprocess.TimeoutExpired:  # still alive: what a supervisor's SIGKILL would meet
            proc.process.kill()
            proc.process.wait()
            killed = True
        took = time.monotonic() - t0
    finally:
        proc.stop()
    assert not killed and took <= deadline_s + 1.0, f"shutdown took {took:.1f} s\n" + proc.log()
    assert pool.stat().st_size > 0 and json.loads(stats.read_text(encoding="utf-8")), proc.log()


def test_tokenizing_releases_the_gil(tiny_target: str) -> None:
    """A long tokenization on another thread leaves this one running (the event loop's case)."""
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=1) as engine:
        text = "def f(x):\n    return x * 2\n" * 60000
        t0 = time.monotonic()
        engine.tokenize(text)
        alone = time.monotonic() - t0
        gaps: list[float] = []
        worker = threading.Thread(target=engine.tokenize, args=(text,))
        worker.start()
        last = time.monotonic()
        while worker.is_alive():
            time.sleep(0.001)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        worker.join()
    assert alone > 0.05, "the text tokenizes too fast to tell"
    assert max(gaps) < alone / 2, (max(gaps), alone)

"""One engine, one generation at a time: requests wait in arrival order (FIFO) and a single
worker thread runs them. The event loop never blocks on the engine, so /health and /metrics
answer while a generation runs; a request whose client went away is cancelled at its next piece
of text (or skipped if it is still waiting)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import GenerationConfig
from ..engine import Engine
from ..results import GenerationResult, StreamChunk

log = logging.getLogger("pyspec.server")

STREAM_END = object()  # put on a streaming job's chunk queue after its last chunk


class JobCancelled(Exception):
    """A job was cancelled while it waited (its client went away or the server is stopping)."""


@dataclass(eq=False)
class Job:
    """One generation request. `future` resolves on the event loop with the GenerationResult
    (finish_reason "cancelled" when cancelled while running), JobCancelled (cancelled while
    waiting) or the engine's error;
    streaming jobs also receive their StreamChunks, then STREAM_END, on `chunks`."""

    tokens: list[int]
    config: GenerationConfig
    loop: asyncio.AbstractEventLoop
    future: "asyncio.Future[GenerationResult]"
    chunks: "asyncio.Queue[object] | None" = None
    endpoint: str = ""
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.monotonic)

    def cancel(self) -> None:
        """Stops the generation at its next piece of text (idempotent, any thread)."""
        self.cancelled.set()

    def _call_on_loop(self, fn: Callable[..., object], *args: object) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is gone (shutdown): nobody waits for this job
            pass

    def _push(self, chunk: StreamChunk) -> bool:
        if self.chunks is not None:
            self._call_on_loop(self.chunks.put_nowait, chunk)
        return not self.cancelled.is_set()

    def _finish(self, result: GenerationResult | None, error: BaseException | None) -> None:
        if self.chunks is not None:
            self._call_on_loop(self.chunks.put_nowait, STREAM_END)

        def resolve() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)  # type: ignore[arg-type]

        self._call_on_loop(resolve)


# Called on the worker thread after every job: (job, result or None, error or None, seconds
# from submission to the start of its generation).
JobObserver = Callable[[Job, "GenerationResult | None", "BaseException | None", float], None]


class GenerationQueue:
    """The FIFO of generation jobs and the worker thread that runs them on `engine`."""

    def __init__(self, engine: Engine, observers: list[JobObserver] | None = None) -> None:
        self.engine = engine
        self._observers = list(observers or [])
        self._jobs: "queue.Queue[Job | None]" = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running: Job | None = None
        self._thread = threading.Thread(target=self._work, name="pyspec-generate", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting plus the one running."""
        with self._lock:
            return self._waiting + (self._running is not None)

    def submit(self, job: Job) -> Job:
        with self._lock:
            self._waiting += 1
        self._jobs.put(job)
        return job

    def close(self, timeout: float = 30.0) -> None:
        """Cancels the running job and every waiting one, then stops the worker."""
        with self._lock:
            running = self._running
        if running is not None:
            running.cancel()
        pending: list[Job] = []
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                pending.append(item)
        for job in pending:
            job.cancel()
            self._jobs.put(job)  # the worker resolves it as cancelled
        self._jobs.put(None)
        self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self._running = job
            waited = time.monotonic() - job.submitted_at
            result: GenerationResult | None = None
            error: BaseException | None = None
            try:
                if job.cancelled.is_set():
                    error = JobCancelled("cancelled before it started")
                else:
                    result = self.engine.generate(job.tokens, job.config, on_chunk=job._push)
            except BaseException as exc:  # handed to the request's handler
                error = exc
            finally:
                with self._lock:
                    self._running = None
            job._finish(result, error)
            for observe in self._observers:
                try:
                    observe(job, result, error, waited)
                except Exception:  # an observer's bug must not stop serving
                    log.exception("job observer failed")

"""One engine, one generation at a time: requests wait in arrival order (FIFO) and a single
worker thread runs them. The event loop never blocks on the engine, so /health and /metrics
answer while a generation runs; a request whose client went away is cancelled at its next piece
of text (or skipped if it is still waiting). At most `max_waiting` jobs wait (QueueFull beyond);
after close() every job is resolved and submit() raises QueueClosed."""

from __future__ import annotations

import asyncio
import collections
import logging
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


class QueueFull(Exception):
    """submit() found `max_waiting` jobs already waiting."""


class QueueClosed(Exception):
    """submit() after close(): the server is stopping."""


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
    """The FIFO of generation jobs and the worker thread that runs them on `engine`.
    max_waiting: jobs that may wait besides the running one (None: no limit)."""

    def __init__(self, engine: Engine, observers: list[JobObserver] | None = None,
                 max_waiting: int | None = None) -> None:
        if max_waiting is not None and max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1 (or None), got {max_waiting}")
        self.engine = engine
        self.max_waiting = max_waiting
        self._observers = list(observers or [])
        self._jobs: "collections.deque[Job]" = collections.deque()
        self._changed = threading.Condition()  # guards _jobs, _running, _closed
        self._running: Job | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="pyspec-generate", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting plus the one running."""
        with self._changed:
            return len(self._jobs) + (self._running is not None)

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, job: Job) -> Job:
        """Queues `job`; QueueFull when max_waiting jobs wait already, QueueClosed after close()."""
        with self._changed:
            if self._closed:
                raise QueueClosed("the server is shutting down")
            if self.max_waiting is not None and len(self._jobs) >= self.max_waiting:
                raise QueueFull(f"{len(self._jobs)} requests are waiting already (the limit)")
            self._jobs.append(job)
            self._changed.notify_all()
        return job

    def cancel_all(self) -> None:
        """Refuses new jobs and cancels the running one and every waiting one (the worker resolves
        them: waiting ones with JobCancelled). Returns at once."""
        with self._changed:
            self._closed = True
            for job in self._jobs:
                job.cancel()
            if self._running is not None:
                self._running.cancel()
            self._changed.notify_all()

    def close(self, timeout: float = 30.0) -> bool:
        """cancel_all(), then waits up to `timeout` seconds for the worker to resolve every job and
        stop. False when it is still running then (a generation that does not stop)."""
        self.cancel_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("the generation worker did not stop within %.1f s", timeout)
            return False
        return True

    def _next(self) -> Job | None:
        """The next job, marked running (cancelled when the queue is closed); None once closed and empty."""
        with self._changed:
            while not self._jobs and not self._closed:
                self._changed.wait()
            if not self._jobs:
                return None
            job = self._jobs.popleft()
            self._running = job
            if self._closed:  # closed between its submission and now: never left uncancelled
                job.cancel()
            return job

    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
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
                with self._changed:
                    self._running = None
            job._finish(result, error)
            for observe in self._observers:
                try:
                    observe(job, result, error, waited)
                except Exception:  # an observer's bug must not stop serving
                    log.exception("job observer failed")

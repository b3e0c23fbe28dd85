"""Training the draft in a process of its own, so that serving never pays for PyTorch.

    from pyspec.online.worker import TrainerProcess     # imports neither torch nor the model
    trainer = TrainerProcess("draft.gguf", DistillConfig(lr=1e-4), work_dir="drafts")
    future = trainer.update(samples, rehearsed=older_samples)   # returns at once
    result = future.result()              # UpdateResult: result.path is the new GGUF
    engine.reload_draft(result.path)      # the serving process swaps it in
    trainer.reset(engine.draft_path)      # only after a reload failed: back to the serving weights
    trainer.close()

The training process owns the PyTorch student (float32 master weights, kept between updates),
its AdamW state and the export template: for the 0.5B Qwen draft that is ~8 GB (weights,
gradients and two moments at 4 bytes per parameter), none of it in the serving process, which
sends TraceSamples (numpy arrays) and gets file paths back. Requests run one at a time, in the
order sent; each returns a `concurrent.futures.Future`. What the process trains is a
`trainer.Distillable` built by `factory` ("module:name" of a callable (path, config) ->
Distillable; default the GGUF draft model), so other drafters (a draft head) can use it too.

Failures come back typed: `TrainerError` ("Type: message" of the exception in the training
process: a training, export or load error; the process keeps running and keeps its weights as
they were after the last successful step) and `TrainerExitedError` when the process is gone
(killed, crashed, closed); every pending and later request then fails with it. Log records of
the training process (loggers under "pyspec") are re-emitted in this process under their own
names.

The process is started with this interpreter and this process's module search path, in a
session of its own (a terminal's Ctrl-C reaches the server, which then closes the trainer). It
exits when close() is called or when this process goes away (its end of the socket closes).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .buffer import TraceSample
from .config import DistillConfig, TrainReport

log = logging.getLogger("pyspec.online")

DEFAULT_FACTORY = "pyspec.online.trainer:GGUFDraft"
_PATH_ENV = "PYSPEC_TRAINER_SYS_PATH"


class TrainerError(SpecError, RuntimeError):
    """A request failed in the training process; the message is the exception's "Type: message"."""


class TrainerExitedError(TrainerError):
    """The training process is gone (closed, killed or crashed); it serves no more requests."""


@dataclass(frozen=True)
class UpdateResult:
    path: str            # the exported drafter, ready for Engine.reload_draft
    update: int          # this trainer's successful updates so far, this one included
    report: TrainReport  # training numbers (loss before / after, positions, seconds, lr, export time)


class TrainerProcess:
    """Client of one training process (module docstring).

    draft: the file the student starts from (a GGUF path or registry name for the default
    factory). config: DistillConfig (loss, optimiser, schedule, train_threads, export_dtype).
    work_dir: where exported files are written as <name>-<n>.gguf (default: a new temporary
    directory, removed by close()); the trainer never deletes them otherwise.
    """

    def __init__(self, draft: str | os.PathLike[str], config: DistillConfig | None = None,
                 work_dir: str | os.PathLike[str] | None = None, *, name: str = "draft",
                 factory: str = DEFAULT_FACTORY) -> None:
        self.config = config or DistillConfig()
        self.name = name
        self._own_dir = tempfile.TemporaryDirectory(prefix="pyspec-trainer-") if work_dir is None else None
        self.work_dir = Path(self._own_dir.name if self._own_dir is not None else work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        path = os.fspath(draft)
        if factory == DEFAULT_FACTORY and not os.path.exists(path):
            from ..models import resolve_model  # a registry name, fetched as Engine does

            path = resolve_model(path)
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Any]] = {}
        self._lock = threading.Lock()  # pending, send, exit state
        self._exit: TrainerExitedError | None = None

        ours, theirs = socket.socketpair()
        env = dict(os.environ, **{_PATH_ENV: json.dumps(sys.path)})
        bootstrap = (f"import json, os, sys; sys.path[:] = json.loads(os.environ[{_PATH_ENV!r}]); "
                     "from pyspec.online.worker import _child_main; sys.exit(_child_main(int(sys.argv[1])))")
        try:
            self._process = subprocess.Popen([sys.executable, "-c", bootstrap, str(theirs.fileno())],
                                             pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self.ready: Future[Any] = Future()  # done once the student is loaded (or failed to)
        self._pending[0] = self.ready
        self._send(("init", 0, {"path": path, "config": self.config, "work_dir": str(self.work_dir),
                                "name": name, "factory": factory}))
        self._reader = threading.Thread(target=self._read, name=f"pyspec-trainer-{name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._exit is None and self._process.poll() is None

    def update(self, samples: Sequence[TraceSample], rehearsed: Sequence[TraceSample] = ()) -> "Future[UpdateResult]":
        """Trains on `samples` (and `rehearsed`, earlier samples replayed with them), exports,
        and resolves to an UpdateResult; TrainerError when there is nothing to train on."""
        return self._request("update", (list(samples), list(rehearsed)))

    def reset(self, path: str | os.PathLike[str]) -> "Future[None]":
        """Reloads the student from `path` with a fresh optimizer (after an update that did not
        reach the engine: training continues from what serves)."""
        return self._request("reset", os.fspath(path))

    def close(self, timeout: float | None = 60.0) -> None:
        """Asks the process to exit after its current request, waits up to `timeout` seconds,
        then kills it. Pending requests fail with TrainerExitedError. Idempotent."""
        with self._lock:
            running = self._exit is None
        if running:
            try:
                self._send(("close", next(self._ids), None))
            except TrainerExitedError:
                pass
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("training process %d did not exit within %s s; killing it", self.pid, timeout)
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=10)
        self._conn.close()
        self._fail_pending(TrainerExitedError(f"training process {self.pid} was closed"))
        if self._own_dir is not None:
            self._own_dir.cleanup()

    def __enter__(self) -> "TrainerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------

    def _request(self, kind: str, payload: Any) -> Future[Any]:
        future: Future[Any] = Future()
        request_id = next(self._ids)
        with self._lock:
            if self._exit is not None:
                future.set_exception(self._exit)
                return future
            self._pending[request_id] = future
        self._send((kind, request_id, payload))
        return future

    def _send(self, message: tuple[str, int, Any]) -> None:
        with self._lock:
            if self._exit is not None:
                raise self._exit
            try:
                self._conn.send(message)
            except OSError as exc:
                self._exit = TrainerExitedError(f"training process {self.pid} is gone: {exc}")
                raise self._exit from exc

    def _read(self) -> None:
        while True:
            try:
                kind, request_id, payload = self._conn.recv()
            except (EOFError, OSError):
                break
            if kind == "log":
                level, name, text = payload
                logging.getLogger(name).log(level, "[trainer %d] %s", self.pid, text)
                continue
            with self._lock:
                future = self._pending.pop(request_id, None)
            if future is None:
                continue
            if kind == "ok":
                future.set_result(payload)
            else:
                future.set_exception(TrainerError(payload))
        code = self._process.wait()
        self._fail_pending(TrainerExitedError(f"training process {self.pid} exited (code {code})"))

    def _fail_pending(self, error: TrainerExitedError) -> None:
        with self._lock:
            self._exit = self._exit or error
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self._exit)


# -- the training process --------------------------------------------------------------------


class _PipeLogHandler(logging.Handler):
    def __init__(self, send: Any) -> None:
        super().__init__(logging.INFO)
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._send(("log", 0, (record.levelno, record.name, record.getMessage())))
        except Exception:  # the parent is gone: nothing to tell
            pass


def _load_factory(spec: str) -> Any:
    import importlib

    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _child_main(fd: int) -> int:
    """The training process: one DraftTrainer, serving requests from the socket `fd`."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the serving process decides when training ends
    os.dup2(2, 1)  # stdout is not ours to write: a stray print goes to stderr
    conn = Connection(fd)
    send_lock = threading.Lock()

    def send(message: tuple[str, int, Any]) -> None:
        with send_lock:
            conn.send(message)

    root = logging.getLogger("pyspec")
    root.addHandler(_PipeLogHandler(send))
    root.setLevel(logging.INFO)
    root.propagate = False
    try:
        _, request_id, init = conn.recv()
    except EOFError:
        return 0
    try:
        from .trainer import DraftTrainer

        trainer = DraftTrainer(init["path"], init["config"], init["work_dir"], name=init["name"],
                               factory=_load_factory(init["factory"]))
    except Exception as exc:
        send(("error", request_id, f"{type(exc).__name__}: {exc}"))
        return 1
    send(("ok", request_id, None))
    while True:
        try:
            kind, request_id, payload = conn.recv()
        except EOFError:
            return 0
        if kind == "close":
            return 0
        try:
            if kind == "update":
                samples, rehearsed = payload
                path, report = trainer.update(samples, rehearsed)
                result: Any = UpdateResult(path=str(path), update=trainer.n_updates, report=report)
            elif kind == "reset":
                trainer.reset(payload)
                result = None
            else:
                raise ValueError(f"unknown request {kind!r}")
        except Exception as exc:  # reported to the caller; the process serves on
            logging.getLogger("pyspec.online").debug("request %s failed", kind, exc_info=True)
            send(("error", request_id, f"{type(exc).__name__}: {exc}"))
            continue
        send(("ok", request_id, result))

"""Engine state the server keeps in files across restarts: the phrase pool (--pool-file) and
method auto's acceptance statistics (--stats-file). Each is loaded at start (a file that cannot be
read back is reported and renamed aside, and the server starts without it: never a failed
start), saved atomically every `interval` seconds when it changed, and once more at shutdown."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from ..engine import Engine
from ..errors import PoolFileError, StatsFileError, VocabMismatchError
from .metrics import ServerMetrics

log = logging.getLogger("pyspec.server")

# Pool counters that move whenever its content or its eviction order changes.
_CHANGE_KEYS = ("size", "n_inserted", "n_refreshed", "n_merged", "n_evicted", "n_loaded", "n_uses",
                "n_phrases_accepted")


def set_aside(path: Path, what: str, error: Exception, afterwards: str) -> Path | None:
    """Moves a file the server cannot use at start to PATH.unreadable-<time>, so that nothing is
    lost when the server later saves over PATH, and logs it: `what` names the file, `afterwards`
    what the server does instead. Returns where it went, or None when it could not be moved."""
    aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, aside)
    except OSError as move_error:
        log.error("%s %s cannot be used (%s) nor moved aside (%s); %s, and it will be overwritten", what, path,
                  error, move_error, afterwards)
        return None
    log.error("%s %s cannot be used (%s); moved it to %s, %s", what, path, error, aside, afterwards)
    return aside


class FileKeeper:
    """One piece of engine state kept in a file. Subclasses say what (`what`, the metrics'
    `counter` prefix: <counter>_saves, <counter>_save_errors, <counter>_file_errors), how to read
    and write it, and what changes when it does (`_state`)."""

    what = ""
    counter = ""
    without = ""  # what the server does when the file cannot be used
    errors: tuple[type[Exception], ...] = (OSError,)

    def __init__(self, engine: Engine, path: str | os.PathLike[str], interval_s: float,
                 metrics: ServerMetrics) -> None:
        if interval_s <= 0:
            raise ValueError(f"the {self.what} save interval must be > 0 seconds, got {interval_s}")
        self.engine = engine
        self.path = Path(path)
        self.interval_s = interval_s
        self.metrics = metrics
        self.set_aside: Path | None = None  # where an unreadable file went at start
        self._saved_state: Any = None
        self._stop = threading.Event()
        self._save_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def load(self) -> None:
        """Reads the file if there is one; an unreadable file is moved aside."""
        if not self.path.exists():
            log.info("%s %s does not exist yet: %s", self.what, self.path, self.without)
            self._saved_state = self._state()  # nothing to write before something changes
            return
        try:
            loaded = self._load()
        except self.errors as exc:
            self.metrics.bump(f"{self.counter}_file_errors")
            self.set_aside = set_aside(self.path, self.what, exc, self.without)
            return
        self._saved_state = self._state()
        log.info("loaded %s from %s", loaded, self.path)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"pyspec-{self.counter}-saver", daemon=True)
        self._thread.start()

    def save(self) -> bool:
        """Saves when the state changed since the last save; False on failure (logged)."""
        with self._save_lock:
            state = self._state()
            if state == self._saved_state:
                return True
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._save()  # temp file + rename: never a half-written file
            except self.errors as exc:
                self.metrics.bump(f"{self.counter}_save_errors")
                log.error("could not save the %s %s: %s", self.what, self.path, exc)
                return False
            self._saved_state = state
            self.metrics.bump(f"{self.counter}_saves")
            return True

    def close(self) -> None:
        """Stops the periodic saves and saves a last time."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.save()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.save()

    def _load(self) -> str:
        raise NotImplementedError

    def _save(self) -> None:
        raise NotImplementedError

    def _state(self) -> Any:
        raise NotImplementedError


class PoolKeeper(FileKeeper):
    """--pool-file: the phrase pool (its own lock: saved while generations go on)."""

    what, counter, without = "pool file", "pool", "started with an empty pool"
    errors = (PoolFileError, VocabMismatchError, OSError)

    def _load(self) -> str:
        self.engine.load_pool(self.path)
        return f"{self.engine.pool_stats()['size']} phrases"

    def _save(self) -> None:
        self.engine.save_pool(self.path)

    def _state(self) -> tuple[int, ...]:
        stats = self.engine.pool_stats()
        return tuple(int(stats[k]) for k in _CHANGE_KEYS)


class StatsKeeper(FileKeeper):
    """--stats-file: method auto's acceptance statistics. Engine.save_stats waits for a running
    generation to end (the statistics move while one runs); they change only through
    generations, so the server's generation counters tell when a save is due."""

    what, counter, without = "statistics file", "stats", "auto starts afresh"
    errors = (StatsFileError, OSError)

    def _load(self) -> str:
        self.engine.load_stats(self.path)
        return "auto's acceptance statistics"

    def _save(self) -> None:
        self.engine.save_stats(self.path)

    def _state(self) -> tuple[int, int]:
        return self.metrics.generated_tokens, self.metrics.target_calls

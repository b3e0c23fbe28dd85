"""--pool-file: the engine's phrase pool survives restarts. Loaded at start (a file that cannot be
read back is reported and renamed aside, and the server starts with an empty pool: never a failed
start), saved atomically every `interval` seconds when it changed, and once more at shutdown."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from ..engine import Engine
from ..errors import PoolFileError, VocabMismatchError
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


class PoolKeeper:
    def __init__(self, engine: Engine, path: str | os.PathLike[str], interval_s: float,
                 metrics: ServerMetrics) -> None:
        if interval_s <= 0:
            raise ValueError(f"the pool save interval must be > 0 seconds, got {interval_s}")
        self.engine = engine
        self.path = Path(path)
        self.interval_s = interval_s
        self.metrics = metrics
        self.set_aside: Path | None = None  # where an unreadable file went at start
        self._saved_state: tuple[int, ...] | None = None
        self._stop = threading.Event()
        self._save_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def load(self) -> None:
        """Fills the pool from the file if there is one; an unreadable file is moved aside."""
        if not self.path.exists():
            log.info("pool file %s does not exist yet: starting with an empty pool", self.path)
            return
        try:
            self.engine.load_pool(self.path)
        except (PoolFileError, VocabMismatchError, OSError) as exc:
            self.metrics.bump("pool_file_errors")
            self.set_aside = set_aside(self.path, "pool file", exc, "started with an empty pool")
            return
        self._saved_state = self._state()
        log.info("loaded %d phrases from %s", self.engine.pool_stats()["size"], self.path)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pyspec-pool-saver", daemon=True)
        self._thread.start()

    def save(self, *, force: bool = False) -> bool:
        """Saves when the pool changed since the last save (or force); False on failure (logged)."""
        with self._save_lock:
            state = self._state()
            if not force and state == self._saved_state:
                return True
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.engine.save_pool(self.path)  # temp file + rename: never a half-written file
            except (PoolFileError, OSError) as exc:
                self.metrics.bump("pool_save_errors")
                log.error("could not save the phrase pool to %s: %s", self.path, exc)
                return False
            self._saved_state = state
            self.metrics.bump("pool_saves")
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

    def _state(self) -> tuple[int, ...]:
        stats = self.engine.pool_stats()
        return tuple(int(stats[k]) for k in _CHANGE_KEYS)

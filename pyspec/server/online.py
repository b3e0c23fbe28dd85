"""--online: the draft learns from the traffic it serves (OSD). Every finished generation goes to
an OnlineDistiller (pyspec.online), which buffers the target's corrections, has its training
process (pyspec.online.worker.TrainerProcess: PyTorch, the draft's weights and optimizer state
live there, not in the server) train the draft, and hot-reloads the file it writes between two
requests (Engine.reload_draft). The server process never imports torch.

What this module assumes of pyspec.online, and nothing more: OnlineDistiller(engine, config,
update_interval=, buffer_limit=, work_dir=) with observe(result), config.top_k, stats() -> an object with
draft_version, n_updates, n_failed_updates, updating, buffer_positions, acceptance and
last_error, and close(); DistillConfig(lr=, train_threads=, train_vocab=, train_blocks=). Generations are handed over through
a bounded queue to a thread of their own, so the generation worker never waits on the
distiller (if the distiller falls behind, the oldest waiting results are dropped and counted).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..engine import Engine
from ..online.config import DistillConfig  # no torch: plain settings
from ..results import GenerationResult

log = logging.getLogger("pyspec.server")


@dataclass(frozen=True)
class OnlineSettings:
    update_interval: int = 32        # requests between draft updates (OSD's I)
    buffer_limit: int = 4096         # training positions kept (and that trigger an update early)
    lr: float = 1e-4
    train_threads: int = 1
    train_vocab: bool = DistillConfig.train_vocab  # False: the draft's vocabulary matrices stay frozen
    train_blocks: int = DistillConfig.train_blocks  # N > 0: only the draft's last N blocks are trained
    work_dir: str | None = None      # where trained drafts are written (default: a temporary directory)
    backlog: int = 256               # finished generations waiting for the distiller before drops

    def distill_config(self) -> DistillConfig:
        """The training settings these carry."""
        return DistillConfig(lr=self.lr, train_threads=self.train_threads, train_vocab=self.train_vocab,
                             train_blocks=self.train_blocks)


class OnlineLoop:
    """Trains the draft model when the engine has one, else its draft head (HeadDistiller: the
    head's first step, from the target's hidden states of each served request)."""

    def __init__(self, engine: Engine, settings: OnlineSettings) -> None:
        if not engine.has_draft and engine.head_path is None:
            raise ValueError("--online trains the draft model or the draft head: start the server with --draft "
                             "or --head")
        if engine.has_draft:
            from ..online import OnlineDistiller as Distiller  # needs the train extra (PyTorch)
        else:
            from ..head.online import HeadDistiller as Distiller

        if settings.work_dir is not None:
            os.makedirs(settings.work_dir, exist_ok=True)
        self.distiller: Any = Distiller(
            engine,
            settings.distill_config(),
            update_interval=settings.update_interval, buffer_limit=settings.buffer_limit,
            work_dir=settings.work_dir,
        )
        self.n_dropped = 0
        self.n_observed = 0
        self._results: "queue.Queue[GenerationResult | None]" = queue.Queue(maxsize=settings.backlog)
        self._thread = threading.Thread(target=self._run, name="pyspec-online", daemon=True)
        self._thread.start()

    @property
    def trace_top_k(self) -> int:
        """The target's top-k each served generation records at its rejections: what the
        distiller learns from."""
        return int(self.distiller.config.top_k)

    def submit(self, result: GenerationResult) -> None:
        """Hands a finished generation to the distiller; never blocks."""
        if result.draft != self.distiller.draft:
            return  # another slot's generation: not this distiller's to learn from
        while True:
            try:
                self._results.put_nowait(result)
                return
            except queue.Full:
                try:
                    self._results.get_nowait()
                    self.n_dropped += 1
                except queue.Empty:
                    pass

    def close(self, timeout: float | None = None) -> None:
        """Stops observing (generations still waiting for the distiller are dropped), then closes
        the distiller, waiting at most `timeout` seconds for a running update (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:  # never blocks on a full backlog: drop what waits, then the end marker fits
            try:
                self._results.put_nowait(None)
                break
            except queue.Full:
                try:
                    self._results.get_nowait()
                    self.n_dropped += 1
                except queue.Empty:
                    pass
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.distiller.close(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def gauges(self) -> Iterable[tuple[str, str, str, float]]:
        s = self.distiller.stats()
        yield "pyspec_online_updates_total", "Draft updates that reached the engine.", "", s.n_updates
        yield "pyspec_online_failed_updates_total", "Draft updates that failed (the old draft kept serving).", "", \
            s.n_failed_updates
        yield "pyspec_online_updating", "1 while a draft update is running.", "", int(s.updating)
        yield "pyspec_online_buffer_positions", "Training positions waiting in the replay buffer.", "", \
            s.buffer_positions
        yield "pyspec_online_observed_total", "Generations given to the distiller.", "", self.n_observed
        yield "pyspec_online_dropped_total", "Generations dropped because the distiller fell behind.", "", \
            self.n_dropped
        if s.acceptance is not None:
            yield "pyspec_online_acceptance", "Draft acceptance over the distiller's recent window.", "", s.acceptance

    def _run(self) -> None:
        while True:
            result = self._results.get()
            if result is None:
                return
            try:
                self.distiller.observe(result)
                self.n_observed += 1
            except Exception:  # a distiller error must not stop serving
                log.exception("the online distiller could not take a generation")

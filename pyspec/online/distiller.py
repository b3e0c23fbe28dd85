"""Online speculative decoding (OSD, Liu et al., ICML 2024): the draft learns from the target's
corrections while the engine serves, and the improved draft is swapped in between requests.

    engine = pyspec.Engine(target, draft=draft, n_threads=1)
    distiller = OnlineDistiller(engine, DistillConfig(loss="fkl", train_threads=1), update_interval=8)
    for prompt in stream:
        result = distiller.generate(prompt, max_tokens=128, domain="code")
    distiller.close()          # waits for a running update, ends the training process
    print(distiller.stats())

The loop (OSD Algorithm 1, with the update moved off the serving path and out of its process):

1. every generation's trace becomes a TraceSample in the replay buffer (buffer.py): the token
   sequence plus the target's top-k (and the rejected draft token) at the rejected positions, or
   the target's top-k at all positions;
2. when `update_interval` requests have been observed since the last update started, or the
   buffer holds `buffer_limit` positions, a background thread snapshots the buffer, adds
   `config.rehearsal` times as many positions of earlier samples from the buffer's reservoir,
   and sends them to the training process (worker.py: a separate process that owns the PyTorch
   draft and its optimizer, keeps them between updates, and writes the new GGUF in
   `config.export_dtype`); then calls Engine.reload_draft on the file it returns, which loads it
   while generations continue and swaps it in under the engine lock, i.e. between two requests.
   Generation never waits for training; one update runs at a time per distiller (and per
   `train_lock`, which a router shares between domains).
3. a successful update releases exactly the samples it trained on (OSD releases its buffer;
   with rehearsal they go to the reservoir); samples that arrived meanwhile stay for the next
   update. A failed update (training, export or reload error, or a training process that died)
   is logged and kept in `last_error` and the stats, the old draft keeps serving, nothing leaves
   the buffer, and the training process restarts from the serving draft's weights (a new
   process if the old one is gone).

Acceptance is tracked over the last `window` requests (OSD reports the last 50), overall and per
domain tag; `history` keeps the last `history_limit` requests with their draft versions.
The serving process never imports torch: it holds the engine, the buffer and the metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from ..config import GenerationConfig
from ..engine import Engine, Prompt
from ..results import GenerationResult
from .buffer import (ReplayBuffer, TraceSample, common_prefix_length, merge_samples, prompt_sample,
                     samples_from_result)
from .config import DistillConfig, TrainReport
from .worker import DEFAULT_FACTORY, TrainerExitedError, TrainerProcess

log = logging.getLogger("pyspec.online")


@dataclass(frozen=True)
class RequestRecord:
    """One observed generation, as the stream metrics see it."""

    index: int          # position in the distiller's stream, from 0
    domain: str         # the caller's tag ("" when none)
    draft_version: int  # version of the draft that drafted (0: no draft model drafted)
    n_drafted: int
    n_accepted: int
    n_generated: int
    n_positions: int    # training positions it added to the buffer

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0


@dataclass(frozen=True)
class DistillerStats:
    draft: str                    # the engine's draft slot this distiller trains ("" = default)
    draft_version: int            # that slot's current version
    n_requests: int
    n_updates: int                # updates that reached the engine
    n_failed_updates: int
    updating: bool                # an update is running now
    buffer_samples: int
    buffer_positions: int
    n_evicted: int                # samples dropped by buffer_limit / max_age
    window: int                   # requests the acceptance averages cover
    # n_accepted / n_drafted pooled over the last `window` requests drafted by the draft model;
    # None before the first one
    acceptance: float | None
    acceptance_by_domain: dict[str, float | None]
    last_error: str | None        # the last failed update's error, "Type: message"
    last_report: TrainReport | None  # the last successful update's training numbers
    updates: tuple[UpdateRecord, ...] = ()  # the last `history_limit` updates, oldest first


@dataclass(frozen=True)
class UpdateRecord:
    """One update, as a server sees it: when it started, how long until the new draft served."""

    started_after: int   # requests observed when it started (it trained on what came before)
    seconds: float       # wall time from start to swap (or to failure): training, export, reload
    version: int         # the draft version it made (0: it failed)
    report: TrainReport | None  # training numbers (None: it failed before training ended)


class OnlineDistiller:
    """Distils one of the engine's drafts (slot `draft`, "" = the default draft) online.

    config: DistillConfig (loss, tau, positions, optimisation, rehearsal, train_threads,
    export_dtype). update_interval: requests between updates (OSD's I). buffer_limit: training
    positions that trigger an update early and cap the buffer (oldest samples evicted beyond
    it). max_age: samples older than this many requests are evicted (None: no limit). window:
    requests in the acceptance averages; history_limit: requests kept in `history`. work_dir:
    where trained drafts are written (default: a temporary directory that close() removes; the
    engine keeps serving the last draft from memory, so copy engine.draft_paths[draft] first to
    keep it); the serving file and the one before it are kept, older ones deleted. train_lock: a
    lock held while training, to keep several distillers from training at once. factory: what
    the training process trains ("module:name", worker.py; default the GGUF draft model).

    generate() uses the request's method (default "auto"). A chain drafts with the draft model
    every step and so yields a training position at every rejection; "auto" yields rejections
    only of the proposals it verifies (prompt lookup, phrase pool, the draft model where it
    pays), usually fewer; positions="all" trains on every generated token whatever the method.
    """

    def __init__(self, engine: Engine, config: DistillConfig | None = None, update_interval: int = 8,
                 buffer_limit: int = 4096, max_age: int | None = None, *, draft: str = "",
                 work_dir: str | os.PathLike[str] | None = None, window: int = 50, history_limit: int = 10_000,
                 train_lock: threading.Lock | None = None, factory: str = DEFAULT_FACTORY) -> None:
        if update_interval < 1:
            raise ValueError(f"update_interval must be >= 1, got {update_interval}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if history_limit < 0:
            raise ValueError(f"history_limit must be >= 0, got {history_limit}")
        self.engine = engine
        self.draft = draft
        self._check_drafter()
        self.config = config or DistillConfig()
        self.update_interval = update_interval
        self.buffer = ReplayBuffer(buffer_limit, max_age,
                                   rehearsal_limit=self.config.rehearsal_limit if self.config.rehearsal > 0 else 0,
                                   seed=self.config.seed)
        self.window = window
        self._own_dir = tempfile.TemporaryDirectory(prefix="pyspec-distill-") if work_dir is None else None
        self.work_dir = Path(self._own_dir.name if self._own_dir is not None else work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.history: deque[RequestRecord] = deque(maxlen=history_limit)
        self._updates: deque[UpdateRecord] = deque(maxlen=history_limit)
        self.factory = factory
        self._train_lock = train_lock or threading.Lock()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._recent: deque[RequestRecord] = deque(maxlen=window)
        self._recent_by_domain: dict[str, deque[RequestRecord]] = {}
        self._n_requests = 0
        self._last_prompt: list[int] = []  # prompt_positions: the previous request's prompt
        self._since_update = 0
        self._updating = False
        self._closed = False
        self._n_updates = 0
        self._n_failed = 0
        self._last_error: str | None = None
        self._last_report: TrainReport | None = None
        self._written: list[Path] = []  # files the trainer wrote that reached the engine
        self._worker: threading.Thread | None = None
        # Started now, so that it loads the draft while the first requests are served.
        self._trainer: TrainerProcess | None = self._start_trainer()

    # -- what is trained: one of the engine's draft slots (a subclass may train another drafter,
    # e.g. pyspec.head.online.HeadDistiller the engine's draft head) ---------------------------

    def _check_drafter(self) -> None:
        if self.draft not in self.engine.draft_paths:
            raise ValueError(f"the engine has no draft model in slot {self.draft!r} to distil "
                             f"(slots: {sorted(self.engine.draft_paths)})")

    def _serving_path(self) -> str:
        """The file of the drafter now serving (training starts, and restarts, from it)."""
        return self.engine.draft_paths[self.draft]

    def _reload(self, path: Path) -> int:
        """Installs a trained file in the engine; returns the drafter's new version."""
        return self.engine.reload_draft(path, name=self.draft)

    def _serving_version(self) -> int:
        return self.engine.draft_versions.get(self.draft, 0)

    def _drafted_version(self, result: GenerationResult) -> int:
        """Version of this distiller's drafter that drafted `result` (0: it did not draft)."""
        return result.draft_version

    def _describe(self) -> str:
        return f"draft slot {self.draft!r}"

    # -- serving ---------------------------------------------------------------------------

    def generate(self, prompt: Prompt, config: GenerationConfig | None = None, *, domain: str = "",
                 **options: object) -> GenerationResult:
        """Engine.generate with this distiller's draft, then observe(result, domain=domain)."""
        cfg = (config or GenerationConfig()).replace(**options)
        keep_logits = cfg.return_logits
        if cfg.draft != self.draft:
            cfg = cfg.replace(draft=self.draft)
        if self.config.positions == "all" and self.config.teacher == "trace":
            cfg = cfg.replace(return_logits=True)  # the target's row behind every token
        elif self.config.teacher == "trace" and cfg.trace_top_k == 0:
            cfg = cfg.replace(trace_top_k=self.config.top_k)  # the target's top-k at rejections
        result = self.engine.generate(prompt, cfg)
        self.observe(result, domain=domain)
        if not keep_logits and result.logits is not None:
            result = dataclasses.replace(result, logits=None)
        return result

    def observe(self, result: GenerationResult, *, domain: str = "") -> RequestRecord:
        """Adds a generation of this distiller's draft slot to the buffer and the metrics, and
        starts an update when one is due. Call it for generations made without generate()."""
        if result.draft != self.draft:
            raise ValueError(f"this distiller trains draft slot {self.draft!r}; the result was drafted "
                             f"with slot {result.draft!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError("the distiller is closed")
            index = self._n_requests
            self._n_requests += 1
        sample = self._sample(result, index, domain)
        if sample is not None:
            self.buffer.add(sample)
        else:
            self.buffer.expire(index)
        version = self._drafted_version(result)
        drafted = version > 0
        record = RequestRecord(
            index=index, domain=domain, draft_version=version,
            n_drafted=result.stats.n_drafted if drafted else 0,
            n_accepted=result.stats.n_accepted if drafted else 0,
            n_generated=result.stats.n_generated, n_positions=sample.n_rows if sample else 0,
        )
        with self._lock:
            self.history.append(record)
            if drafted:
                self._recent.append(record)
                self._recent_by_domain.setdefault(domain, deque(maxlen=self.window)).append(record)
            self._since_update += 1
            full = self.buffer.n_positions >= self.buffer.limit
            if (self._since_update >= self.update_interval or full) and not self._updating and len(self.buffer):
                self._start_update()
        return record

    def _sample(self, result: GenerationResult, index: int, domain: str) -> TraceSample | None:
        cfg = self.config
        prompt = list(result.prompt_tokens)
        first = None  # prompt_positions: the first prompt row to train on (None: no prompt rows)
        if cfg.prompt_positions:
            with self._lock:
                first = common_prefix_length(prompt, self._last_prompt)
                self._last_prompt = prompt
            if first >= len(prompt) - 1:
                first = None
        prompt_rows = teacher_logits = None
        if cfg.positions == "all" and cfg.teacher == "evaluate" and result.tokens:
            # One target pass over prompt + output: the output's rows (row i predicts generated
            # token i) and, with prompt_positions, the prompt's from `first` in the same pass.
            start = len(prompt) - 1 if first is None else first
            rows = self.engine.evaluate(prompt + list(result.tokens[:-1]), all_rows=True, first_row=start)
            prompt_rows, teacher_logits = rows[: len(prompt) - 1 - start], rows[len(prompt) - 1 - start:]
        elif first is not None:
            prompt_rows = self.engine.evaluate(prompt[:-1], all_rows=True, first_row=first)
        sample = samples_from_result(result, positions=cfg.positions, top_k=cfg.top_k,
                                     teacher_logits=teacher_logits, request=index, domain=domain)
        if first is not None:
            sample = merge_samples(sample, prompt_sample(prompt, first, prompt_rows, top_k=cfg.top_k, request=index,
                                                         domain=domain))
        return sample

    # -- updates ---------------------------------------------------------------------------

    def update_now(self, *, wait: bool = True, timeout: float | None = None) -> bool:
        """Starts an update on the buffer now (unless one runs or the buffer is empty); with
        wait, returns whether the update reached the engine, else whether one was started."""
        with self._lock:
            if self._closed or self._updating or not len(self.buffer):
                started = False
            else:
                self._start_update()
                started = True
            n_updates = self._n_updates
        if not wait or not started:
            return started
        self.wait(timeout)
        with self._lock:
            return self._n_updates > n_updates

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until no update is running; False if `timeout` seconds passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._updating, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stops starting updates, waits for a running one, ends the training process and
        removes the work directory if the distiller made it. The engine stays open."""
        with self._lock:
            self._closed = True
        self.wait(timeout)
        trainer, self._trainer = self._trainer, None
        if trainer is not None:
            trainer.close()
        if self._own_dir is not None:
            self._own_dir.cleanup()

    def _start_trainer(self) -> TrainerProcess:
        return TrainerProcess(self._serving_path(), self.config, self.work_dir,
                              name=self.draft or "default", factory=self.factory)

    def _start_update(self) -> None:  # with self._lock held
        samples = self.buffer.snapshot()
        n_new = sum(s.n_rows for s in samples)
        rehearsed = self.buffer.rehearsal(int(self.config.rehearsal * n_new)) if self.config.rehearsal > 0 else []
        self._updating = True
        self._since_update = 0
        self._worker = threading.Thread(target=self._update, args=(samples, rehearsed, self._n_requests),
                                        daemon=True, name=f"pyspec-distill-{self.draft or 'default'}")
        self._worker.start()

    def _update(self, samples: Sequence[TraceSample], rehearsed: Sequence[TraceSample], started_after: int) -> None:
        written: Path | None = None
        t0 = time.perf_counter()
        try:
            with self._train_lock:
                if self._trainer is None or not self._trainer.alive:
                    # The old process is gone (or this is the first update after a close of
                    # it): a new one starts from the serving draft.
                    self._trainer = self._start_trainer()
                result = self._trainer.update(samples, rehearsed).result()
            written = Path(result.path)
            version = self._reload(written)
        except Exception as exc:  # reported, never raised: serving goes on with the old draft
            log.error("update of %s failed; the old draft keeps serving: %s", self._describe(), exc)
            if written is not None:
                written.unlink(missing_ok=True)
            if self._trainer is not None and not isinstance(exc, TrainerExitedError):
                # Training continues from the weights that serve, not from the ones that failed.
                self._trainer.reset(self._serving_path()).add_done_callback(_log_failed_reset)
            with self._lock:
                self._n_failed += 1
                self._last_error = f"{type(exc).__name__}: {exc}"
                self._updates.append(UpdateRecord(started_after, time.perf_counter() - t0, 0, None))
                self._updating = False
                self._idle.notify_all()
            return
        self.buffer.release(samples)
        report = result.report
        log.info("%s: version %d from %d samples (%d positions, %d rehearsed), loss %.4f -> %.4f "
                 "in %.1f s + %.1f s export", self._describe(), version, report.n_samples, report.n_positions,
                 report.n_rehearsed, report.loss_before, report.loss_after, report.seconds, report.export_seconds)
        with self._lock:
            self._written.append(written)
            stale, self._written = self._written[:-2], self._written[-2:]
            self._n_updates += 1
            self._last_report = report
            self._updates.append(UpdateRecord(started_after, time.perf_counter() - t0, version, report))
            self._updating = False
            self._idle.notify_all()
        for path in stale:
            path.unlink(missing_ok=True)

    @property
    def trainer_pid(self) -> int | None:
        """The training process's id (None once closed)."""
        trainer = self._trainer
        return trainer.pid if trainer is not None else None

    # -- metrics ---------------------------------------------------------------------------

    def stats(self) -> DistillerStats:
        with self._lock:
            return DistillerStats(
                draft=self.draft,
                draft_version=self._serving_version(),
                n_requests=self._n_requests,
                n_updates=self._n_updates,
                n_failed_updates=self._n_failed,
                updating=self._updating,
                buffer_samples=len(self.buffer),
                buffer_positions=self.buffer.n_positions,
                n_evicted=self.buffer.n_evicted,
                window=self.window,
                acceptance=pooled_acceptance(self._recent),
                acceptance_by_domain={d: pooled_acceptance(r) for d, r in self._recent_by_domain.items()},
                last_error=self._last_error,
                last_report=self._last_report,
                updates=tuple(self._updates),
            )


def _log_failed_reset(future: "Future[None]") -> None:
    if future.exception() is not None:
        log.error("the training process could not restart from the serving draft: %s", future.exception())


def pooled_acceptance(records: Sequence[RequestRecord] | deque[RequestRecord]) -> float | None:
    """Sum of accepted over sum of drafted tokens; None when nothing was drafted."""
    drafted = sum(r.n_drafted for r in records)
    return sum(r.n_accepted for r in records) / drafted if drafted else None

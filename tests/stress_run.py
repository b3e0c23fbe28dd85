"""Concurrency stress on the tiny models (imported by tests/test_stress.py and scripts/stress.py).

Several threads share one engine and, in random order, generate (every method, greedy and
sampled), stream and cancel, reload drafts (good copies, a corrupt file, a named slot) and remove
them, save, load and clear the phrase pool, read its statistics, tokenize, and one of them closes
the engine at a random moment; then a new engine starts the next round. Every call must succeed
or raise a typed error (EngineClosedError once the engine is closed), no thread may hang, and
greedy outputs must equal plain decoding's, whatever ran beside them (the draft copies have the
same weights, so a reload never changes what is exact).
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyspec

PROMPTS = ["def hello():\n    return", "The quick brown fox", "import numpy as np\n\nclass Model:", "x"]
METHODS = ["auto", "none", "chain", "tree", "beam", "lookup", "ouroboros"]


@dataclass
class StressReport:
    seconds: float = 0.0
    n_rounds: int = 0
    calls: Counter = field(default_factory=Counter)        # op -> successful calls
    typed_errors: Counter = field(default_factory=Counter)  # "op: ErrorClass" -> count
    failures: list[str] = field(default_factory=list)       # untyped errors, wrong outputs, hangs

    @property
    def n_calls(self) -> int:
        return sum(self.calls.values()) + sum(self.typed_errors.values())

    def summary(self) -> str:
        return (f"{self.seconds:.0f} s, {self.n_rounds} rounds, {self.n_calls} calls "
                f"({sum(self.calls.values())} succeeded, {sum(self.typed_errors.values())} typed errors), "
                f"{len(self.failures)} failures")


class _Round:
    def __init__(self, engine: pyspec.Engine, files: dict[str, str], reference: dict[tuple[int, int], list[int]],
                 report: StressReport, lock: threading.Lock, deadline: float, workdir: Path) -> None:
        self.engine, self.files, self.reference = engine, files, reference
        self.report, self.lock, self.deadline, self.workdir = report, lock, deadline, workdir
        self.closed = threading.Event()

    def record(self, op: str, exc: BaseException | None, problem: str | None = None) -> None:
        with self.lock:
            if problem:
                self.report.failures.append(f"{op}: {problem}")
            elif exc is None:
                self.report.calls[op] += 1
            elif isinstance(exc, (pyspec.SpecError, FileNotFoundError)):
                self.report.typed_errors[f"{op}: {type(exc).__name__}"] += 1
            else:
                self.report.failures.append(f"{op}: untyped {type(exc).__name__}: {exc}")

    def op_generate(self, rng: random.Random) -> str | None:
        i, n = rng.randrange(len(PROMPTS)), rng.choice([1, 8, 24, 40])
        greedy = rng.random() < 0.7
        options = dict(max_tokens=n, method=rng.choice(METHODS))
        if not greedy:
            options.update(temperature=rng.choice([0.5, 1.0]), top_k=rng.choice([0, 2, 20]), seed=rng.randrange(100))
        if rng.random() < 0.2:
            options["draft"] = "alt"
        r = self.engine.generate(PROMPTS[i], **options)
        if greedy and r.tokens != self.reference[(i, n)]:
            return f"greedy {options} on prompt {i} differs from plain decoding"
        if r.finish_reason not in ("length", "stop"):
            return f"finish_reason {r.finish_reason!r}"
        return None

    def op_stream(self, rng: random.Random) -> str | None:
        i = rng.randrange(len(PROMPTS))
        stop_after = rng.choice([0, 1, 3, 1000])
        stream = self.engine.stream(PROMPTS[i], max_tokens=40, method=rng.choice(METHODS))
        n = 0
        for _ in stream:
            n += 1
            if n > stop_after:
                break
        stream.close()
        r = stream.result
        if r is None:
            return "no result after the stream ended"
        if r.tokens != self.reference[(i, 40)][: len(r.tokens)]:
            return "streamed tokens differ from plain decoding"
        return None

    def op_reload(self, rng: random.Random) -> str | None:
        choice = rng.random()
        if choice < 0.6:
            self.engine.reload_draft(self.files[rng.choice(["draft_a", "draft_b"])], name=rng.choice(["", "alt"]))
        elif choice < 0.8:
            # Raises ModelLoadError (typed); whether the old draft kept serving is checked by the
            # greedy outputs of the other threads (a version check would race their reloads).
            self.engine.reload_draft(self.files["corrupt"])
            return "a corrupt draft loaded"
        else:
            self.engine.remove_draft("alt")
        return None

    def op_pool(self, rng: random.Random, thread_id: int) -> str | None:
        path = self.workdir / f"pool_{thread_id}.pool"
        choice = rng.random()
        if choice < 0.35:
            self.engine.save_pool(path)
        elif choice < 0.65:
            self.engine.load_pool(path if path.exists() else self.workdir / "missing.pool")
        elif choice < 0.75:
            self.engine.clear_pool()
        else:
            stats = self.engine.pool_stats()
            if stats["size"] > stats["capacity"]:
                return f"pool holds {stats['size']} > capacity"
        return None

    def op_text(self, rng: random.Random) -> str | None:
        text = rng.choice(PROMPTS)
        tokens = self.engine.tokenize(text, add_special=False)
        if self.engine.detokenize(tokens) != text:
            return "tokenize/detokenize round trip failed"
        self.engine.apply_chat_template([{"role": "user", "content": text}])
        return None

    def worker(self, thread_id: int, seed: int, closer: bool) -> None:
        rng = random.Random(seed)
        close_at = time.monotonic() + rng.uniform(0.5, max(0.6, self.deadline - time.monotonic()))
        while time.monotonic() < self.deadline:
            if closer and time.monotonic() >= close_at:
                op, call = "close", self.engine.close
                self.closed.set()
            else:
                op = rng.choice(["generate", "generate", "stream", "reload", "pool", "pool", "text"])
                call = {
                    "generate": lambda: self.op_generate(rng), "stream": lambda: self.op_stream(rng),
                    "reload": lambda: self.op_reload(rng), "pool": lambda: self.op_pool(rng, thread_id),
                    "text": lambda: self.op_text(rng),
                }[op]
            try:
                problem = call()
                self.record(op, None, problem if isinstance(problem, str) else None)
            except BaseException as exc:  # noqa: BLE001 - every outcome is classified
                self.record(op, exc)
            if self.closed.is_set() and op == "close":
                return
            if self.closed.is_set() and rng.random() < 0.3:
                return  # some threads keep calling a closed engine for a while, others leave


def run_stress(target: str, draft: str, workdir: Path, seconds: float, n_threads: int = 6, seed: int = 0,
               round_seconds: float = 5.0) -> StressReport:
    """Runs rounds of n_threads threads on a fresh engine each until `seconds` have passed."""
    files = {"draft_a": str(workdir / "draft_a.gguf"), "draft_b": str(workdir / "draft_b.gguf"),
             "corrupt": str(workdir / "corrupt.gguf")}
    shutil.copyfile(draft, files["draft_a"])
    shutil.copyfile(draft, files["draft_b"])
    data = Path(draft).read_bytes()
    Path(files["corrupt"]).write_bytes(data[: len(data) // 3])
    report = StressReport()
    lock = threading.Lock()
    with pyspec.Engine(target, n_ctx=512, n_threads=1) as plain:
        reference = {(i, n): plain.generate(p, max_tokens=n, method="none").tokens
                     for i, p in enumerate(PROMPTS) for n in (1, 8, 24, 40)}
    t_start = time.monotonic()
    round_index = 0
    while time.monotonic() - t_start < seconds:
        engine = pyspec.Engine(target, draft=files["draft_a"], drafts={"alt": files["draft_b"]}, n_ctx=512,
                               n_threads=1)
        deadline = min(time.monotonic() + round_seconds, t_start + seconds)
        rnd = _Round(engine, files, reference, report, lock, deadline, workdir)
        threads = [threading.Thread(target=rnd.worker, args=(k, seed * 1000 + round_index * 100 + k, k == 0),
                                    name=f"stress-{k}", daemon=True) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=round_seconds + 120)
            if t.is_alive():
                report.failures.append(f"round {round_index}: thread {t.name} hangs (deadlock?)")
        engine.close()
        round_index += 1
    report.n_rounds = round_index
    report.seconds = time.monotonic() - t_start
    return report

"""Server counters and their Prometheus text exposition (format 0.0.4), written by hand: a
handful of counters and gauges need no client library."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..results import GenerationResult


@dataclass
class ServerMetrics:
    """Totals since the server started; updated by the generation worker, read by /metrics."""

    requests: Counter = field(default_factory=Counter)  # (endpoint, outcome) -> count
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0  # prompt tokens whose KV came from the prefix cache
    prefix_cache_hits: int = 0     # generations that reused at least one cached token
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    target_calls: int = 0
    generation_seconds: float = 0.0
    prefill_seconds: float = 0.0
    queue_wait_seconds: float = 0.0
    pool_saves: int = 0
    pool_save_errors: int = 0
    pool_file_errors: int = 0      # pool files found corrupt at start and set aside
    stats_saves: int = 0           # saves of auto's acceptance statistics (--stats-file)
    stats_save_errors: int = 0
    stats_file_errors: int = 0     # statistics files found unusable at start and set aside
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def bump(self, name: str) -> None:
        """Adds one to the integer counter `name` (pool_saves, pool_save_errors, ...)."""
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def count_request(self, endpoint: str, outcome: str) -> None:
        with self._lock:
            self.requests[(endpoint, outcome)] += 1

    def add_generation(self, result: GenerationResult, waited_s: float) -> None:
        s = result.stats
        with self._lock:
            self.prompt_tokens += s.n_prompt_tokens
            self.prompt_tokens_cached += s.n_prompt_cached
            self.prefix_cache_hits += s.n_prompt_cached > 0
            self.generated_tokens += s.n_generated
            self.drafted_tokens += s.n_drafted
            self.accepted_tokens += s.n_accepted
            self.target_calls += s.n_target_calls
            self.generation_seconds += s.t_total_ms / 1000.0
            self.prefill_seconds += s.t_prefill_ms / 1000.0
            self.queue_wait_seconds += waited_s

    def render(self, gauges: Iterable[tuple[str, str, str, float]]) -> str:
        """Prometheus text: the counters above, then `gauges` (name, help, labels, value)."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{labels} {_number(value)}")

        with self._lock:
            metric("pyspec_requests_total", "counter", "Generation requests by endpoint and outcome.",
                   [(f'{{endpoint="{e}",outcome="{o}"}}', n) for (e, o), n in sorted(self.requests.items())])
            metric("pyspec_prompt_tokens_total", "counter", "Prompt tokens of finished generations.",
                   [("", self.prompt_tokens)])
            metric("pyspec_prompt_tokens_cached_total", "counter",
                   "Prompt tokens whose KV cache was reused from earlier requests (prefix cache).",
                   [("", self.prompt_tokens_cached)])
            metric("pyspec_prefix_cache_hits_total", "counter",
                   "Generations that reused at least one cached prompt token.", [("", self.prefix_cache_hits)])
            metric("pyspec_generated_tokens_total", "counter", "Generated tokens.", [("", self.generated_tokens)])
            metric("pyspec_drafted_tokens_total", "counter", "Draft tokens proposed (tree nodes for trees).",
                   [("", self.drafted_tokens)])
            metric("pyspec_accepted_tokens_total", "counter", "Draft tokens the target accepted.",
                   [("", self.accepted_tokens)])
            metric("pyspec_target_calls_total", "counter", "Target model decodes after prefill.",
                   [("", self.target_calls)])
            metric("pyspec_acceptance_rate", "gauge", "Accepted / drafted tokens since start.",
                   [("", self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0)])
            metric("pyspec_tokens_per_target_call", "gauge", "Generated tokens per target decode since start.",
                   [("", self.generated_tokens / self.target_calls if self.target_calls else 0.0)])
            metric("pyspec_generation_seconds_total", "counter", "Time spent generating (prefill included).",
                   [("", self.generation_seconds)])
            metric("pyspec_prefill_seconds_total", "counter", "Time spent evaluating prompts.",
                   [("", self.prefill_seconds)])
            metric("pyspec_queue_wait_seconds_total", "counter", "Time requests waited for the engine.",
                   [("", self.queue_wait_seconds)])
            metric("pyspec_pool_saves_total", "counter", "Phrase pool saves to the pool file.", [("", self.pool_saves)])
            metric("pyspec_pool_save_errors_total", "counter", "Failed phrase pool saves.",
                   [("", self.pool_save_errors)])
            metric("pyspec_pool_file_errors_total", "counter", "Pool files found unreadable at start and set aside.",
                   [("", self.pool_file_errors)])
            metric("pyspec_stats_saves_total", "counter", "Saves of auto's acceptance statistics to the stats file.",
                   [("", self.stats_saves)])
            metric("pyspec_stats_save_errors_total", "counter", "Failed saves of auto's acceptance statistics.",
                   [("", self.stats_save_errors)])
            metric("pyspec_stats_file_errors_total", "counter",
                   "Statistics files found unusable at start and set aside.", [("", self.stats_file_errors)])
        by_name: dict[str, tuple[str, list[tuple[str, float]]]] = {}
        for name, help_text, labels, value in gauges:
            by_name.setdefault(name, (help_text, []))[1].append((labels, value))
        for name, (help_text, samples) in by_name.items():
            metric(name, "gauge", help_text, samples)
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


GaugeSource = Callable[[], Iterable[tuple[str, str, str, float]]]

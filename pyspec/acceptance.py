"""Method auto's acceptance statistics kept across processes: what it has learnt of how often each
kind of draft node is accepted (spec/schedule.h, AcceptanceStats), saved as JSON and loaded into a
later engine, so that a one-shot `pyspec generate` plans its first request as the previous ones
taught it instead of from the priors alone (on the recorded Zen 4 outputs, replayed: a fresh engine
models 1.65x plain decoding on HumanEval and 2.09x on edit, the suites in turn 1.80x and 2.22x;
benchmarks/auto_streams.py). Within each request the engine checks the loaded history against the
request's own outcomes, but until the request has outcomes it plans with the history: measured
one-shot on the Zen 4, kept statistics learnt on HumanEval ran HumanEval prompts at 1.07x a fresh
engine and MT-Bench prompts at 0.92-0.96x (benchmarks/stats_file_live.py, docs/results-speed.md),
so `pyspec generate` keeps them only when asked (--stats-file).

The file is keyed to the target model (its cost signature: tensor types and shapes) and to the
engine's node-kind layout; the draft model's own kinds are kept only for a draft slot holding a
model of the same signature. `default_path` is the cache's file for a target:
``$PYSPEC_CACHE/stats/<digest>.json`` (default ``~/.cache/pyspec``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _core
from .errors import InvalidArgumentError, StatsFileError
from .fetch import Cache

if TYPE_CHECKING:
    from .engine import Engine

FORMAT_VERSION = 1


def layout() -> dict[str, Any]:
    """What the counts' positions mean: every node kind's name, and the depth cells per kind."""
    return {"kinds": [_core.kind_name(k) for k in range(_core.NUM_KINDS)], "depths": int(_core.KIND_DEPTHS)}


def _signature(engine: "Engine", draft: str | None) -> str:
    return str(engine._core.cost_signature(draft is not None, draft or ""))


def default_path(engine: "Engine", cache: Cache | None = None) -> Path:
    """The cache's statistics file for the engine's target model."""
    digest = hashlib.sha256(_signature(engine, None).encode()).hexdigest()[:24]
    return (cache or Cache.default()).root / "stats" / f"{digest}.json"


def save(engine: "Engine", path: str | os.PathLike[str]) -> Path:
    """Writes the engine's acceptance statistics to `path` atomically (a temp file renamed into
    place). Between generations."""
    path = Path(path)
    data = {
        "format": FORMAT_VERSION,
        "layout": layout(),
        "target": _signature(engine, None),
        "drafts": {name: _signature(engine, name) for name in engine.draft_paths},
        "stats": {key: list(counts) for key, counts in engine._core.acceptance_counts().items()},
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise StatsFileError(f"cannot write acceptance statistics to {path}: {exc}") from exc
    return path


def load(engine: "Engine", path: str | os.PathLike[str]) -> int:
    """Replaces the engine's acceptance statistics by the file's; returns the number of statistics
    keys loaded. StatsFileError for a missing or unreadable file, another format or kind layout,
    or another target model; the engine's statistics are then unchanged. A draft slot's
    model-node counts are dropped unless the slot holds a model of the signature they were
    learnt with. Between generations."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise StatsFileError(f"no acceptance statistics file at {path}") from exc
    except (OSError, ValueError) as exc:
        raise StatsFileError(f"cannot read acceptance statistics from {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
        found = data.get("format") if isinstance(data, dict) else None
        raise StatsFileError(f"{path}: not an acceptance statistics file of format {FORMAT_VERSION} (format {found!r})")
    if data.get("layout") != layout():
        raise StatsFileError(f"{path}: saved by a pyspec with other node kinds; its statistics do not apply")
    target = _signature(engine, None)
    if data.get("target") != target:
        raise StatsFileError(f"{path}: saved for target {data.get('target')!r}, this engine's is {target!r}")
    stats, drafts = data.get("stats"), data.get("drafts")
    if not isinstance(stats, dict) or not isinstance(drafts, dict):
        raise StatsFileError(f"{path}: 'stats' and 'drafts' must be objects")
    counts: dict[str, list[float]] = {}
    other_draft = []  # keys whose draft-model counts were learnt with another draft
    for key, values in stats.items():
        if not isinstance(values, list) or not all(isinstance(v, (int, float)) for v in values):
            raise StatsFileError(f"{path}: statistics {key!r} are not a list of numbers")
        counts[key] = [float(v) for v in values]
        slot = key.split("\n", 1)[0]
        if slot not in engine.draft_paths or drafts.get(slot) != _signature(engine, slot):
            other_draft.append(key)
    try:
        engine._core.set_acceptance_counts(counts, other_draft)
    except InvalidArgumentError as exc:
        raise StatsFileError(f"{path}: {exc}") from exc
    return len(counts)


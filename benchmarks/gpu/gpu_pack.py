"""`gpu_check.py pack`: what an offline GPU machine needs, gathered where the network is.

Writes into Layout.carry: the trimmed llama.cpp tree (tar.xz), pure-Python wheels, and
manifest.json (model shapes, this CPU's cost curves, prompts, the model parts' checksums); with a
model, its parts into Layout.part_dir(i). Runs with pyspec installed (it reads the real models
through the registry and this CPU's curves through an Engine).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

from gpu_steps import QUICK_SHAPE, Layout
from shape_model import read_shape

log = logging.getLogger("gpu_check")

# Of the sdist's vendor/llama.cpp, what a libllama build with the CPU and CUDA backends reads
# (LLAMA_BUILD_COMMON/TOOLS/EXAMPLES/TESTS off): ~1/10 of the tree.
KEEP_DIRS = ("cmake/", "include/", "src/", "licenses/", "vendor/", "ggml/cmake/", "ggml/include/",
             "ggml/src/ggml-cpu/", "ggml/src/ggml-cuda/")
KEEP_FILES = ("CMakeLists.txt", "LICENSE", "ggml/CMakeLists.txt")
DROP_DIRS = ("vendor/cpp-httplib/",)  # only common/ uses it
# The build and test steps need these beyond what a CUDA image's Python has (numpy, pytest,
# scipy, cmake, ninja, pyyaml, tqdm, requests, packaging, pathspec); pure Python, so one wheel
# serves any interpreter. Pinned: versions that build pyspec (gguf: pyproject's pin), with
# scikit-build-core's own requirements (Python >= 3.11). Not read from the running environment:
# a `pip install .` venv holds no build requirements.
WHEELS = ("gguf==0.19.0", "nanobind==3.1.0", "scikit-build-core==1.1.2", "packaging==26.3", "pathspec==1.1.1")
SUITES = (("humaneval", 5), ("edit", 5))


def _kept(rel: str) -> bool:
    if any(rel.startswith(d) for d in DROP_DIRS):
        return False
    if rel in KEEP_FILES or any(rel.startswith(d) for d in KEEP_DIRS):
        return True
    # ggml/src's own files (not its other backends' directories)
    path = PurePosixPath(rel)
    return str(path.parent) == "ggml/src"


def trim_llama_source(sdist: Path, dest: Path) -> int:
    """Writes the kept part of the sdist's vendor/llama.cpp as dest (tar.xz, paths under
    llama.cpp/); returns the number of files."""
    prefix = sdist.name[: -len(".tar.gz")] + "/vendor/llama.cpp/"
    n = 0
    partial = dest.with_name(dest.name + ".partial")
    with tarfile.open(sdist) as src, tarfile.open(partial, "w:xz") as out:
        for member in src:
            if not member.name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            rel = member.name[len(prefix):]
            if member.isdir() or not _kept(rel):
                continue
            data = src.extractfile(member)
            # A long path is stored in the sdist's pax header, which would win over the new name
            # on extraction: drop it, so every file lands under llama.cpp/.
            member.pax_headers = {k: v for k, v in member.pax_headers.items() if k not in ("path", "linkpath")}
            member.name = "llama.cpp/" + rel
            out.addfile(member, data)
            n += 1
    partial.replace(dest)
    return n


def _download_wheels(dest: Path) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    specs = list(WHEELS)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
           "--dest", str(dest), *specs]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip could not download {' '.join(specs)}:\n{proc.stderr.strip()[-2000:]}")
    return specs


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_reference(target: str, draft: str) -> dict:
    """This CPU's cost curves of the real target and draft (cached, or measured now)."""
    from pyspec import Engine

    with Engine(target, draft=draft) as engine:
        curves = engine.calibrate(progress=False)
        threads = engine.n_threads
    return {"machine": f"{_cpu_name()}, {threads} threads", "backend": "CPU",
            "curves": {name: {"n_tokens": list(c.n_tokens), "ms": list(c.ms)} for name, c in curves.items()}}


def _split_model(path: Path, layout: Layout, part_bytes: int) -> dict:
    from pyspec.fetch import sha256_file

    size = path.stat().st_size
    n_parts = max(1, math.ceil(size / part_bytes))
    parts = []
    with open(path, "rb") as f:
        for i in range(1, n_parts + 1):
            part_dir = layout.part_dir(i)
            shutil.rmtree(part_dir, ignore_errors=True)
            part_dir.mkdir(parents=True)
            chunk = f.read(part_bytes)
            part = part_dir / f"{path.name}.part{i}"
            part.write_bytes(chunk)
            parts.append({"dir": part_dir.name, "file": part.name, "size": len(chunk),
                          "sha256": hashlib.sha256(chunk).hexdigest()})
    return {"file": path.name, "size": size, "sha256": sha256_file(path), "parts": parts}


def pack(layout: Layout, *, model: str | None, quick: bool, part_mb: float, cpu_reference: bool) -> None:
    from pyspec.config import DEFAULT_DRAFT, DEFAULT_TARGET
    from pyspec.fetch import Cache
    from pyspec.bench.llamacpp import LLAMA_CPP_COMMIT, download_sdist
    from pyspec.models import resolve_model

    layout.carry.mkdir(parents=True, exist_ok=True)
    sdist = download_sdist(Cache.default().packages)
    n_files = trim_llama_source(sdist, layout.llama_tar)
    log.info("llama.cpp %s trimmed: %d files, %.1f MB in %s", LLAMA_CPP_COMMIT, n_files,
             layout.llama_tar.stat().st_size / 1e6, layout.llama_tar)
    shutil.rmtree(layout.wheels, ignore_errors=True)
    wheels = _download_wheels(layout.wheels)
    log.info("wheels: %s", ", ".join(wheels))
    manifest: dict = {"llama_cpp_commit": LLAMA_CPP_COMMIT, "wheels": wheels, "quick": quick}
    if quick:
        manifest["shapes"] = {"target": QUICK_SHAPE.to_json(), "draft": QUICK_SHAPE.to_json()}
    else:
        target, draft = resolve_model(DEFAULT_TARGET), resolve_model(DEFAULT_DRAFT)
        manifest["shapes"] = {"target": read_shape(target).to_json(), "draft": read_shape(draft).to_json(),
                              "of": {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}}
        if cpu_reference:
            manifest["cpu_reference"] = _cpu_reference(target, draft)
    from pyspec.data import load_suite

    manifest["prompts"] = [{"id": p.id, "messages": list(p.messages)}
                           for suite, n in SUITES for p in load_suite(suite, n=n)]
    for old in layout.part_dirs():
        shutil.rmtree(old)
    if model:
        path = Path(resolve_model(model))
        manifest["model"] = {"name": model, **_split_model(path, layout, int(part_mb * 1e6))}
        log.info("model %s: %d part(s) in %s", model, len(manifest["model"]["parts"]),
                 ", ".join(p["dir"] for p in manifest["model"]["parts"]))
    layout.manifest.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    total = sum(f.stat().st_size for f in layout.carry.rglob("*") if f.is_file())
    log.info("packed %.1f MB in %s", total / 1e6, layout.carry)

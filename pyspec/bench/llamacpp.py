"""llama.cpp's own command-line tools as benchmark peers: finding them, building them, running them.

The engine links the libllama of llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570). Its source
distribution vendors that llama.cpp tree, tools included, so the tools built from it run the very
kernels the engine runs. `build_tools` downloads the sdist with pip (`--no-binary
llama-cpp-python`: only this package from source; its build requirements still come as wheels),
checks its sha256, configures llama.cpp with CMake (Release, static libraries, llama.cpp's own
defaults otherwise: a native CPU build, as llama-cpp-python's) and builds `llama-completion`,
`llama-speculative-simple` and `llama-bench` into ``$PYSPEC_CACHE/llama.cpp/0c1e570/bin``
(~10 minutes on 2 cores, once). `find_tools` looks there, or in ``$PYSPEC_LLAMA_CPP_BIN``.

On a CPU with AMX the native build's AMX kernels crash (README, Notes), and a native build can
then run only with weight repacking off, which makes its decoding slower than it need be. There
the tools are built without AMX instructions (``0c1e570-noamx/bin``, marked by a file AMX_OFF),
so that they can repack their weights as pyspec's engine does (`Engine(repack=None)` repacks the
matmul weights without AMX there): the peers run at their best, with the engine's setting.

Running and reading the tools' reports is in `pyspec.bench.llamacpp_run`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from ..engine import cpu_has_amx
from ..errors import SpecError
from ..fetch import PIP_ARGS_ENV, Cache

log = logging.getLogger(__name__)

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e570"  # the llama.cpp tree vendored in that sdist
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TOOLS = ("llama-completion", "llama-speculative-simple", "llama-bench")
BIN_ENV = "PYSPEC_LLAMA_CPP_BIN"
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    # Static: the three executables are self-contained and the build tree can be deleted.
    "-DBUILD_SHARED_LIBS=OFF",
)
# Appended to a native build's flags on AMX CPUs: GCC and Clang let an explicit -mno-* win over
# the -march=native that ggml adds, so the build keeps every other native instruction.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
AMX_OFF_MARKER = "AMX_OFF"
LOG_TAIL_LINES = 25
BUILD_HINT = (
    "build them once with `python benchmarks/build_llama_cpp.py` (in a pyspec checkout) or "
    "`python -m pyspec.bench.llamacpp`; this needs cmake and a C/C++ compiler and takes ~10 minutes on "
    f"2 cores; or point ${BIN_ENV} at a directory holding {', '.join(TOOLS)}"
)


class LlamaCppToolsError(SpecError, RuntimeError):
    """llama.cpp's tools could not be built, or a run of one failed or reported something unreadable."""


class LlamaCppToolsMissing(LlamaCppToolsError):
    """llama.cpp's tools are not built (or not where they were looked for)."""


def tools_dir(cache: Cache | None = None) -> Path:
    """Where `build_tools` puts the tools: ``$PYSPEC_CACHE/llama.cpp/<commit>/bin``, or
    ``<commit>-noamx/bin`` on a CPU with AMX (module docstring)."""
    variant = LLAMA_CPP_COMMIT + ("-noamx" if cpu_has_amx() else "")
    return (cache or Cache.default()).root / "llama.cpp" / variant / "bin"


def tools_can_repack(directory: str | os.PathLike[str]) -> bool:
    """Whether the tools in `directory` can run with llama.cpp's weight repacking on this CPU: on
    any CPU without AMX; with AMX only when built without it (the AMX_OFF marker of build_tools)."""
    return not cpu_has_amx() or (Path(directory) / AMX_OFF_MARKER).is_file()


def _missing(directory: Path) -> list[str]:
    return [t for t in TOOLS if not os.access(directory / t, os.X_OK)]


def find_tools(bin_dir: str | os.PathLike[str] | None = None, cache: Cache | None = None) -> Path:
    """The directory holding all of TOOLS: `bin_dir` if given, else ``$PYSPEC_LLAMA_CPP_BIN`` if
    set, else the cache's build. Raises LlamaCppToolsMissing, saying how to build them."""
    given = bin_dir if bin_dir is not None else os.environ.get(BIN_ENV) or None
    directory = Path(given).expanduser() if given is not None else tools_dir(cache)
    missing = _missing(directory)
    if missing:
        where = "given" if bin_dir is not None else (f"from ${BIN_ENV}" if given else "pyspec's build cache")
        raise LlamaCppToolsMissing(f"llama.cpp tools not found: {', '.join(missing)} missing in {directory} "
                                   f"({where}); {BUILD_HINT}")
    return directory


SERVER = "llama-server"
SERVER_ENV = "PYSPEC_LLAMA_SERVER"


def server_dir(cache: Cache | None = None) -> Path:
    """Where build_llama_server puts llama-server: beside the tools, in ``../server``."""
    return tools_dir(cache).parent / "server"


def find_llama_server(cache: Cache | None = None) -> Path:
    """``$PYSPEC_LLAMA_SERVER`` if set, else the cache's build of llama.cpp's llama-server (the
    server benchmarks' peer). Raises LlamaCppToolsMissing saying how to build it."""
    given = os.environ.get(SERVER_ENV)
    path = Path(given).expanduser() if given else server_dir(cache) / SERVER
    if not os.access(path, os.X_OK):
        where = f"${SERVER_ENV}" if given else "pyspec's build cache"
        raise LlamaCppToolsMissing(f"llama.cpp's {SERVER} not found at {path} ({where}); build it once with "
                                   "`python -m pyspec.bench.llamacpp --server` (needs cmake and a C++ compiler, "
                                   "a few minutes on 2 cores)")
    return path


# -- building ------------------------------------------------------------------------------------


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def check_build_prerequisites() -> None:
    """Raises LlamaCppToolsError naming what is missing to build the tools (cmake, a C++ compiler)."""
    missing = [what for what, ok in (("cmake", shutil.which("cmake")), ("a C++ compiler (c++, g++ or clang++)",
                                                                        _compiler())) if not ok]
    if missing:
        raise LlamaCppToolsError(f"cannot build llama.cpp's tools: {' and '.join(missing)} not found on PATH")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _run_logged(cmd: Sequence[str], log_file: Path, what: str, cwd: Path | None = None) -> None:
    """Runs cmd with its output appended to log_file; on failure raises with the log's tail."""
    log.info("%s: %s", what, shlex.join(cmd))
    with open(log_file, "a", encoding="utf-8") as out:
        out.write(f"\n$ {shlex.join(cmd)}\n")
        out.flush()
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd).returncode
    if code != 0:
        tail = "\n".join(log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:])
        raise LlamaCppToolsError(f"{what} failed (exit {code}); full log in {log_file}; its end:\n{tail}")


def download_sdist(dest: Path, pip_args: Sequence[str] | None = None) -> Path:
    """The llama-cpp-python sdist in dest (downloaded with pip unless already there), sha256-checked."""
    path = dest / SDIST_NAME
    if not (path.is_file() and _sha256(path) == SDIST_SHA256):
        if path.exists():
            log.warning("%s does not have the expected sha256; downloading it again", path)
            path.unlink()
        dest.mkdir(parents=True, exist_ok=True)
        args = list(pip_args) if pip_args is not None else shlex.split(os.environ.get(PIP_ARGS_ENV, ""))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
               "--progress-bar", "off", "--dest", str(dest), *args,
               f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"]
        log.info("downloading the llama-cpp-python %s sdist: %s", LLAMA_CPP_PYTHON_VERSION, shlex.join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-LOG_TAIL_LINES:])
            raise LlamaCppToolsError(f"pip could not download llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} "
                                     f"(exit {proc.returncode}); is the package index reachable?\n{tail}")
        if not path.is_file():
            raise LlamaCppToolsError(f"pip finished but {path} is not there")
    digest = _sha256(path)
    if digest != SDIST_SHA256:
        raise LlamaCppToolsError(f"{path} has sha256 {digest}, expected {SDIST_SHA256}; delete it and retry")
    return path


def _extract(sdist: Path, into: Path) -> Path:
    """Unpacks the sdist; returns its vendored llama.cpp source directory."""
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:  # Python < 3.10.12: no extraction filters; the archive is the sha256-pinned one
            tar.extractall(into)
    source = into / SDIST_NAME[: -len(".tar.gz")] / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise LlamaCppToolsError(f"{sdist} holds no vendor/llama.cpp/CMakeLists.txt")
    return source


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """One build at a time per cache (a second process waits, then finds the tools built)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_tools(cache: Cache | None = None, *, jobs: int | None = None, force: bool = False,
                pip_args: Sequence[str] | None = None) -> Path:
    """Builds TOOLS into tools_dir(cache) unless they are there already (or force); returns that
    directory. Raises LlamaCppToolsError (cmake or compiler missing, download, configure or
    build failed: the message ends with the log's tail and names the full log)."""
    return build_targets(TOOLS, tools_dir(cache), cache, jobs=jobs, force=force, pip_args=pip_args)


def build_llama_server(cache: Cache | None = None, *, jobs: int | None = None, force: bool = False) -> Path:
    """Builds llama-server from the pinned sdist into server_dir(cache) unless it is there (or
    force); returns its path. Errors as build_tools'."""
    return build_targets((SERVER,), server_dir(cache), cache, jobs=jobs, force=force) / SERVER


def build_targets(targets: Sequence[str], final: Path, cache: Cache | None = None, *, options: Sequence[str] = (),
                  jobs: int | None = None, force: bool = False, pip_args: Sequence[str] | None = None) -> Path:
    """Builds llama.cpp's executables `targets` (CMAKE_OPTIONS plus `options`, without AMX on AMX
    CPUs) from the pinned sdist into the directory `final`, unless they are there already (or
    force); returns `final`. Errors as build_tools'."""
    cache = cache or Cache.default()
    root = final.parent
    with _build_lock(root):
        if not force and all(os.access(final / t, os.X_OK) for t in targets):
            return final
        check_build_prerequisites()
        sdist = download_sdist(cache.packages, pip_args)
        log_file = root / f"build-{final.name}.log"
        log_file.write_text(f"building {', '.join(targets)} from {sdist}\n", encoding="utf-8")
        with tempfile.TemporaryDirectory(prefix="build-", dir=root) as work:
            source = _extract(sdist, Path(work))
            build = Path(work) / "build"
            all_options = [*CMAKE_OPTIONS, *options]
            if cpu_has_amx():
                all_options += [f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}"]
            _run_logged(["cmake", "-S", str(source), "-B", str(build), *all_options], log_file,
                        "configuring llama.cpp with cmake")
            _run_logged(["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs or os.cpu_count() or 1),
                         "--target", *targets], log_file, f"building llama.cpp's {', '.join(targets)}")
            staged = root / f"{final.name}.new"
            shutil.rmtree(staged, ignore_errors=True)
            staged.mkdir()
            for target in targets:
                built = build / "bin" / target
                if not built.is_file():
                    raise LlamaCppToolsError(f"the build reported success but {built} is missing; see {log_file}")
                shutil.copy2(built, staged / target)
            if cpu_has_amx():
                (staged / AMX_OFF_MARKER).write_text(f"built with {NO_AMX_FLAGS}\n", encoding="utf-8")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(staged, final)
        log.info("llama.cpp's %s built in %s", ", ".join(targets), final)
        return final


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pyspec.bench.llamacpp`: build the tools (skip with a message when that is impossible)."""
    parser = argparse.ArgumentParser(prog="python -m pyspec.bench.llamacpp", description=(
        f"Build llama.cpp's {', '.join(TOOLS)} (commit {LLAMA_CPP_COMMIT}, from the llama-cpp-python "
        f"{LLAMA_CPP_PYTHON_VERSION} sdist) into pyspec's cache, for `pyspec bench`'s llama.cpp peers."))
    parser.add_argument("--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: all cores)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the tools are there")
    parser.add_argument("--server", action="store_true",
                        help=f"build {SERVER} instead (the server benchmarks' peer), into {server_dir()}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.server:
            print(build_llama_server(jobs=args.jobs, force=args.force))
            return 0
        directory = build_tools(jobs=args.jobs, force=args.force)
    except LlamaCppToolsError as e:
        print(f"llama.cpp {SERVER if args.server else 'tools'} not built: {e}", file=sys.stderr)
        return 1
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())

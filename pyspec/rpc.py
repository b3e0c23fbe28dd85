"""llama.cpp's RPC backend: a target's layers on other machines.

Each machine that lends its memory and compute runs llama.cpp's `ggml-rpc-server` (built here from
the same llama.cpp commit as the engine's libllama: the RPC protocol must match), and
`Engine(..., rpc=["host:port", ...])` puts the target's layers on those servers while the draft
model or head stays on this machine. The engine side needs a libllama built with the RPC backend
(`CMAKE_ARGS="-DGGML_RPC=on"` when pip builds llama-cpp-python); `rpc_supported()` says whether the
one in use has it.

`build_rpc_server` builds the server (about a minute on 2 cores, once), `find_rpc_server` finds it, and
`RpcServer` runs one as a child process (tests, benchmarks and `pyspec rpc-server`).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from .engine import rpc_supported
from .errors import SpecError
from .fetch import Cache

log = logging.getLogger(__name__)

RPC_SERVER = "ggml-rpc-server"
RPC_SERVER_ENV = "PYSPEC_RPC_SERVER"  # a prebuilt ggml-rpc-server to use instead of the cache's
DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
BUILD_OPTIONS = ("-DGGML_RPC=ON",)

__all__ = ["RPC_SERVER", "RpcServer", "RpcServerError", "build_rpc_server", "find_rpc_server", "free_port",
           "rpc_supported"]


class RpcServerError(SpecError, RuntimeError):
    """llama.cpp's rpc-server could not be found, built or started."""


def rpc_server_dir(cache: Cache | None = None) -> Path:
    """Where build_rpc_server puts the server: beside llama.cpp's tools in pyspec's cache."""
    from .bench.llamacpp import tools_dir

    return tools_dir(cache).parent / "rpc"


def find_rpc_server(cache: Cache | None = None) -> Path:
    """$PYSPEC_RPC_SERVER if set, else the cache's build. Raises RpcServerError saying how to build it."""
    given = os.environ.get(RPC_SERVER_ENV)
    path = Path(given).expanduser() if given else rpc_server_dir(cache) / RPC_SERVER
    if not os.access(path, os.X_OK):
        where = f"${RPC_SERVER_ENV}" if given else "pyspec's build cache"
        raise RpcServerError(f"llama.cpp's {RPC_SERVER} not found at {path} ({where}); build it once with "
                             "`pyspec rpc-server --build` (needs cmake and a C++ compiler, about a minute on 2 cores)")
    return path


def build_rpc_server(cache: Cache | None = None, *, jobs: int | None = None, force: bool = False) -> Path:
    """Builds ggml-rpc-server from the pinned llama.cpp sdist into rpc_server_dir(cache) unless it is
    there (or force); returns its path. Raises RpcServerError with the build log's tail."""
    from .bench.llamacpp import LlamaCppToolsError, build_targets

    try:
        directory = build_targets((RPC_SERVER,), rpc_server_dir(cache), cache, options=BUILD_OPTIONS, jobs=jobs,
                                  force=force)
    except LlamaCppToolsError as exc:
        raise RpcServerError(str(exc)) from exc
    return directory / RPC_SERVER


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class RpcServer:
    """One ggml-rpc-server child process for as long as the `with` block (or until stop()).

    host, port: where it listens (port None: a free one); threads: its CPU threads (None: its
    default); server: the executable (None: find_rpc_server()). `endpoint` is "host:port" for
    Engine(rpc=...). The server holds no state between clients, but serves one client at a time.
    Never expose it to an untrusted network: llama.cpp's RPC protocol has no authentication."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, *, threads: int | None = None,
                 server: str | os.PathLike[str] | None = None, extra_args: Sequence[str] = (),
                 start_timeout_s: float = 30.0) -> None:
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.server = Path(server) if server is not None else find_rpc_server()
        self.args = [str(self.server), "-H", host, "-p", str(self.port), *(["-t", str(threads)] if threads else []),
                     *extra_args]
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self._output: Any = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "RpcServer":
        """Starts the server and waits until it accepts connections; RpcServerError if it exits or
        does not listen within start_timeout_s (its output ends the message)."""
        # Its output goes to a file, not a pipe nobody reads (it logs every client).
        self._output = tempfile.TemporaryFile()
        self.process = subprocess.Popen(self.args, stdout=self._output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RpcServerError(f"{' '.join(self.args)} exited with status {self.process.returncode}:\n"
                                     f"{self.output()[-2000:]}")
            if _accepts(self.host, self.port):
                log.info("rpc-server listening on %s", self.endpoint)
                return self
            time.sleep(0.1)
        self.stop()
        raise RpcServerError(f"{' '.join(self.args)} did not listen on {self.endpoint} within {self.start_timeout_s:g} s")

    def output(self) -> str:
        """What the server printed so far."""
        if self._output is None:
            return ""
        self._output.seek(0)
        return self._output.read().decode(errors="replace")

    def stop(self) -> None:
        """Terminates the server (killed after 5 s) and waits for it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> "RpcServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

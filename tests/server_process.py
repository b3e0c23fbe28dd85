"""A real `pyspec serve` in a subprocess on 127.0.0.1, for the server tests (tests/ is on sys.path)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """Starts `pyspec serve ARGS` and waits for /health; stop() sends SIGINT (a clean shutdown:
    the pool file is saved) and waits."""

    def __init__(self, *args: str, log_path: Path, timeout: float = 120.0) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pyspec.cli", "-v", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
            # Not the repository root: `python -m` puts the working directory first on sys.path, and there the
            # source tree (without the built extension) would shadow the installed package.
            cwd=log_path.parent,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pyspec serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pyspec serve did not answer /health within {timeout} s:\n{self.log()}")
            time.sleep(0.2)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, labels: str = "") -> float:
        """The value of one sample of /metrics (0 when absent)."""
        for line in httpx.get(self.base_url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + labels + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return int(self.process.returncode)

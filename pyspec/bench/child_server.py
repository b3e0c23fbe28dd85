"""OpenAI-compatible servers run as child processes by the server benchmarks (`pyspec serve`,
llama.cpp's `llama-server`, llama-cpp-python's server), and the commands that start them on one
GGUF with the same threads and context."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import httpx


class ChildServer:
    """Starts `command` (which must listen on 127.0.0.1:`port`), waits until GET /v1/models
    answers 200 and reads the first model id; stop() sends SIGINT and waits, then kills. The
    child's output goes to `log_dir`/`name`.log. A context manager."""

    def __init__(self, name: str, command: Sequence[str], port: int, log_dir: Path, *, timeout: float = 600.0,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = Path(log_dir) / f"{name}.log"
        self._log = open(self.log_path, "w")
        # cwd: not a pyspec checkout, whose source tree (without the built extension) would
        # shadow the installed package for `python -m pyspec.cli`.
        self.process = subprocess.Popen(list(command), stdout=self._log, stderr=subprocess.STDOUT,
                                        cwd=cwd or log_dir)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                self._log.close()
                raise RuntimeError(f"{name} exited with {self.process.returncode}; see {self.log_path}")
            try:
                reply = httpx.get(self.base_url + "/v1/models", timeout=2)
                if reply.status_code == 200:
                    self.model = str(reply.json()["data"][0]["id"])
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not answer /v1/models within {timeout:.0f} s; see {self.log_path}")
            time.sleep(0.5)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not self._log.closed:
            self._log.close()
        return int(self.process.returncode)

    def __enter__(self) -> "ChildServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def add_server_bench_options(p: argparse.ArgumentParser) -> None:
    """--target, --draft, --threads and --n-ctx: what every server of a server benchmark shares."""
    from ..config import DEFAULT_DRAFT, DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET, help=f"registry name or GGUF path (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"pyspec's draft model (default {DEFAULT_DRAFT}; '' none)")
    p.add_argument("--threads", type=int, default=2, help="threads of every server (default 2)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context of every server (default 4096)")


def pyspec_command(target: str, draft: str | None, port: int, *, threads: int, n_ctx: int, method: str = "auto",
                   extra: Sequence[str] = ()) -> list[str]:
    """`pyspec serve` on `target` (with `draft` when given), served as model "target"."""
    return [sys.executable, "-m", "pyspec.cli", "serve", "--target", target, *(["--draft", draft] if draft else []),
            "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads), "--n-ctx", str(n_ctx),
            "--method", method, "--model-name", "target", *extra]


def llama_server_command(binary: str | Path, target: str, port: int, *, threads: int, n_ctx: int,
                         spec_type: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """llama.cpp's llama-server on `target` with its defaults otherwise (slots, Jinja templates,
    flash attention `auto`), served as model "target"; `spec_type` turns on one of its own
    draft-model-free speculation types (e.g. ngram-mod)."""
    command = [str(binary), "-m", target, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "-c", str(n_ctx), "--alias", "target", "--no-webui"]
    if spec_type:
        command += ["--spec-type", spec_type]
    return command + list(extra)


def llama_cpp_python_command(target: str, port: int, *, threads: int, n_ctx: int) -> list[str]:
    """llama-cpp-python's server (`python -m llama_cpp.server`) on `target`, served as model "target"."""
    return [sys.executable, "-m", "llama_cpp.server", "--model", target, "--host", "127.0.0.1", "--port", str(port),
            "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx),
            "--model_alias", "target"]

"""Runs a piece of Python in a fresh interpreter (imported by test modules; tests/ is on sys.path).

For checks whose failure mode is a crash of the process (llama.cpp's aborts, a use after free): in
a child process the crash fails one test with its exit status instead of killing the test run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any


def run_python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs `code` (dedented) with sys.argv[1:] = args; returns the finished process."""
    # cwd: tests/, not the repository root, where `python -c` would import the source tree
    # (without the built extension) instead of the installed package.
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).parent)


def describe_exit(proc: subprocess.CompletedProcess[str]) -> str:
    """The exit status in words (a negative code is the signal that ended the child) plus stderr's end."""
    code = proc.returncode
    status = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    return f"{status}\n--- stderr (end) ---\n{proc.stderr[-3000:]}"


def run_json(code: str, *args: str, timeout: float = 300) -> Any:
    """Runs `code`, which must print one JSON document as its last stdout line; returns it.

    Fails the calling test (AssertionError naming the exit status) when the child does not exit 0.
    """
    proc = run_python(code, *args, timeout=timeout)
    assert proc.returncode == 0, describe_exit(proc)
    lines = proc.stdout.strip().splitlines()
    assert lines, "the child printed nothing\n" + describe_exit(proc)
    return json.loads(lines[-1])

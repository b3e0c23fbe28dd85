"""Builds and runs the C++ unit tests (tests/cpp, ctest) against the installed libllama."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not on PATH")
def test_cpp_unit_tests(tmp_path: Path) -> None:
    site = sysconfig.get_paths()["purelib"]
    if not (Path(site) / "lib" / "cmake" / "llama").is_dir():
        pytest.skip("llama-cpp-python's CMake package is not in this environment")
    build = tmp_path / "build"
    run = lambda *cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=900)  # noqa: E731
    cfg = run("cmake", "-S", str(ROOT), "-B", str(build), "-DPYSPEC_BUILD_TESTS=ON", f"-DCMAKE_PREFIX_PATH={site}",
              f"-DPython_EXECUTABLE={sys.executable}")
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    bld = run("cmake", "--build", str(build), "--target", "test_verify", "test_lookup", "test_tree", "test_phrase_pool", "test_schedule",
              "test_cost_model", "-j2")
    assert bld.returncode == 0, bld.stdout[-3000:] + bld.stderr[-3000:]
    test = run("ctest", "--test-dir", str(build), "--output-on-failure")
    assert test.returncode == 0, test.stdout[-5000:] + test.stderr[-3000:]
    assert "100% tests passed" in test.stdout

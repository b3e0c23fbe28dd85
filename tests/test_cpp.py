"""Builds and runs the C++ unit tests (tests/cpp, ctest) against the installed libllama.

cmake comes with the test dependencies (pyproject's `test` extra) and llama-cpp-python installs
its CMake package, so a missing one is an error of the environment, reported as a failure rather
than a skip.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPP_TESTS = ["test_verify", "test_lookup", "test_tree", "test_phrase_pool", "test_schedule", "test_cost_model",
             "test_pool_file", "test_model", "test_model_faults"]


def test_cpp_unit_tests(tmp_path: Path, tiny_target: str) -> None:
    cmake, ctest = shutil.which("cmake"), shutil.which("ctest")
    assert cmake and ctest, "cmake/ctest not on PATH: install the test extra (pip install -e '.[test]')"
    site = sysconfig.get_paths()["purelib"]
    assert (Path(site) / "lib" / "cmake" / "llama").is_dir(), f"llama-cpp-python's CMake package is not in {site}"
    build = tmp_path / "build"
    run = lambda *cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=900)  # noqa: E731
    cfg = run(cmake, "-S", str(ROOT), "-B", str(build), "-DPYSPEC_BUILD_TESTS=ON", f"-DCMAKE_PREFIX_PATH={site}",
              f"-DPython_EXECUTABLE={sys.executable}", f"-DPYSPEC_TEST_MODEL={tiny_target}")
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    bld = run(cmake, "--build", str(build), "--target", *CPP_TESTS, "-j2")
    assert bld.returncode == 0, bld.stdout[-3000:] + bld.stderr[-3000:]
    test = run(ctest, "--test-dir", str(build), "--output-on-failure")
    assert test.returncode == 0, test.stdout[-5000:] + test.stderr[-3000:]
    assert "100% tests passed" in test.stdout
    assert f"out of {len(CPP_TESTS)}" in test.stdout, test.stdout  # every test was registered and ran

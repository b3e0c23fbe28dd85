"""benchmarks/gpu/gpu_check.py on the CPU backend, as CI can run it: pack (trimmed llama.cpp tree,
wheels, small shapes), then build libllama from that tree and pyspec against it, run two test
files with the built package, write and time the small shape models and print auto's plan.
On a GPU machine the same script runs without --cpu (README, "CUDA")."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "gpu_check.py"


def test_gpu_check_runs_end_to_end_on_the_cpu_backend(tmp_path: Path) -> None:
    work, out = tmp_path / "gpu", tmp_path / "out"
    pack = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(work), "pack", "--quick"],
                          capture_output=True, text=True, timeout=600)
    assert pack.returncode == 0, pack.stdout[-3000:] + pack.stderr[-3000:]
    manifest = json.loads((work / "carry" / "manifest.json").read_text())
    tree = work / "carry" / "llama.cpp.tar.xz"
    assert tree.stat().st_size < 8e6  # trimmed: the whole tree is ~60 MB
    # Every file extracts under llama.cpp/, also those whose long path the sdist keeps in a pax
    # header (the CUDA build's template instances: a stale header once sent them elsewhere).
    with tarfile.open(tree) as tar:
        names = tar.getnames()
    assert names and all(n.startswith("llama.cpp/") for n in names), [n for n in names if not n.startswith("llama.cpp/")][:3]
    assert "llama.cpp/ggml/src/ggml-cuda/template-instances/fattn-vec-instance-f16-f16.cu" in names
    assert sorted(w.name.split("-")[0] for w in (work / "carry" / "wheels").glob("*.whl")) == \
        ["gguf", "nanobind", "packaging", "pathspec", "scikit_build_core"]

    run = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(work), "run", "--cpu", "--quick", "--out", str(out)],
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    assert "all steps passed" in run.stdout
    # pyspec was built against the libllama this script built, and the tests ran with it.
    site = work / "work" / "site-cpu"
    assert (site / "llama_cpp" / "lib" / "libllama.so").exists()
    assert any(site.joinpath("pyspec").glob("_core*.so"))
    # ... and the steps imported that build, not an (editable) pyspec of the running environment.
    assert f"pyspec from {site / 'pyspec'}" in (out / "build-pyspec.log").read_text()
    tests_log = (out / "tests.log").read_text()
    assert " passed" in tests_log and " failed" not in tests_log
    curves = json.loads((out / "curves-cpu.json").read_text())["curves"]
    assert set(curves) == {"target", "draft"} and all(len(c["ms"]) == len(c["n_tokens"]) > 1 for c in curves.values())
    plan = (out / "plan.md").read_text()
    assert "| alpha |" in plan and "gamma" in plan
    assert manifest["quick"] is True and "model" not in manifest


def test_the_build_avoids_a_compiler_that_links_libstdcxx_statically(tmp_path: Path, monkeypatch) -> None:
    """The CUDA image's $CXX (a wrapper around GCC) links libstdc++ into every shared library:
    libllama, libggml-cuda and _core each carried a copy, and llama.cpp's tokenizer crashed
    under pytest. A wrapper that does the same here must be passed over for g++."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_steps
    finally:
        sys.path.remove(str(SCRIPT.parent))
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ on PATH")
    static = tmp_path / "static-g++"
    static.write_text(f'#!/bin/sh\nexec {gxx} -static-libstdc++ "$@"\n')
    static.chmod(0o755)
    assert not gpu_steps._links_shared_libstdcxx(str(static), tmp_path / "a")
    assert gpu_steps._links_shared_libstdcxx(gxx, tmp_path / "b")

    monkeypatch.setenv("CXX", str(static))
    chosen = gpu_steps.compiler_env(tmp_path / "c")
    assert chosen["CXX"] == gxx and chosen["CUDAHOSTCXX"] == gxx
    assert Path(chosen["CC"]).name == "gcc" and Path(chosen["CC"]).parent == Path(gxx).parent
    monkeypatch.setenv("CXX", gxx)
    assert gpu_steps.compiler_env(tmp_path / "d") == {}  # the environment's own compiler is fine

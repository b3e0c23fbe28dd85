"""The C API as an application meets it: libpyspec configured, built and installed into a prefix
with cmake, the examples built against that prefix as an outside project (find_package(pyspec)),
run on the tiny models; the boundary test (tests/cpp/test_c_api.cpp); and the API's shape checked
from a second language, Python's ctypes.

One build serves the module. It lives in build/c_api_test of the repository (PYSPEC_C_API_BUILD
overrides), so that a second run only relinks; the install prefix is a fresh temporary directory.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyspec._models.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
SITE = sysconfig.get_paths()["purelib"]
TIMEOUT = 1800


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


@dataclass
class Installed:
    build: Path       # the library's build tree (with tests/cpp/test_c_api)
    prefix: Path      # where cmake --install put it
    examples: Path    # the examples' build tree, an outside project
    target: str       # tiny target model
    other_vocab: str  # tiny model with another vocabulary

    @property
    def library(self) -> Path:
        return self.prefix / "lib" / "libpyspec.so.1"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, tiny_target: str) -> Installed:
    cmake = shutil.which("cmake")
    assert cmake, "cmake not on PATH: install the test extra (pip install -e '.[test]')"
    tmp = tmp_path_factory.mktemp("c_api")
    other_vocab = str(build_tiny_model(tmp / "other_vocab.gguf", seed=0, n_merges=150))
    build = Path(os.environ.get("PYSPEC_C_API_BUILD", ROOT / "build" / "c_api_test"))
    prefix, examples = tmp / "prefix", tmp / "examples"
    run(cmake, "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={SITE}",
        f"-DCMAKE_INSTALL_PREFIX={prefix}", "-DCMAKE_INSTALL_LIBDIR=lib", "-DPYSPEC_BUILD_SHARED=ON",
        "-DPYSPEC_BUILD_TESTS=ON", f"-DPYSPEC_TEST_MODEL={tiny_target}",
        f"-DPYSPEC_TEST_OTHER_VOCAB_MODEL={other_vocab}", f"-DPython_EXECUTABLE={sys.executable}")
    run(cmake, "--build", build, "--target", "pyspec", "test_c_api", "-j2")
    run(cmake, "--install", build)
    # The examples know nothing of this repository: only the installed prefix.
    run(cmake, "-S", ROOT / "examples", "-B", examples, f"-DCMAKE_PREFIX_PATH={prefix}",
        f"-DPYSPEC_EXAMPLE_MODEL={tiny_target}")
    run(cmake, "--build", examples, "-j2")
    return Installed(build, prefix, examples, tiny_target, other_vocab)


def test_install_layout(installed: Installed) -> None:
    prefix = installed.prefix
    for path in ["include/pyspec.h", "lib/libpyspec.so", "lib/libpyspec.so.1", "lib/cmake/pyspec/pyspecConfig.cmake",
                 "lib/cmake/pyspec/pyspecConfigVersion.cmake", "lib/cmake/pyspec/pyspecTargets.cmake",
                 "lib/pkgconfig/pyspec.pc"]:
        assert (prefix / path).exists(), path
    dynamic = run("readelf", "-d", installed.library).stdout
    assert "Library soname: [libpyspec.so.1]" in dynamic
    assert "libllama.so" in dynamic
    # Only the C API is exported: no C++ engine or standard-library symbols.
    symbols = run("nm", "-D", "--defined-only", installed.library).stdout.split("\n")
    names = [line.split()[-1] for line in symbols if line.strip()]
    exported = [n.split("@")[0] for n in names if not n.startswith("PYSPEC_1")]
    assert "pyspec_generate" in exported and "pyspec_engine_load" in exported
    assert all(n.startswith("pyspec_") for n in exported), [n for n in exported if not n.startswith("pyspec_")]



def test_pkg_config_builds_simple(installed: Installed, tmp_path: Path) -> None:
    """An application built with pkg-config's flags instead of CMake."""
    pkg = shutil.which("pkg-config")
    if not pkg:
        pytest.skip("pkg-config is not installed")
    env = dict(os.environ, PKG_CONFIG_PATH=str(installed.prefix / "lib" / "pkgconfig"))
    assert run(pkg, "--modversion", "pyspec", env=env).stdout.strip() == "1.2.0"
    flags = run(pkg, "--cflags", "--libs", "pyspec", env=env).stdout.split()
    assert "-lpyspec" in flags
    libdir = next(f[2:] for f in flags if f.startswith("-L"))
    exe = tmp_path / "simple"
    run("cc", ROOT / "examples" / "simple.c", *flags, f"-Wl,-rpath,{libdir}", "-o", exe)
    out = run(exe, installed.target, "", "def add(a, b):", "8").stdout
    assert "8 generated in" in out


def test_examples_run_on_tiny_models(installed: Installed) -> None:
    simple = run(installed.examples / "simple", installed.target, installed.target, "def add(a, b):", "32").stdout
    assert "method auto, finish: length" in simple
    assert "32 generated in" in simple and "tokens per call" in simple

    stream = run(installed.examples / "stream", installed.target, installed.target, "5").stdout
    assert "-- 5 pieces, finish: cancelled" in stream
    assert "-- next request: finish: length, 16 tokens" in stream

    # The examples' own ctest registration (-DPYSPEC_EXAMPLE_MODEL) passes too.
    ctest = run("ctest", "--test-dir", installed.examples, "--output-on-failure").stdout
    assert "100% tests passed" in ctest and "out of 2" in ctest

    failed = subprocess.run([str(installed.examples / "simple"), "/nonexistent/model.gguf"], capture_output=True,
                            text=True, timeout=60)
    assert failed.returncode == 1
    assert "load failed (model_load)" in failed.stderr and "/nonexistent/model.gguf" in failed.stderr


def test_boundary(installed: Installed, tmp_path: Path) -> None:
    out = run(installed.build / "tests" / "cpp" / "test_c_api", installed.target, installed.other_vocab,
              tmp_path).stdout
    assert "0 failures" in out


# ctypes declarations of the structs the check reads: a mismatch with include/pyspec.h shows as
# wrong values below.
class Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in ("n_prompt_tokens", "n_prompt_cached", "n_generated",
                                                      "n_target_calls", "n_drafted", "n_accepted",
                                                      "n_draft_decodes")] + \
               [(name, ctypes.c_double) for name in ("acceptance_rate", "tokens_per_target_call",
                                                       "tokens_per_second", "t_prefill_ms", "t_draft_ms",
                                                       "t_verify_ms", "t_total_ms")]


class EngineParams(ctypes.Structure):
    _fields_ = [("n_ctx", ctypes.c_int32), ("n_batch", ctypes.c_int32), ("n_threads", ctypes.c_int32),
                ("n_gpu_layers", ctypes.c_int32), ("seed", ctypes.c_uint64), ("pool_capacity", ctypes.c_int64),
                ("prefix_cache", ctypes.c_bool), ("flash_attn", ctypes.c_bool), ("head_path", ctypes.c_char_p)]


def load_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    P = ctypes.c_void_p
    lib.pyspec_version.restype = ctypes.c_char_p
    lib.pyspec_last_error.restype = ctypes.c_char_p
    lib.pyspec_status_name.restype = ctypes.c_char_p
    lib.pyspec_engine_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, P, ctypes.POINTER(P)]
    lib.pyspec_engine_load_rpc.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(EngineParams),
                                           ctypes.c_char_p, ctypes.POINTER(P)]
    lib.pyspec_engine_default_params.restype = EngineParams
    lib.pyspec_generate.argtypes = [P, ctypes.c_char_p, P, P, P, ctypes.POINTER(P)]
    lib.pyspec_generation_text.restype = ctypes.c_char_p
    lib.pyspec_generation_text.argtypes = [P, P]
    lib.pyspec_generation_tokens.restype = ctypes.POINTER(ctypes.c_int32)
    lib.pyspec_generation_tokens.argtypes = [P, ctypes.POINTER(ctypes.c_int32)]
    lib.pyspec_generation_finish_reason.restype = ctypes.c_char_p
    lib.pyspec_generation_finish_reason.argtypes = [P]
    lib.pyspec_generation_stats.restype = Stats
    lib.pyspec_generation_stats.argtypes = [P]
    lib.pyspec_generation_free.argtypes = [P]
    lib.pyspec_engine_free.argtypes = [P]
    lib.pyspec_engine_n_vocab.argtypes = [P]
    return lib


def test_ctypes_shape(installed: Installed) -> None:
    """Load, generate with the defaults (method auto, 256 tokens, greedy), read the stats and the
    error string from Python through the C ABI; the tokens are those of the Python package's
    plain decoding of the same prompt."""
    lib = load_library(installed.library)
    assert lib.pyspec_version().decode() == "1.2.0"

    engine = ctypes.c_void_p()
    missing = b"/nonexistent/target.gguf"
    assert lib.pyspec_engine_load(missing, None, None, ctypes.byref(engine)) == 2  # PYSPEC_ERR_MODEL_LOAD
    assert engine.value is None
    assert lib.pyspec_status_name(2) == b"model_load"
    assert missing in lib.pyspec_last_error()
    assert lib.pyspec_engine_load(installed.target.encode(), installed.other_vocab.encode(), None,
                                  ctypes.byref(engine)) == 3  # PYSPEC_ERR_VOCAB_MISMATCH
    assert b"vocabulary sizes differ" in lib.pyspec_last_error()

    assert lib.pyspec_engine_load(installed.target.encode(), installed.target.encode(), None,
                                  ctypes.byref(engine)) == 0, lib.pyspec_last_error()
    try:
        assert lib.pyspec_engine_n_vocab(engine) > 0
        generation = ctypes.c_void_p()
        prompt = "class Counter:"
        assert lib.pyspec_generate(engine, prompt.encode(), None, None, None, ctypes.byref(generation)) == 0
        n = ctypes.c_int32()
        ptr = lib.pyspec_generation_tokens(generation, ctypes.byref(n))
        tokens = [ptr[i] for i in range(n.value)]
        text = lib.pyspec_generation_text(generation, None).decode()
        reason = lib.pyspec_generation_finish_reason(generation).decode()
        stats = lib.pyspec_generation_stats(generation)
        lib.pyspec_generation_free(generation)
    finally:
        lib.pyspec_engine_free(engine)

    assert reason == "length" and len(tokens) == 256
    assert stats.n_generated == 256 and stats.n_prompt_tokens > 0
    assert 0 < stats.n_target_calls <= 256
    assert stats.tokens_per_target_call == pytest.approx(256 / stats.n_target_calls)
    assert 0.0 <= stats.acceptance_rate <= 1.0 and stats.t_total_ms > 0

    import pyspec

    with pyspec.Engine(installed.target, n_ctx=4096, n_threads=2) as engine_py:
        reference = engine_py.generate(prompt, method="none", max_tokens=256)
    assert tokens == reference.tokens
    assert text == reference.text


def test_ctypes_rpc_load_errors(installed: Installed) -> None:
    """pyspec_engine_load_rpc refuses what cannot work with a status and a message, never an abort:
    no layer for the servers, a malformed endpoint, a library without RPC or a port nobody
    listens on (ggml-rpc itself aborts there); no servers is a plain load."""
    from pyspec.rpc import free_port, rpc_supported

    lib = load_library(installed.library)
    target = installed.target.encode()
    engine = ctypes.c_void_p()
    params = lib.pyspec_engine_default_params()
    assert params.n_gpu_layers == 0 and params.n_ctx == 4096
    assert lib.pyspec_engine_load_rpc(target, None, ctypes.byref(params), b"127.0.0.1:50052", ctypes.byref(engine)) == 1
    assert b"n_gpu_layers=0" in lib.pyspec_last_error() and engine.value is None
    params.n_gpu_layers = -1
    assert lib.pyspec_engine_load_rpc(target, None, ctypes.byref(params), b"nohost", ctypes.byref(engine)) == 1
    assert b"'nohost' is not host:port" in lib.pyspec_last_error()
    endpoint = f"127.0.0.1:{free_port()}".encode()
    assert lib.pyspec_engine_load_rpc(target, None, ctypes.byref(params), endpoint, ctypes.byref(engine)) == 2
    expected = b"cannot reach the RPC server at " + endpoint if rpc_supported() else b"-DGGML_RPC=on"
    assert expected in lib.pyspec_last_error() and engine.value is None
    params.n_gpu_layers = 0
    for servers in (None, b"", b" , "):
        assert lib.pyspec_engine_load_rpc(target, None, ctypes.byref(params), servers, ctypes.byref(engine)) == 0
        lib.pyspec_engine_free(engine)


def test_ctypes_rpc_loopback_equals_local(installed: Installed, rpc_servers) -> None:
    """Through the C ABI, the target on two loopback rpc-servers decodes what it decodes locally."""
    lib = load_library(installed.library)
    params = lib.pyspec_engine_default_params()
    params.n_ctx = 512
    outputs = []
    for servers in (None, ",".join(s.endpoint for s in rpc_servers).encode()):
        params.n_gpu_layers = -1 if servers else 0
        engine, generation = ctypes.c_void_p(), ctypes.c_void_p()
        assert lib.pyspec_engine_load_rpc(installed.target.encode(), None, ctypes.byref(params), servers,
                                          ctypes.byref(engine)) == 0, lib.pyspec_last_error()
        try:
            assert lib.pyspec_generate(engine, b"def add(a, b):", None, None, None, ctypes.byref(generation)) == 0
            n = ctypes.c_int32()
            ptr = lib.pyspec_generation_tokens(generation, ctypes.byref(n))
            outputs.append([ptr[i] for i in range(n.value)])
            lib.pyspec_generation_free(generation)
        finally:
            lib.pyspec_engine_free(engine)
    assert len(outputs[0]) == 256 and outputs[0] == outputs[1]

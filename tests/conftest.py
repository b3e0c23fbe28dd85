"""Shared fixtures: tiny random-weight GGUF models built at test time (deterministic)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from pyspec import _core
from pyspec._models.tiny import build_tiny_model

TARGET_SEED = 0
Q4_0 = 2  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_0

# Cost curves measured by tests (method "auto") stay out of the user's cache; subprocesses
# (CLI tests) inherit the variable.
os.environ.setdefault("PYSPEC_CALIBRATION_DIR", tempfile.mkdtemp(prefix="pyspec-calibration-"))
# So do the draft heads remembered per target (pyspec.head.known): an Engine made without head=
# loads the one known for its target, and a user's own would change what tests measure. A test
# that remembers a head points PYSPEC_HEADS at a directory of its own.
os.environ["PYSPEC_HEADS"] = tempfile.mkdtemp(prefix="pyspec-heads-")
# Flash attention off unless a test asks: Engine's default, "auto", picks it by timing, and a choice
# that changes with the machine's load would change the numerics the tests compare.
# tests/test_flash_attn.py exercises "auto" itself.
os.environ["PYSPEC_FLASH_ATTN"] = "off"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def tiny_target(tiny_dir: Path) -> str:
    return str(build_tiny_model(tiny_dir / "target.gguf", seed=TARGET_SEED))


@pytest.fixture(scope="session")
def tiny_drafts(tiny_dir: Path, tiny_target: str) -> dict[str, str]:
    """Three drafts over the target's vocabulary: identical, independent, perturbed copy."""
    return {
        "identical": tiny_target,
        "independent": str(build_tiny_model(tiny_dir / "independent.gguf", seed=TARGET_SEED + 10)),
        "perturbed": str(
            build_tiny_model(tiny_dir / "perturbed.gguf", seed=TARGET_SEED + 100, base_seed=TARGET_SEED, perturb=0.1)
        ),
    }


@pytest.fixture(scope="session")
def engines(tiny_target: str, tiny_drafts: dict[str, str]):
    """One engine per draft kind, shared by the session (loading is the slow part)."""
    import pyspec

    made = {kind: pyspec.Engine(tiny_target, draft=path, n_ctx=1024, n_threads=2) for kind, path in tiny_drafts.items()}
    yield made
    for engine in made.values():
        engine.close()


@pytest.fixture(scope="session")
def smol_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-block draft cut from SmolLM2-135M (real weights; for tests marked `model`)."""
    from pyspec.models import derive_draft

    return derive_draft("smollm2-135m-instruct", 4, tmp_path_factory.mktemp("smol_draft") / "smol4.gguf")


@pytest.fixture(scope="session")
def rpc_servers():
    """Two llama.cpp rpc-servers on loopback (2 threads each) for the session. Skips, saying why,
    where this libllama has no RPC backend or ggml-rpc-server is not built; PYSPEC_REQUIRE_RPC=1
    turns that into a failure (scripts/rpc_check.sh sets it)."""
    from pyspec.rpc import RpcServer, RpcServerError, find_rpc_server, rpc_supported

    why = None
    if not rpc_supported():
        why = "this libllama has no RPC backend (CMAKE_ARGS=-DGGML_RPC=on when building llama-cpp-python)"
    else:
        try:
            find_rpc_server()
        except RpcServerError as exc:
            why = str(exc)
    if why is not None:
        if os.environ.get("PYSPEC_REQUIRE_RPC") == "1":
            pytest.fail(f"PYSPEC_REQUIRE_RPC=1 but {why}")
        pytest.skip(why)
    with RpcServer(threads=2) as first, RpcServer(threads=2) as second:
        yield [first, second]


@pytest.fixture(scope="session")
def q4_target(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny model with Q4_0 projections (widths multiples of 32 and of 8 rows, as ggml needs)."""
    folder = tmp_path_factory.mktemp("repack")
    f32 = build_tiny_model(folder / "wide.gguf", seed=5, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    out = folder / "wide-q4_0.gguf"
    _core.quantize_model(str(f32), str(out), Q4_0, [])
    return str(out)

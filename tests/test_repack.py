"""Engine(repack=...): the three modes, and "weights" (ggml's weight repacking without its AMX
buffer type) on a tiny model quantized to a type ggml repacks on x86."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pyspec
from pyspec.engine import REPACK_MODES, cpu_has_amx, repack_mode
from pyspec.errors import InvalidArgumentError


def test_repack_mode_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert repack_mode(True) == "all" and repack_mode(False) == "off"
    for mode in REPACK_MODES:
        assert repack_mode(mode) == mode
    monkeypatch.setattr(pyspec.engine, "cpu_has_amx", lambda: True)
    assert repack_mode(None) == "weights"
    monkeypatch.setattr(pyspec.engine, "cpu_has_amx", lambda: False)
    assert repack_mode(None) == "all"
    with pytest.raises(InvalidArgumentError, match="repack must be .*'amx'"):
        repack_mode("amx")


def _has_avx2() -> bool:
    """Whether the CPU backend (the libllama the engine links) runs AVX2 kernels."""
    import llama_cpp

    return b"AVX2 = 1" in llama_cpp.llama_print_system_info()


def test_weights_mode_repacks_only_what_ggml_repacks(q4_target: str, tiny_target: str) -> None:
    """Q4_0 projections go to CPU_REPACK where the CPU has AVX2; f32 weights never do; "off" and
    "all" place nothing by name (all: llama.cpp's own choice)."""
    with pyspec.Engine(q4_target, n_ctx=256, n_threads=2, repack="weights") as engine:
        assert engine.repack_mode == "weights" and engine.repack
        n_blocks = engine._core.describe()[1]
        if _has_avx2():
            # the seven projections of every block (Q4_0; the tiny model ties its output matrix)
            assert engine._core.n_repacked == 7 * n_blocks
        else:
            assert engine._core.n_repacked == 0
    with pyspec.Engine(q4_target, n_ctx=256, n_threads=2, repack="off") as engine:
        assert engine._core.n_repacked == 0 and not engine.repack
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2, repack="weights") as engine:
        assert engine._core.n_repacked == 0  # f32: nothing ggml repacks


@pytest.mark.skipif(not _has_avx2(), reason="ggml repacks Q4_0 on x86 only with AVX2")
def test_weights_mode_computes_what_plain_kernels_compute(q4_target: str) -> None:
    """Repacked Q4_0 matmuls give the logits of the plain Q4_0 kernels up to rounding, one token and
    batched; greedy speculative output equals plain greedy output within the mode."""
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n" * 3
    logits = {}
    for mode in ("weights", "off"):
        with pyspec.Engine(q4_target, n_ctx=512, n_threads=2, repack=mode) as engine:
            tokens = engine.tokenize(prompt)
            logits[mode] = engine.evaluate(tokens, all_rows=True)
            if mode == "weights":
                plain = engine.generate(prompt, max_tokens=48, method="none")
                for method in ("lookup", "auto"):
                    r = engine.generate(prompt, max_tokens=48, method=method)
                    assert r.tokens == plain.tokens, method
    diff = np.abs(logits["weights"] - logits["off"])
    scale = np.abs(logits["off"]).max()
    assert diff.max() <= 1e-2 * scale, (diff.max(), scale)
    # not the same numbers bit for bit: the repacked kernels ran
    assert diff.max() > 0.0


@pytest.mark.skipif(not cpu_has_amx(), reason="the default differs only on CPUs with AMX")
def test_default_on_amx_is_weights(q4_target: str) -> None:
    with pyspec.Engine(q4_target, n_ctx=256, n_threads=2) as engine:
        assert engine.repack_mode == "weights" and engine._core.n_repacked > 0


def test_calibration_key_tells_modes_apart(q4_target: str) -> None:
    """Curves measured under one mode are never used under another ("all"/"off" keep the
    booleans of caches written before the modes existed)."""
    from pyspec import calibration

    keys = {}
    for mode in ("weights", "off"):
        with pyspec.Engine(q4_target, n_ctx=256, n_threads=2, repack=mode) as engine:
            keys[mode] = calibration.cache_key(engine, None)
    assert keys["weights"]["repack"] == "weights" and keys["off"]["repack"] is False
    assert calibration.cache_file(keys["weights"]) != calibration.cache_file(keys["off"])


def test_calibration_key_tells_huge_pages_apart(q4_target: str) -> None:
    """A curve timed with huge pages is not used without them (and the other way round); the
    key with them is the one caches written before the key named them hold."""
    from pyspec import calibration

    keys = {}
    for huge in (True, False):
        with pyspec.Engine(q4_target, n_ctx=256, n_threads=2, huge_pages=huge) as engine:
            keys[huge] = calibration.cache_key(engine, None)
    assert "huge_pages" not in keys[True] and keys[False]["huge_pages"] is False
    assert calibration.cache_file(keys[True]) != calibration.cache_file(keys[False])


def test_flash_attention_reaches_llama_cpp(q4_target: str) -> None:
    """Engine(flash_attn=True) runs llama.cpp's flash attention: the same batch gives other
    logits (slightly: the kernels accumulate differently, docs/numerics.md) than without it, and
    the same logits again with it; the calibration key keeps its curve apart, and the key without
    it is the one caches written before the key named it hold."""
    from pyspec import calibration

    tokens = list(range(10, 50))
    rows, keys = {}, {}
    for fa in (False, True, True):
        with pyspec.Engine(q4_target, n_ctx=256, n_threads=2, flash_attn=fa) as engine:
            assert engine.flash_attn is fa and engine.target_settings()["flash_attn"] is fa
            logits = engine.evaluate(tokens, all_rows=True)
            if fa in rows:
                np.testing.assert_array_equal(logits, rows[fa])  # deterministic: the difference is the kernel
            rows[fa], keys[fa] = logits, calibration.cache_key(engine, None)
    diff = np.abs(rows[True] - rows[False])
    assert 0 < diff.max() < 1.0, diff.max()
    assert "flash_attn" not in keys[False] and keys[True]["flash_attn"] is True
    assert calibration.cache_file(keys[True]) != calibration.cache_file(keys[False])


def test_tools_repack_only_when_built_without_amx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspec.bench import llamacpp

    monkeypatch.setattr(llamacpp, "cpu_has_amx", lambda: True)
    assert not llamacpp.tools_can_repack(tmp_path)
    assert llamacpp.tools_dir().parent.name.endswith("-noamx")
    (tmp_path / llamacpp.AMX_OFF_MARKER).write_text("built with -mno-amx-tile\n")
    assert llamacpp.tools_can_repack(tmp_path)
    monkeypatch.setattr(llamacpp, "cpu_has_amx", lambda: False)
    assert llamacpp.tools_can_repack(tmp_path / "elsewhere")
    assert not llamacpp.tools_dir().parent.name.endswith("-noamx")


def _thp_available() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not _thp_available(), reason="needs Linux transparent huge pages (not 'never')")
def test_huge_pages_are_asked_for_the_engines_buffers(tiny_target: str) -> None:
    """The context's KV cache (a few MiB at n_ctx 4096) is advised MADV_HUGEPAGE (the "hg" VmFlag
    of /proc/self/smaps) with huge_pages on, and nothing is without it. In a fresh process: in the
    test run's own, allocations can come from memory an earlier engine already had advised."""
    from isolated import run_json

    counts = run_json("""
        import json, sys
        import pyspec

        def advised():
            with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
                return sum(1 for line in f if line.startswith("VmFlags:") and "hg" in line.split()[1:])

        counts = [advised()]
        without = pyspec.Engine(sys.argv[1], n_ctx=4096, n_threads=2, huge_pages=False)
        counts.append(advised())
        with_pages = pyspec.Engine(sys.argv[1], n_ctx=4096, n_threads=2)  # huge_pages defaults on
        counts.append(advised())
        assert with_pages.huge_pages and not without.huge_pages
        print(json.dumps(counts))
    """, tiny_target)
    assert counts[1] == counts[0] and counts[2] > counts[1], counts


def test_target_settings_rebuild_the_target_as_it_runs(q4_target: str) -> None:
    """Engine.target_settings: an engine built from them runs the target the same way (what
    bench's one-token gap evaluations rely on), whatever the first engine was given."""
    with pyspec.Engine(q4_target, n_ctx=512, n_threads=1, repack="off", huge_pages=False) as engine:
        settings = engine.target_settings()
        assert settings == {"n_ctx": 512, "n_threads": 1, "n_gpu_layers": engine.n_gpu_layers, "repack": "off",
                            "huge_pages": False, "flash_attn": False, "rpc": ()}
        with pyspec.Engine(engine.target_path, **settings, n_batch=1, prefix_cache=False) as twin:
            assert twin.target_settings() == settings

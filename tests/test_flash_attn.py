"""Flash attention decided by measurement (Engine(flash_attn="auto"), the default): the mode's
parsing, the choice from timings, the cached decision and that it reaches llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import pyspec
from pyspec import _core, calibration
from pyspec.bench.llamacpp_run import ToolSettings, _common_args
from pyspec.errors import InvalidArgumentError


@pytest.fixture()
def decisions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty calibration directory and flash attention left to the engine's default."""
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path))
    monkeypatch.delenv(calibration.FLASH_ATTN_ENV, raising=False)
    return tmp_path


def test_the_mode_is_auto_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(calibration.FLASH_ATTN_ENV, raising=False)
    assert calibration.flash_attn_mode(None) == "auto"
    assert (calibration.flash_attn_mode(True), calibration.flash_attn_mode(False)) == ("on", "off")
    assert calibration.flash_attn_mode("Off") == "off"
    monkeypatch.setenv(calibration.FLASH_ATTN_ENV, " ON ")
    assert calibration.flash_attn_mode(None) == "on"
    assert calibration.flash_attn_mode("auto") == "auto"  # an argument wins over the variable
    with pytest.raises(InvalidArgumentError, match=r"flash_attn='fast' is not one of auto, on, off"):
        calibration.flash_attn_mode("fast")
    monkeypatch.setenv(calibration.FLASH_ATTN_ENV, "1")
    with pytest.raises(InvalidArgumentError, match=r"PYSPEC_FLASH_ATTN='1'"):
        calibration.flash_attn_mode(None)


def _timing(depth: int, ratio: float, batch_ratio: float, ms: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)) -> object:
    off, on, batch_off, batch_on = ms
    return _core.FlashAttentionTiming(depth, ratio, batch_ratio, ms_off=off, ms_on=on, batch_ms_off=batch_off,
                                      batch_ms_on=batch_on)


def test_the_choice_is_made_for_a_typical_request() -> None:
    """The per-round paired ratios on / off of a plain step and of a verification, each a straight
    line through its two timed depths, read at a typical request's depth (320 tokens, or half a
    smaller window: not half a large window, which few requests fill) and weighed alike (their
    geometric mean); flash attention is chosen only where that is at least FLASH_ATTN_MARGIN
    cheaper."""
    assert calibration.flash_attn_depths(4096) == (256, 1024)
    assert calibration.flash_attn_depths(256) == (32, 128)
    assert [calibration.flash_attn_at_depth(n) for n in (256, 640, 1024, 4096, 32768)] == [128, 320, 320, 320, 320]
    at_4096 = calibration.flash_attn_at_depth(4096)
    choose = calibration.FlashAttnDecision.choose
    # SmolLM2-135M's measured paired ratios on the Zen 4 (4,096-token window, one decision each):
    # in a busy spell flash attention made plain steps 7% and short verifications 9% cheaper; in
    # a quiet one plain steps were level and verifications dearer (1.2x at 1,024 tokens).
    busy = choose([_timing(256, 0.931, 0.908), _timing(1024, 0.874, 1.037)], at_4096)
    assert busy.on and busy.plain_ratio == pytest.approx(0.931 - 0.057 / 12) and busy.ratio_at_depth < 0.93
    quiet = choose([_timing(256, 1.004, 1.007), _timing(1024, 0.972, 1.175)], at_4096)
    assert not quiet.on and quiet.verify_ratio == pytest.approx(1.007 + 0.168 / 12)
    assert quiet.ratio_at_depth == pytest.approx((quiet.plain_ratio * quiet.verify_ratio) ** 0.5)
    # ... and read at half the window, the dearer long verifications make even the busy one off
    assert not choose([_timing(256, 0.931, 0.908), _timing(1024, 0.874, 1.037)], 2048).on
    # Qwen2.5-Coder-1.5B: plain steps 4% and verifications 1.5% dearer with it: off
    assert not choose([_timing(256, 1.042, 1.011), _timing(1024, 0.987, 1.058)], at_4096).on
    # The paired ratios decide, not the medians: a slow spell in the rounds of one setting moves its
    # median (here flash attention's decodes look 30% dearer) but not the ratio within each round.
    spell = choose([_timing(256, 0.95, 0.95, (10.0, 13.0, 40.0, 52.0)),
                    _timing(1024, 0.95, 0.95, (12.0, 15.6, 48.0, 62.4))], at_4096)
    assert spell.on and spell.ms_on == (13.0, 15.6) and spell.batch_ms_off == (40.0, 48.0)
    # 1% cheaper is within the margin: off stays; 3% cheaper: on
    assert calibration.FLASH_ATTN_MARGIN == 0.02
    assert not choose([_timing(256, 0.99, 0.99), _timing(1024, 0.99, 0.99)], 512).on
    assert choose([_timing(256, 0.97, 0.97), _timing(1024, 0.97, 0.97)], 512).on
    # a plain step cheaper and a verification dearer by the same factor are level: off
    assert not choose([_timing(256, 0.9, 1 / 0.9), _timing(1024, 0.9, 1 / 0.9)], 512).on


def _cached_files(folder: Path) -> list[dict]:
    out = []
    for f in folder.glob("*.json"):
        data = json.loads(f.read_text(encoding="utf-8"))
        if data["key"].get("kind") == "flash_attn":
            out.append({"file": f, **data})
    return out


def test_auto_times_both_once_and_follows_the_cached_choice(q4_target: str, decisions: Path) -> None:
    tokens = list(range(10, 50))
    rows = {}
    for fa in (False, True):
        with pyspec.Engine(q4_target, n_ctx=256, n_threads=2, flash_attn=fa) as engine:
            assert engine.flash_attn_mode == ("on" if fa else "off") and engine.flash_attn_decision is None
            rows[fa] = engine.evaluate(tokens, all_rows=True)
    assert np.abs(rows[True] - rows[False]).max() > 0  # the two settings are told apart by their logits
    assert not _cached_files(decisions)  # forced settings time nothing

    with pyspec.Engine(q4_target, n_ctx=256, n_threads=2) as engine:
        measured = engine.flash_attn_decision
        assert engine.flash_attn_mode == "auto" and measured is not None
        assert measured.depths == calibration.flash_attn_depths(256) and measured.at_depth == 128
        assert min(measured.ms_off + measured.ms_on + measured.batch_ms_off + measured.batch_ms_on) > 0
        assert min(measured.ratio + measured.batch_ratio) > 0
        assert measured.on is (measured.ratio_at_depth < 1 - calibration.FLASH_ATTN_MARGIN)
        assert engine.flash_attn is measured.on and engine.target_settings()["flash_attn"] is measured.on
        np.testing.assert_array_equal(engine.evaluate(tokens, all_rows=True), rows[measured.on])
    (cached,) = _cached_files(decisions)
    assert cached["on"] is measured.on and tuple(cached["ms_off"]) == measured.ms_off
    assert cached["key"]["n_ctx"] == 256 and cached["key"]["bytes"] == Path(q4_target).stat().st_size

    # A cached decision is followed as it is (values no timing would give), either way.
    for on in (True, False):
        cached_file: Path = cached["file"]
        data = {k: v for k, v in cached.items() if k != "file"}
        cached_file.write_text(json.dumps({**data, "ms_off": [1.0, 2.0], "ms_on": [3.0, 4.0],
                                           "batch_ms_off": [5.0, 6.0], "batch_ms_on": [7.0, 8.0],
                                           "ratio": [3.0, 2.0], "batch_ratio": [1.4, 1.33], "plain_ratio": 2.5,
                                           "verify_ratio": 1.35, "ratio_at_depth": 1.8, "on": on}),
                               encoding="utf-8")
        with pyspec.Engine(q4_target, n_ctx=256, n_threads=2) as engine:
            assert engine.flash_attn is on
            assert engine.flash_attn_decision == calibration.FlashAttnDecision(
                (32, 128), (1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (7.0, 8.0), (3.0, 2.0), (1.4, 1.33), 128, 2.5, 1.35,
                1.8, on)
            np.testing.assert_array_equal(engine.evaluate(tokens, all_rows=True), rows[on])
            # the cost curve of a flash-attention context is kept apart
            assert ("flash_attn" in calibration.cache_key(engine, None)) is on
    assert len(_cached_files(decisions)) == 1

    # Another window is another decision.
    with pyspec.Engine(q4_target, n_ctx=512, n_threads=2) as engine:
        assert engine.flash_attn_decision is not None and engine.flash_attn_decision.at_depth == 256
    assert sorted(c["key"]["n_ctx"] for c in _cached_files(decisions)) == [256, 512]


def test_timing_leaves_the_engine_as_it_was(q4_target: str) -> None:
    with pyspec.Engine(q4_target, n_ctx=256, n_threads=2, flash_attn=False) as engine:
        before = engine.generate("The timing uses contexts of its own", max_tokens=12, method="none").tokens
        near, far = engine._core.time_flash_attention([32, 64], 2, 3, 4)
        assert (near.depth, far.depth, near.rounds, far.rounds) == (32, 64, 3, 3)
        for t in (near, far):
            assert min(t.ms_off, t.ms_on, t.batch_ms_off, t.batch_ms_on, t.ratio, t.batch_ratio) > 0
            assert t.window == 256  # the engine's window: without flash attention the window sets the cost
        assert engine.generate("The timing uses contexts of its own", max_tokens=12, method="none").tokens == before
        for bad in (([0], 2, 1, 4), ([64, 32], 2, 1, 4), ([32, 32], 2, 1, 4), ([], 2, 1, 4)):
            with pytest.raises(InvalidArgumentError, match="depths >= 1 in ascending order"):
                engine._core.time_flash_attention(*bad)
        for bad in (([64], 0, 1, 4), ([64], 2, 0, 4), ([64], 2, 1, 0)):
            with pytest.raises(InvalidArgumentError, match="n_decodes, rounds and batch >= 1"):
                engine._core.time_flash_attention(*bad)
        decided = engine._core.decide_flash_attention(1, 1)
        assert (decided.near.depth, decided.far.depth, decided.at_depth) == (32, 128, 128)
        assert decided.on is (decided.ratio < 1 - calibration.FLASH_ATTN_MARGIN)
        assert engine.generate("The timing uses contexts of its own", max_tokens=12, method="none").tokens == before


def test_timing_takes_the_engines_window_up_to_a_cap(q4_target: str) -> None:
    """A decode without flash attention costs more in a wider window (V is kept transposed, one
    row per channel as long as the window), so the timing runs in the window the engine decodes
    in, up to 4,096 cells; never narrower than the deepest depth timed needs."""
    with pyspec.Engine(q4_target, n_ctx=8192, n_threads=2, flash_attn=False) as engine:
        assert engine._core.time_flash_attention([32], 1, 1, 2)[0].window == 4096
    with pyspec.Engine(q4_target, n_ctx=256, n_threads=2, flash_attn=False) as engine:
        assert engine._core.time_flash_attention([32], 1, 1, 2)[0].window == 256
        assert [t.window for t in engine._core.time_flash_attention([32, 300], 1, 1, 8)] == [309, 309]


def test_llama_cpp_tools_get_their_own_default_or_the_engines_setting(tmp_path: Path) -> None:
    prompt = tmp_path / "p.txt"
    for setting, expected in (("auto", "auto"), (True, "on"), (False, "off")):
        args = _common_args(ToolSettings(model="m.gguf", n_ctx=256, n_threads=2, repack=False, flash_attn=setting),
                            prompt)
        assert args[args.index("-fa") + 1] == expected


def test_calibrate_shows_the_choice_and_force_decides_again(q4_target: str, decisions: Path) -> None:
    from test_cli import pyspec_cli

    def calibrate(*extra: str) -> dict:
        p = pyspec_cli("calibrate", "--target", q4_target, "--draft", "", "--repeats", "1", "--json", *extra)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["flash_attn"]

    first = calibrate()
    assert first["mode"] == "auto" and first["at_depth"] == 320 and min(first["plain"], first["verify"]) > 0
    (cached,) = _cached_files(decisions)
    data = {k: v for k, v in cached.items() if k != "file"}
    cached["file"].write_text(json.dumps({**data, "plain_ratio": 3.0, "verify_ratio": 3.0, "ratio_at_depth": 3.0,
                                          "on": False}), encoding="utf-8")
    assert calibrate() == {"on": False, "mode": "auto", "at_depth": 320, "plain": 3.0, "verify": 3.0, "ratio": 3.0}
    again = calibrate("--force")
    assert again["ratio"] != 3.0 and again["on"] is (again["ratio"] < 1 - calibration.FLASH_ATTN_MARGIN)
    assert calibrate("--flash-attn", "on") == {"on": True, "mode": "on"}
    table = pyspec_cli("calibrate", "--target", q4_target, "--draft", "", "--repeats", "1")
    assert table.returncode == 0 and "flash attention: " in table.stdout

"""Flash attention decided by measurement (Engine(flash_attn="auto"), the default): the mode's
parsing, the choice from timings, the cached decision and that it reaches llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import pyspec
from pyspec import calibration
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


def test_the_choice_is_made_for_a_typical_request() -> None:
    """A setting's cost is a plain step plus a verification, each a straight line through its two
    timed depths, read at a typical request's depth (320 tokens, or half a smaller window: not half
    a large window, which few requests fill); flash attention is chosen only where it is at least
    FLASH_ATTN_MARGIN cheaper there."""
    assert calibration.flash_attn_depths(4096) == (256, 1024)
    assert calibration.flash_attn_depths(256) == (32, 128)
    assert [calibration.flash_attn_at_depth(n) for n in (256, 640, 1024, 4096, 32768)] == [128, 320, 320, 320, 320]
    at_4096 = calibration.flash_attn_at_depth(4096)
    # SmolLM2-135M's measured decisions on the Zen 4 (4,096-token window): on is cheaper at 256
    # tokens, dearer at 1,024. One read 1.5% cheaper at 512 tokens (off, inside the margin) and
    # 3.6% at a typical request's depth (on); at half the window it is off.
    smol = ((256, 1024), (11.26, 13.95), (10.54, 13.38), (47.62, 61.52), (45.78, 64.29))
    assert not calibration.FlashAttnDecision.choose(*smol, at_depth=512).on
    assert calibration.FlashAttnDecision.choose(*smol, at_depth=at_4096).on
    assert not calibration.FlashAttnDecision.choose(*smol, at_depth=2048).on
    smol_b = ((256, 1024), (10.30, 12.48), (9.87, 11.53), (45.24, 53.95), (42.78, 56.65))
    assert calibration.FlashAttnDecision.choose(*smol_b, at_depth=at_4096).on
    # Qwen2.5-Coder-1.5B on the same machine: level on one-token decodes, dearer verifications: off
    qwen = ((256, 1024), (33.74, 38.53), (34.48, 40.75), (213.37, 225.10), (217.08, 250.67))
    assert not calibration.FlashAttnDecision.choose(*qwen, at_depth=at_4096).on
    # on is cheaper at the short depth, dearer at the long one: the window decides
    depths, off, on, batch_off, batch_on = (256, 1024), (40.0, 44.0), (38.0, 46.0), (100.0, 110.0), (90.0, 120.0)
    short = calibration.FlashAttnDecision.choose(depths, off, on, batch_off, batch_on, at_depth=128)
    long = calibration.FlashAttnDecision.choose(depths, off, on, batch_off, batch_on, at_depth=2048)
    assert short.on and short.cost_off == pytest.approx(137.0 + 2 / 3) and short.cost_on == pytest.approx(121.0 + 2 / 3)
    assert not long.on and long.cost_off == pytest.approx(172.0 + 2 / 3) and long.cost_on == pytest.approx(216.0 + 2 / 3)
    # 1% cheaper is within the margin: off stays
    flat = (40.0, 40.0)
    assert not calibration.FlashAttnDecision.choose(depths, flat, (39.6, 39.6), flat, (39.6, 39.6), at_depth=512).on
    assert calibration.FlashAttnDecision.choose(depths, flat, (39.0, 39.0), flat, (39.0, 39.0), at_depth=512).on


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
                                           "batch_ms_off": [5.0, 6.0], "batch_ms_on": [7.0, 8.0], "on": on}),
                               encoding="utf-8")
        with pyspec.Engine(q4_target, n_ctx=256, n_threads=2) as engine:
            assert engine.flash_attn is on
            assert engine.flash_attn_decision == calibration.FlashAttnDecision(
                (32, 128), (1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (7.0, 8.0), 128, on)
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
        *ms, window = engine._core.time_flash_attention(64, 2, 1, 4)
        assert min(ms) > 0
        assert window == 256  # the engine's window: without flash attention the window sets the cost
        assert engine.generate("The timing uses contexts of its own", max_tokens=12, method="none").tokens == before
        for bad in ((0, 2, 1, 4), (64, 0, 1, 4), (64, 2, 0, 4), (64, 2, 1, 0)):
            with pytest.raises(InvalidArgumentError, match="depth, n_decodes, rounds and batch >= 1"):
                engine._core.time_flash_attention(*bad)


def test_timing_takes_the_engines_window_up_to_a_cap(q4_target: str) -> None:
    """A decode without flash attention costs more in a wider window (V is kept transposed, one
    row per channel as long as the window), so the timing runs in the window the engine decodes
    in, up to 4,096 cells; never narrower than the depth timed needs."""
    with pyspec.Engine(q4_target, n_ctx=8192, n_threads=2, flash_attn=False) as engine:
        assert engine._core.time_flash_attention(32, 1, 1, 2)[4] == 4096
    with pyspec.Engine(q4_target, n_ctx=256, n_threads=2, flash_attn=False) as engine:
        assert engine._core.time_flash_attention(32, 1, 1, 2)[4] == 256
        assert engine._core.time_flash_attention(300, 1, 1, 8)[4] == 309  # depth + batch + 1


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
    assert first["mode"] == "auto" and first["at_depth"] == 320 and min(first["ms_off"], first["ms_on"]) > 0
    (cached,) = _cached_files(decisions)
    data = {k: v for k, v in cached.items() if k != "file"}
    cached["file"].write_text(json.dumps({**data, "ms_off": [1.0, 1.0], "ms_on": [3.0, 3.0], "batch_ms_off": [1.0, 1.0],
                                          "batch_ms_on": [3.0, 3.0], "on": False}), encoding="utf-8")
    assert calibrate() == {"on": False, "mode": "auto", "at_depth": 320, "ms_off": 2.0, "ms_on": 6.0}
    again = calibrate("--force")
    assert (again["ms_off"], again["ms_on"]) != (2.0, 6.0) and again["on"] is (again["ms_on"] < 0.98 * again["ms_off"])
    assert calibrate("--flash-attn", "on") == {"on": True, "mode": "on"}
    table = pyspec_cli("calibrate", "--target", q4_target, "--draft", "", "--repeats", "1")
    assert table.returncode == 0 and "flash attention: " in table.stdout

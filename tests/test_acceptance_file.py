"""Method auto's acceptance statistics kept across processes (pyspec.acceptance): saved, loaded
into another engine that then plans as the first, refused whole when the file is bad, and kept by
`pyspec generate --stats-file`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pyspec
from pyspec import _core, acceptance

PROMPT = "a b c a b c a b c a b c"
# verification cheap enough that lookup pays, dear enough that the statistics decide
CURVE = pyspec.CostCurve((1, 2, 4, 8, 64), (10.0, 13.0, 19.0, 31.0, 400.0))


def _engine(path: str) -> pyspec.Engine:
    engine = pyspec.Engine(path, n_ctx=1024, n_threads=2)
    engine._core.set_cost(False, CURVE._core(), "")
    return engine


def _steps(engine: pyspec.Engine) -> list[int]:
    engine.clear_pool()  # the phrase pool learns too: this compares the statistics alone
    return engine.generate(PROMPT, max_tokens=48, auto_adapt_costs=False).step_sizes.tolist()


def test_saved_statistics_plan_a_new_engine_as_the_old(tiny_target: str, tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    with _engine(tiny_target) as first:
        fresh_steps = _steps(first)
        first.save_stats(path)
        saved = first._core.acceptance_counts()
        assert saved and all(sum(v) > 0 for v in saved.values())
        learnt_steps = _steps(first)
        assert learnt_steps != fresh_steps  # what the first run taught changes the plan
    with _engine(tiny_target) as second:
        second.load_stats(path)
        assert second._core.acceptance_counts() == saved
        assert _steps(second) == learnt_steps
    with _engine(tiny_target) as third:  # without the file: a fresh engine's plan
        assert _steps(third) == fresh_steps


def test_bad_files_are_refused_whole(tiny_target: str, tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    with _engine(tiny_target) as engine:
        _steps(engine)
        engine.save_stats(path)
        good = json.loads(path.read_text(encoding="utf-8"))
        before = engine._core.acceptance_counts()

        def refused(data: object | str, match: str) -> None:
            bad = tmp_path / "bad.json"
            bad.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
            with pytest.raises(pyspec.StatsFileError, match=match):
                engine.load_stats(bad)
            assert engine._core.acceptance_counts() == before

        with pytest.raises(pyspec.StatsFileError, match="no acceptance statistics file"):
            engine.load_stats(tmp_path / "missing.json")
        refused("{not json", "cannot read")
        refused({**good, "format": 99}, "format 99")
        refused({**good, "target": "another model"}, "saved for target 'another model'")
        layout = acceptance.layout()
        refused({**good, "layout": {**layout, "kinds": layout["kinds"][:-1] + ["new kind"]}}, "other node kinds")
        key = next(iter(good["stats"]))
        short = {**good, "stats": {key: good["stats"][key][:-1]}}
        refused(short, f"expected {len(good['stats'][key])} values")
        counts = list(good["stats"][key])
        counts[0], counts[_core.NUM_KINDS * _core.KIND_DEPTHS] = 5.0, 2.0  # hits 5 of 2 tries
        refused({**good, "stats": {key: counts}}, "more hits than tries")
        counts[0] = float("nan")
        refused(json.dumps({**good, "stats": {key: counts}}), "not a finite count")
        engine.load_stats(path)  # the good file still loads
        assert engine._core.acceptance_counts() == before


def test_draft_model_counts_need_the_same_draft(tiny_target: str, tmp_path: Path) -> None:
    """The draft model's node counts say how that draft's proposals fared: a slot now holding a
    model of another kind starts them afresh, while the context-match counts are kept."""
    n_cells = _core.NUM_KINDS * _core.KIND_DEPTHS
    model = next(k for k in range(_core.NUM_KINDS) if _core.kind_name(k).startswith("model "))
    lookup = _core.kind_lookup(4)
    counts = [0.0] * (2 * n_cells + 2)
    counts[model * _core.KIND_DEPTHS] = 3.0            # model node hits at depth 0
    counts[n_cells + model * _core.KIND_DEPTHS] = 4.0  # and tries
    counts[lookup * _core.KIND_DEPTHS] = 7.0
    counts[n_cells + lookup * _core.KIND_DEPTHS] = 8.0
    counts[-2:] = [3.0, 4.0]
    with pyspec.Engine(tiny_target, draft=tiny_target, n_ctx=1024, n_threads=2) as engine:
        engine._core.set_acceptance_counts({"": counts})
        path = tmp_path / "stats.json"
        engine.save_stats(path)
        engine.load_stats(path)  # the same draft: everything kept
        assert engine._core.acceptance_counts() == {"": counts}
        data = json.loads(path.read_text(encoding="utf-8"))
        data["drafts"][""] = "another draft"
        path.write_text(json.dumps(data), encoding="utf-8")
        engine.load_stats(path)
        loaded = engine._core.acceptance_counts()[""]
        assert loaded[lookup * _core.KIND_DEPTHS] == 7.0 and loaded[n_cells + lookup * _core.KIND_DEPTHS] == 8.0
        assert sum(loaded) == 15.0  # the model's cells and totals dropped


def test_each_lookup_setting_learns_apart(tiny_target: str) -> None:
    # Requests that turn one of the copy drafter's settings off give its node kinds other
    # meanings (a unit end, a repeated replacement, a resumed copy, a renamed word met elsewhere,
    # the start of a copied code block become plain copies): each learns under a key of its own,
    # so that `pyspec bench`'s auto:no-... variants and auto do not share what they learn.
    settings = {"lookup_unit_ends": "(no unit ends)", "lookup_substitutions": "(no substitutions)",
                "lookup_resync": "(no resync)", "lookup_loose_substitutions": "(no loose substitutions)",
                "lookup_fences": "(no fences)"}
    with _engine(tiny_target) as engine:
        engine.generate(PROMPT, max_tokens=8)
        assert set(engine._core.acceptance_counts()) == {""}
        for option, key in settings.items():
            engine.generate(PROMPT, max_tokens=8, **{option: False})
            assert "\n" + key in engine._core.acceptance_counts(), option
        assert len(engine._core.acceptance_counts()) == 1 + len(settings)


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPEC_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-c", "import sys; from pyspec.cli.main import main; sys.exit(main())", *args],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent, env=env)


def test_generate_keeps_statistics_across_runs(tiny_target: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plain = ("-v", "generate", "--target", tiny_target, "--prompt", PROMPT, "--max-tokens", "24", "--json")
    off = _cli(*plain, cache=cache)  # off unless asked for
    assert off.returncode == 0, off.stderr
    assert not (cache / "stats").exists()
    args = (*plain, "--stats-file", "default")
    first = _cli(*args, cache=cache)
    assert first.returncode == 0, first.stderr
    files = list((cache / "stats").glob("*.json"))
    assert len(files) == 1 and "sets loaded" not in first.stderr
    second = _cli(*args, cache=cache)
    assert second.returncode == 0, second.stderr
    assert f"loaded from {files[0]}" in second.stderr
    assert json.loads(second.stdout)["tokens"] == json.loads(first.stdout)["tokens"]

    # a damaged cached file is reported, ignored and replaced
    files[0].write_text("{damaged", encoding="utf-8")
    third = _cli(*args, cache=cache)
    assert third.returncode == 0, third.stderr
    assert "ignoring the cached acceptance statistics" in third.stderr
    assert json.loads(files[0].read_text(encoding="utf-8"))["format"] == acceptance.FORMAT_VERSION

    # a damaged file the user named is an error
    named = tmp_path / "mine.json"
    named.write_text("{damaged", encoding="utf-8")
    bad = _cli(*plain, "--stats-file", str(named), cache=cache)
    assert bad.returncode == 1 and "pyspec: error:" in bad.stderr and str(named) in bad.stderr

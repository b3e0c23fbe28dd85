"""A bounded concurrency stress run (tests/stress_run.py): threads generating, streaming,
cancelling, reloading drafts, saving and loading pools and closing in random order. No crash, no
hang, every call succeeds or raises a typed error, greedy outputs stay plain decoding's.
scripts/stress.py runs the same for longer."""

from __future__ import annotations

from pathlib import Path

from stress_run import run_stress


def test_concurrency_stress(tiny_target: str, tiny_drafts: dict[str, str], tmp_path: Path) -> None:
    report = run_stress(tiny_target, tiny_drafts["perturbed"], tmp_path, seconds=20, n_threads=6, seed=0,
                        round_seconds=4)
    print(report.summary())
    assert report.failures == []
    assert report.n_rounds >= 2
    for op in ("generate", "stream", "reload", "pool", "text", "close"):
        assert report.calls[op] > 0, (op, report.calls)
    assert any(key.endswith("EngineClosedError") for key in report.typed_errors)  # calls did race close()

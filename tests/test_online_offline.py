"""Offline distillation (pyspec.online.offline, `pyspec distill`) on tiny models, a few steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import torch

import pyspec  # noqa: E402
from pyspec._models.tiny import build_tiny_model  # noqa: E402
from pyspec.online import DistillConfig, export_gguf, load_gguf  # noqa: E402
from pyspec.online.offline import distill_offline, student_continuation  # noqa: E402

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "class Counter:"]


@pytest.fixture(autouse=True)
def one_torch_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def weak_draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("offline") / "weak.gguf", seed=300, base_seed=0, perturb=0.3))


def acceptance(engine: pyspec.Engine, prompts: list[list[int]]) -> float:
    stats = [engine.generate(p, max_tokens=32).stats for p in prompts]
    return sum(s.n_accepted for s in stats) / sum(s.n_drafted for s in stats)


def test_student_continuation_is_the_drafts_greedy_output(tiny_target: str, weak_draft: str) -> None:
    """PyTorch decoding of the draft gives what llama.cpp gives for the draft as a target."""
    with pyspec.Engine(weak_draft, n_ctx=256, n_threads=1) as draft_engine:
        prompt = draft_engine.tokenize(PROMPTS[0])
        expected = draft_engine.generate(prompt, max_tokens=16, method="none").tokens
        got = student_continuation(load_gguf(weak_draft), draft_engine, prompt, 16)
    assert got == expected


def test_teacher_distillation_raises_acceptance(tiny_target: str, weak_draft: str, tmp_path: Path) -> None:
    with pyspec.Engine(tiny_target, draft=weak_draft, n_ctx=512, n_threads=1) as engine:
        prompts = [engine.tokenize(p) for p in PROMPTS]
        before = acceptance(engine, prompts)
        model = load_gguf(weak_draft)
        report = distill_offline(engine, model, prompts, DistillConfig(lr=1e-3, batch_size=4), steps=8,
                                 sampling="teacher", max_tokens=32)
        assert report.losses[-1] < report.losses[0]
        assert report.sources == {"teacher": 32, "student": 0}
        engine.reload_draft(export_gguf(model, tmp_path / "distilled.gguf", dtype="f32"))
        assert acceptance(engine, prompts) > before + 0.1


@pytest.mark.parametrize("sampling", ["student", "mixed"])
def test_student_and_mixed_sampling_train(tiny_target: str, weak_draft: str, sampling: str) -> None:
    with pyspec.Engine(tiny_target, draft=weak_draft, n_ctx=512, n_threads=1) as engine:
        prompts = [engine.tokenize(p) for p in PROMPTS[:2]]
        report = distill_offline(engine, load_gguf(weak_draft), prompts, DistillConfig(lr=1e-3, batch_size=2),
                                 steps=3, sampling=sampling, max_tokens=12)
    assert len(report.losses) == 3 and report.n_positions > 0
    assert sum(report.sources.values()) == 6
    if sampling == "student":
        assert report.sources["teacher"] == 0


def test_distill_cli(tiny_target: str, weak_draft: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    from pyspec import data
    from pyspec.cli.main import main as pyspec_main

    fake = [data.Prompt(id=f"toy/{i}", suite="toy", text=t, messages=[{"role": "user", "content": t}])
            for i, t in enumerate(PROMPTS)]
    monkeypatch.setattr(data, "load_suite", lambda name, n=None, **kw: fake[:n])
    # The engine gets the weight-repacking and huge-page flags (the real engine, its settings read back).
    from pyspec.engine import Engine
    settings: list[tuple[str, bool]] = []
    real_init = Engine.__init__

    def init(self: Engine, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        settings.append((self.repack_mode, self.huge_pages))

    monkeypatch.setattr(Engine, "__init__", init)
    out = tmp_path / "cli.gguf"
    code = pyspec_main(["distill", "--target", tiny_target, "--draft", weak_draft, "--suite", "humaneval", "--n", "3",
                     "--eval", "1", "--steps", "2", "--batch-size", "2", "--max-tokens", "12", "--raw",
                     "--threads", "1", "--dtype", "f32", "--repack", "off", "--no-huge-pages", "--out", str(out)])
    assert code == 0
    assert settings == [("off", False)]
    summary = json.loads(capsys.readouterr().out)
    assert summary["out"] == str(out) and out.is_file()
    assert summary["steps"] == 2 and summary["eval_prompts"] == 1
    assert summary["acceptance_before"] is not None and summary["acceptance_after"] is not None


def test_distill_cli_trains_only_the_last_blocks(tiny_target: str, weak_draft: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-train-vocab --train-blocks 1: the written draft keeps block 0 and the vocabulary
    matrices exactly as the source has them and moves the last block."""
    import numpy as np

    from pyspec import data
    from pyspec.cli.main import main as pyspec_main
    from pyspec.online import open_gguf

    fake = [data.Prompt(id=f"toy/{i}", suite="toy", text=t, messages=[{"role": "user", "content": t}])
            for i, t in enumerate(PROMPTS)]
    monkeypatch.setattr(data, "load_suite", lambda name, n=None, **kw: fake[:n])
    out = tmp_path / "last.gguf"
    code = pyspec_main(["distill", "--target", tiny_target, "--draft", weak_draft, "--suite", "humaneval", "--n", "3",
                     "--eval", "0", "--steps", "3", "--batch-size", "2", "--max-tokens", "12", "--raw", "--lr", "1e-3",
                     "--threads", "1", "--no-train-vocab", "--train-blocks", "1", "--out", str(out)])
    assert code == 0

    def tensors(path: Path) -> dict[str, bytes]:
        return {t.name: np.asarray(t.data).tobytes() for t in open_gguf(path).tensors}

    written, source = tensors(out), tensors(Path(weak_draft))
    kept = {n for n in source if n.startswith("blk.0.") or n in ("token_embd.weight", "output.weight")}
    moved = {n for n in source if written[n] != source[n]}
    assert kept & set(source) and not kept & moved
    assert any(n.startswith("blk.1.") for n in moved)

"""The training process (pyspec.online.worker.TrainerProcess) on its own: samples in, GGUF paths
out; training errors come back typed and leave it serving; a process that is gone fails every
request with TrainerExitedError; its log records arrive in this process."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import pyspec
from pyspec._models.tiny import build_tiny_model
from pyspec.online import (
    DistillConfig,
    TraceSample,
    TrainerError,
    TrainerExitedError,
    TrainerProcess,
    UpdateResult,
    samples_from_result,
)

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):"]
CONFIG = DistillConfig(lr=1e-3, epochs=2, export_dtype="f32")


@pytest.fixture(scope="module")
def weak_draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("online_worker")
    return str(build_tiny_model(folder / "weak.gguf", seed=300, base_seed=0, perturb=0.3))


@pytest.fixture(scope="module")
def samples(tiny_target: str, weak_draft: str) -> list[TraceSample]:
    with pyspec.Engine(tiny_target, draft=weak_draft, n_ctx=512, n_threads=1) as engine:
        results = [engine.generate(p, max_tokens=32, method="chain", trace_top_k=32) for p in PROMPTS]
    made = [s for s in (samples_from_result(r) for r in results) if s is not None]
    assert sum(s.n_rows for s in made) > 0
    return made


def test_update_returns_a_draft_the_engine_loads(tiny_target: str, weak_draft: str, samples: list[TraceSample],
                                                 tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pyspec"), TrainerProcess(weak_draft, CONFIG, tmp_path) as trainer:
        result = trainer.update(samples[:2], rehearsed=samples[2:]).result(120)
        second = trainer.update(samples[:2]).result(120)
    assert isinstance(result, UpdateResult) and result.update == 1 and second.update == 2
    assert Path(result.path) == tmp_path / "draft-1.gguf" and Path(second.path) == tmp_path / "draft-2.gguf"
    report = result.report
    assert report.n_rehearsed == samples[2].n_rows and report.n_positions == sum(s.n_rows for s in samples)
    assert report.loss_after < report.loss_before and report.lr == CONFIG.lr and report.export_seconds > 0
    assert second.report.loss_before < report.loss_before  # the weights stayed in the process
    with pyspec.Engine(tiny_target, draft=weak_draft, n_ctx=512, n_threads=1) as engine:
        assert engine.reload_draft(second.path) == 2
    assert f"[trainer {trainer.pid}] export:" in caplog.text  # its log records reach this process


def test_a_failed_request_leaves_the_process_serving(weak_draft: str, samples: list[TraceSample],
                                                     tmp_path: Path) -> None:
    bad = TraceSample(tokens=np.array([1, 2, 10**6], dtype=np.int32), rows=np.array([1], dtype=np.int32),
                      top_ids=np.array([[3]], dtype=np.int32), top_probs=np.array([[0.5]], dtype=np.float32))
    with TrainerProcess(weak_draft, CONFIG, tmp_path) as trainer:
        with pytest.raises(TrainerError, match="IndexError"):
            trainer.update([bad]).result(120)
        with pytest.raises(TrainerError, match="no training positions"):
            trainer.update([]).result(120)
        with pytest.raises(TrainerError, match="FileNotFoundError: no such GGUF file"):
            trainer.reset(tmp_path / "missing.gguf").result(120)
        assert trainer.alive
        assert Path(trainer.update(samples).result(120).path).exists()
        trainer.reset(weak_draft).result(120)  # back to the original weights, fresh optimizer
        assert trainer.update(samples).result(120).update == 2


def test_a_closed_or_broken_process_fails_every_request(weak_draft: str, samples: list[TraceSample],
                                                        tmp_path: Path) -> None:
    trainer = TrainerProcess(weak_draft, CONFIG, tmp_path / "a")
    trainer.ready.result(120)
    trainer.close()
    assert not trainer.alive
    with pytest.raises(TrainerExitedError):
        trainer.update(samples).result(10)
    trainer.close()  # idempotent

    not_a_model = tmp_path / "not-a-model.gguf"
    not_a_model.write_bytes(b"GGUF but nothing else")
    broken = TrainerProcess(not_a_model, CONFIG, tmp_path / "b")
    with pytest.raises(TrainerError):
        broken.ready.result(120)
    with pytest.raises(TrainerExitedError):
        broken.update(samples).result(120)
    broken.close()


def test_own_work_dir_is_removed_on_close(weak_draft: str, samples: list[TraceSample]) -> None:
    trainer = TrainerProcess(weak_draft, CONFIG)
    path = Path(trainer.update(samples).result(120).path)
    assert path.exists() and path.parent == trainer.work_dir
    trainer.close()
    assert not trainer.work_dir.exists()

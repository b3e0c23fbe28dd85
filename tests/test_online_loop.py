"""The online loop (pyspec.online: OnlineDistiller, DomainRouter): traces -> replay buffer ->
background training -> export -> hot reload, on tiny models. Training is kept to a few steps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import torch

import pyspec  # noqa: E402
from pyspec._models.tiny import build_tiny_model  # noqa: E402
from pyspec.online import (  # noqa: E402
    DistillConfig,
    DomainRouter,
    OnlineDistiller,
    PromptCentroids,
    ReplayBuffer,
    TraceSample,
    batch_loss,
    load_gguf,
    make_optimizer,
    samples_from_result,
    top_k_of_logits,
    train_step,
)
from pyspec.online.buffer import merge_samples, prompt_sample  # noqa: E402
import online_faults  # noqa: E402

GATED = "online_faults:GatedDraft"

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "class Counter:"]
MAX_TOKENS = 40
CONFIG = DistillConfig(lr=1e-3, export_dtype="f32", train_threads=1)


@pytest.fixture(autouse=True)
def one_torch_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def weak_draft(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A perturbed copy of the target that is rejected often enough to learn from."""
    folder = tmp_path_factory.mktemp("online_loop")
    return str(build_tiny_model(folder / "weak.gguf", seed=300, base_seed=0, perturb=0.3))


@pytest.fixture(scope="module")
def plain(tiny_target: str) -> dict[str, list[int]]:
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=1) as engine:
        return {p: engine.generate(p, max_tokens=MAX_TOKENS, method="none").tokens for p in PROMPTS}


def make_engine(target: str, draft: str | None, **kwargs: object) -> pyspec.Engine:
    return pyspec.Engine(target, draft=draft, n_ctx=512, n_threads=1, **kwargs)


# -- training data --------------------------------------------------------------------------


def test_rejected_rows_predict_the_targets_token(tiny_target: str, weak_draft: str) -> None:
    """Row r of a sample predicts tokens[r + 1]: the target's top-1 there is the committed token,
    and the PyTorch draft's argmax there is the draft token the target rejected."""
    draft = load_gguf(weak_draft)
    with make_engine(tiny_target, weak_draft) as engine:
        result = engine.generate(PROMPTS[0], max_tokens=MAX_TOKENS, method="chain", trace_top_k=32)
        steps_only = engine.generate(PROMPTS[0], max_tokens=MAX_TOKENS, method="chain")
    with pytest.raises(ValueError, match="trace_top_k"):
        samples_from_result(steps_only, positions="rejected")
    sample = samples_from_result(result, positions="rejected")
    assert sample is not None and sample.n_rows == result.trace.reject_positions.shape[0] > 0
    sequence = result.prompt_tokens + result.tokens
    committed = [sequence[r + 1] for r in sample.rows if r + 1 < len(sequence)]
    assert list(sample.top_ids[: len(committed), 0]) == committed
    rejected = [int(result.trace.drafted(s)[result.trace.n_accepted[s]]) for s in result.trace.reject_steps]
    with torch.no_grad():
        draft_argmax = draft(torch.tensor(sample.tokens, dtype=torch.long)).argmax(-1).numpy()[sample.rows]
    assert np.mean(draft_argmax == np.array(rejected)) >= 0.9  # near-ties may flip a few


def test_the_rejected_token_is_in_every_rows_set(tiny_target: str, weak_draft: str) -> None:
    """Each rejected row holds the target's top 8 and, where the rejected draft token is not
    among them, that token with the target's probability of it (as llama.cpp computes it)."""
    with make_engine(tiny_target, weak_draft) as engine:
        result = engine.generate(PROMPTS[2], max_tokens=MAX_TOKENS, method="chain", trace_top_k=8)
        sample = samples_from_result(result, positions="rejected")
        assert sample is not None and sample.top_ids.shape == (sample.n_rows, 9)
        rows = engine.evaluate(sample.tokens.tolist(), all_rows=True)[sample.rows]
    probs = np.exp(rows - rows.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    rejected = result.trace.reject_tokens
    for i, token in enumerate(rejected):
        assert token in sample.top_ids[i]  # in the top 8 or in the extra column
        inside = token in sample.top_ids[i, :8]
        assert sample.top_ids[i, 8] == (-1 if inside else token)
        assert result.trace.reject_probs[i] == pytest.approx(probs[i, token], rel=1e-3, abs=1e-6)
    assert (sample.top_ids[:, 8] >= 0).any()  # the weak draft is wrong outside the top 8 somewhere


def test_all_positions_from_logits_and_from_evaluate_agree(tiny_target: str, weak_draft: str) -> None:
    with make_engine(tiny_target, weak_draft) as engine:
        result = engine.generate(PROMPTS[1], max_tokens=MAX_TOKENS, return_logits=True)
        rows = engine.evaluate(result.prompt_tokens + result.tokens[:-1], all_rows=True)
    from_logits = samples_from_result(result, positions="all", top_k=8)
    from_evaluate = samples_from_result(result, positions="all", top_k=8,
                                        teacher_logits=rows[len(result.prompt_tokens) - 1:])
    assert from_logits is not None and from_evaluate is not None
    assert from_logits.n_rows == len(result.tokens)
    assert np.array_equal(from_logits.rows, from_evaluate.rows)
    assert np.array_equal(from_logits.top_ids[:, 0], np.array(result.tokens))  # greedy: top-1 was chosen
    assert np.mean(from_logits.top_ids[:, 0] == from_evaluate.top_ids[:, 0]) >= 0.95
    np.testing.assert_allclose(from_logits.top_probs[:, 0], from_evaluate.top_probs[:, 0], atol=0.02)
    with pytest.raises(ValueError, match="return_logits"):
        samples_from_result(engine_free_result(result), positions="all")


def engine_free_result(result: pyspec.GenerationResult) -> pyspec.GenerationResult:
    import dataclasses

    return dataclasses.replace(result, logits=None)


def test_top_k_of_logits_by_hand() -> None:
    logits = np.array([[0.0, 2.0, 1.0, -1.0]], dtype=np.float32)
    ids, probs = top_k_of_logits(logits, 2)
    expected = np.exp([2.0, 1.0]) / np.exp([0.0, 2.0, 1.0, -1.0]).sum()
    assert ids.tolist() == [[1, 2]]
    np.testing.assert_allclose(probs[0], expected, rtol=1e-6)


def sample(request: int, n_rows: int) -> TraceSample:
    return TraceSample(tokens=np.arange(n_rows + 1, dtype=np.int32), rows=np.arange(n_rows, dtype=np.int32),
                       top_ids=np.zeros((n_rows, 2), np.int32), top_probs=np.full((n_rows, 2), 0.5, np.float32),
                       request=request)


def test_replay_buffer_limits_and_removal() -> None:
    buffer = ReplayBuffer(limit=10, max_age=3)
    a, b, c = sample(0, 4), sample(1, 4), sample(2, 4)
    for s in (a, b, c):
        buffer.add(s)
    assert buffer.snapshot() == [b, c] and buffer.n_positions == 8 and buffer.n_evicted == 1  # limit
    buffer.expire(newest_request=5)  # a sample of request 1 is 4 requests old
    assert buffer.snapshot() == [c] and buffer.n_evicted == 2
    d = sample(5, 3)
    buffer.add(d)
    buffer.remove([c])
    assert buffer.snapshot() == [d] and buffer.n_positions == 3
    big = sample(6, 30)
    buffer.add(big)  # alone over the limit: kept, the older one goes
    assert buffer.snapshot() == [big]


def test_prompt_centroids_route_by_nearest_domain(tiny_target: str) -> None:
    with make_engine(tiny_target, None) as engine:
        tok = engine.tokenize
        centroids = PromptCentroids()
        assert centroids.predict(tok("anything")) is None
        centroids.add(tok("def add(a, b):\n    return a + b"), "code")
        centroids.add(tok("for i in range(10):\n    print(i)"), "code")
        centroids.add(tok("It was the best of times, it was the worst of times."), "prose")
        centroids.add(tok("The quick brown fox jumps over the lazy dog."), "prose")
        assert centroids.predict(tok("def fib(n):\n    return n")) == "code"
        assert centroids.predict(tok("The dog was the best of the times.")) == "prose"
        # nothing in common with either domain: no guess (the router's default domain serves)
        assert centroids.predict(tok("%%%% @@@@ ^^^^ ~~~~")) is None
        assert centroids.predict([]) is None


def test_distill_config_rejects_bad_values() -> None:
    for bad in ({"loss": "mse"}, {"tau": 0}, {"positions": "some"}, {"teacher": "oracle"},
                {"export_dtype": "q4_k"}, {"train_threads": 0}, {"lr_schedule": "cosine"}, {"rehearsal": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DistillConfig(**bad)


@pytest.mark.parametrize("loss", ["fkl", "rkl", "jsd", "ce"])
def test_one_training_step_lowers_the_loss_on_its_batch(tiny_target: str, weak_draft: str, loss: str) -> None:
    with make_engine(tiny_target, weak_draft) as engine:
        results = [engine.generate(p, max_tokens=MAX_TOKENS, method="chain", trace_top_k=32) for p in PROMPTS[:2]]
    batch = [s for s in (samples_from_result(r) for r in results) if s is not None]
    assert sum(s.n_rows for s in batch) > 0
    config = DistillConfig(loss=loss, lr=1e-3)
    model = load_gguf(weak_draft)
    optimizer = make_optimizer(model, config)
    with torch.no_grad():
        before = float(batch_loss(model, batch, config))
    reported = train_step(model, optimizer, batch, config)
    with torch.no_grad():
        after = float(batch_loss(model, batch, config))
    assert reported == pytest.approx(before, rel=1e-5)
    assert after < before


# -- the loop -------------------------------------------------------------------------------


def test_background_update_swaps_draft_while_generations_continue(
        tiny_target: str, weak_draft: str, plain: dict[str, list[int]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Generations go on (and stay greedy-identical to plain decoding) while the draft trains in
    its process; the trained draft is swapped in between two requests and raises acceptance."""
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv(online_faults.GATE_ENV, str(gate))
    work = tmp_path / "drafts"
    with make_engine(tiny_target, weak_draft) as engine:
        distiller = OnlineDistiller(engine, DistillConfig(lr=1e-3, export_dtype="f32", epochs=3),
                                    update_interval=len(PROMPTS), work_dir=work, factory=GATED)
        first = [distiller.generate(p, max_tokens=MAX_TOKENS, domain="mixed", method="chain") for p in PROMPTS]
        wait_for(gate / "started")  # the update started after request 4 and is now training
        during = [distiller.generate(p, max_tokens=MAX_TOKENS, domain="mixed", method="chain") for p in PROMPTS]
        assert distiller.stats().updating and engine.draft_version == 1
        (gate / "release").touch()
        assert distiller.wait(60)
        distiller.update_interval = 100  # no second update during the last round
        after = [distiller.generate(p, max_tokens=MAX_TOKENS, domain="mixed", method="chain") for p in PROMPTS]
        distiller.close()
        stats = distiller.stats()

    assert [r.draft_version for r in first + during] == [1] * 8
    assert [r.draft_version for r in after] == [2] * 4
    for results in (first, during, after):
        assert [r.tokens for r in results] == [plain[p] for p in PROMPTS]
    assert stats.n_updates == 1 and stats.n_failed_updates == 0 and stats.last_error is None
    assert stats.draft_version == 2 and stats.n_requests == 12
    # The update trained on the first 4 requests; the 4 made during training stay buffered
    # (the update was not due again yet), the last 4 were added after it.
    assert {s.request for s in distiller.buffer.snapshot()} <= set(range(4, 12))
    assert stats.last_report is not None and stats.last_report.loss_after < stats.last_report.loss_before
    accepted = lambda rs: sum(r.stats.n_accepted for r in rs) / sum(r.stats.n_drafted for r in rs)  # noqa: E731
    assert accepted(after) > accepted(first)  # it trained on exactly these prompts
    assert set(stats.acceptance_by_domain) == {"mixed"}
    assert [p.name for p in work.iterdir()] == ["default-1.gguf"]


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.02)


def test_corrupt_reload_keeps_old_draft_and_buffer(tiny_target: str, weak_draft: str, plain: dict[str, list[int]],
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corrupt = tmp_path / "corrupt-while-this-exists"
    corrupt.touch()
    monkeypatch.setenv(online_faults.CORRUPT_ENV, str(corrupt))
    work = tmp_path / "drafts"
    with make_engine(tiny_target, weak_draft) as engine:
        distiller = OnlineDistiller(engine, CONFIG, update_interval=100, work_dir=work,
                                    factory="online_faults:CorruptExport")
        for p in PROMPTS:
            distiller.generate(p, max_tokens=MAX_TOKENS, method="chain")
        before = distiller.buffer.snapshot()
        assert before
        assert distiller.update_now() is False
        stats = distiller.stats()
        assert stats.n_failed_updates == 1 and stats.n_updates == 0
        assert stats.last_error is not None and stats.last_error.startswith("ModelLoadError")
        assert engine.draft_version == 1 and engine.draft_path == weak_draft
        assert distiller.buffer.snapshot() == before  # nothing lost
        assert list(work.iterdir()) == []  # the bad file is removed
        again = distiller.generate(PROMPTS[0], max_tokens=MAX_TOKENS, method="chain")
        assert again.tokens == plain[PROMPTS[0]] and again.draft_version == 1

        n_kept = len(distiller.buffer.snapshot())
        corrupt.unlink()  # the next update succeeds and trains on the kept samples
        assert distiller.update_now() is True
        assert engine.draft_version == 2 and distiller.stats().n_updates == 1
        assert distiller.buffer.snapshot() == []
        assert distiller.stats().last_report.n_samples == n_kept
        distiller.close()


def test_failed_training_keeps_buffer(tiny_target: str, weak_draft: str, tmp_path: Path,
                                      caplog: pytest.LogCaptureFixture) -> None:
    with make_engine(tiny_target, weak_draft) as engine:
        distiller = OnlineDistiller(engine, CONFIG, update_interval=2, work_dir=tmp_path,
                                    factory="online_faults:BrokenTraining")
        results = [distiller.generate(p, max_tokens=MAX_TOKENS, method="chain") for p in PROMPTS[:2]]  # due after 2
        assert distiller.wait(60)
        stats = distiller.stats()
        assert stats.n_failed_updates == 1
        assert stats.last_error == "TrainerError: RuntimeError: out of memory (simulated)"
        assert stats.buffer_positions == sum(r.trace.reject_positions.shape[0] for r in results)
        assert engine.draft_version == 1
        assert "old draft keeps serving" in caplog.text
        distiller.close()


def test_a_killed_training_process_is_replaced(tiny_target: str, weak_draft: str, tmp_path: Path) -> None:
    with make_engine(tiny_target, weak_draft) as engine:
        distiller = OnlineDistiller(engine, CONFIG, update_interval=100, work_dir=tmp_path)
        for p in PROMPTS:
            distiller.generate(p, max_tokens=MAX_TOKENS, method="chain")
        first = distiller._trainer
        assert first is not None
        first.ready.result(60)
        os.kill(first.pid, signal.SIGKILL)
        assert distiller.update_now() is False
        stats = distiller.stats()
        assert stats.n_failed_updates == 1 and stats.last_error.startswith("TrainerExitedError")
        assert distiller.update_now() is True  # a new process, from the serving draft
        assert distiller._trainer is not first and engine.draft_version == 2
        distiller.close()
        assert not first.alive and distiller._trainer is None


def test_all_positions_mode_trains_on_every_generated_token(tiny_target: str, weak_draft: str,
                                                            tmp_path: Path) -> None:
    with make_engine(tiny_target, weak_draft) as engine:
        distiller = OnlineDistiller(engine, DistillConfig(positions="all", top_k=8, export_dtype="f32"),
                                    update_interval=100, work_dir=tmp_path)
        result = distiller.generate(PROMPTS[0], max_tokens=MAX_TOKENS)
        assert result.logits is None  # taken for training, not handed back unasked
        assert distiller.buffer.n_positions == len(result.tokens)
        assert distiller.update_now() is True
        distiller.close()


@pytest.mark.parametrize("teacher", ["trace", "evaluate"])
def test_prompt_positions_add_the_prompt_rows_once_per_shared_prefix(tiny_target: str, weak_draft: str,
                                                                    tmp_path: Path, teacher: str) -> None:
    """prompt_positions: the prompt's rows join the output's (row r predicts token r + 1, with
    the target's own rows over the prompt), the prefix a prompt shares with the previous one is
    left out, and an update trains on the lot; with teacher="evaluate" from the one pass that
    also gives the output's rows."""
    with make_engine(tiny_target, weak_draft) as engine:
        config = DistillConfig(positions="all", teacher=teacher, prompt_positions=True, top_k=8, export_dtype="f32")
        distiller = OnlineDistiller(engine, config, update_interval=100, work_dir=tmp_path)
        first = distiller.generate(PROMPTS[0], max_tokens=MAX_TOKENS)
        n_prompt = len(first.prompt_tokens)
        assert distiller.buffer.n_positions == n_prompt - 1 + len(first.tokens)
        repeat = PROMPTS[0] + " return a"
        second = distiller.generate(repeat, max_tokens=MAX_TOKENS)
        shared = next(i for i, (a, b) in enumerate(zip(first.prompt_tokens + [-1], second.prompt_tokens)) if a != b)
        assert distiller.buffer.n_positions == (n_prompt - 1 + len(first.tokens)
                                                + len(second.prompt_tokens) - 1 - shared + len(second.tokens))
        # The first request's sample: prompt rows 0 .. n - 2, then the output's, and at prompt
        # row r the target's own distribution after prompt tokens 0 .. r.
        sample = distiller.buffer.snapshot()[0]
        assert list(sample.rows) == list(range(n_prompt - 1 + len(first.tokens)))
        rows = engine.evaluate(first.prompt_tokens[:-1], all_rows=True)
        expected = prompt_sample(first.prompt_tokens, 0, rows, top_k=8)
        assert expected is not None
        assert np.array_equal(sample.top_ids[: n_prompt - 1, 0], rows.argmax(axis=1))
        np.testing.assert_allclose(sample.top_probs[: n_prompt - 1], expected.top_probs, atol=1e-5)
        assert distiller.update_now() is True
        distiller.close()


def test_merge_samples_joins_rows_and_pads_the_narrower_top_k() -> None:
    tokens = np.array([5, 6, 7, 8, 9], dtype=np.int32)
    a = TraceSample(tokens=tokens, rows=np.array([3], dtype=np.int32), top_ids=np.array([[9, 1, 2]], dtype=np.int32),
                    top_probs=np.array([[0.5, 0.2, 0.1]], dtype=np.float32), request=4, domain="chat")
    b = TraceSample(tokens=tokens[:3], rows=np.array([0, 1], dtype=np.int32),
                    top_ids=np.array([[6, 3], [7, 3]], dtype=np.int32),
                    top_probs=np.array([[0.9, 0.1], [0.8, 0.1]], dtype=np.float32))
    m = merge_samples(a, b)
    assert m is not None and list(m.rows) == [0, 1, 3] and list(m.tokens) == [5, 6, 7, 8]  # up to the last row + 1
    assert m.top_ids.tolist() == [[6, 3, -1], [7, 3, -1], [9, 1, 2]] and m.top_probs[0, 2] == 0.0
    assert (m.request, m.domain) == (4, "chat")
    assert merge_samples(a, None) is a and merge_samples(None, b) is b
    other = TraceSample(tokens=np.array([1, 2], dtype=np.int32), rows=np.array([0], dtype=np.int32),
                        top_ids=np.array([[2]], dtype=np.int32), top_probs=np.array([[1.0]], dtype=np.float32))
    with pytest.raises(ValueError, match="not of one request"):
        merge_samples(a, other)
    with pytest.raises(ValueError, match="do not match the prompt's 2 rows from row 2"):
        prompt_sample([1, 2, 3, 4, 5], 2, np.zeros((3, 10), dtype=np.float32))
    assert prompt_sample([1, 2], 1, np.zeros((0, 10), dtype=np.float32)) is None


def test_rehearsal_replays_released_samples(tiny_target: str, weak_draft: str, tmp_path: Path) -> None:
    config = DistillConfig(lr=1e-3, export_dtype="f32", rehearsal=1.0, rehearsal_limit=10_000)
    with make_engine(tiny_target, weak_draft) as engine:
        distiller = OnlineDistiller(engine, config, update_interval=100, work_dir=tmp_path)
        for p in PROMPTS[:2]:
            distiller.generate(p, max_tokens=MAX_TOKENS, method="chain")
        assert distiller.update_now() is True
        first = distiller.stats().last_report
        assert first.n_rehearsed == 0  # nothing released yet
        assert distiller.buffer.n_rehearsal_positions == first.n_positions  # the reservoir holds them
        for p in PROMPTS[2:]:
            distiller.generate(p, max_tokens=MAX_TOKENS, method="chain")
        n_new = distiller.buffer.n_positions
        assert distiller.update_now() is True
        second = distiller.stats().last_report
        assert second.n_rehearsed > 0 and second.n_positions == n_new + second.n_rehearsed
        distiller.close()


def test_serving_never_imports_torch(tiny_target: str, weak_draft: str, tmp_path: Path) -> None:
    """The serving process runs the engine, the buffer and the distiller; PyTorch, the student
    and its optimizer live in the training process only."""
    code = f"""
import sys
import pyspec
from pyspec.online import DistillConfig, OnlineDistiller
with pyspec.Engine({tiny_target!r}, draft={weak_draft!r}, n_ctx=512, n_threads=1) as engine:
    distiller = OnlineDistiller(engine, DistillConfig(lr=1e-3, export_dtype="f32"), update_interval=2)
    for prompt in {PROMPTS[:2]!r}:
        distiller.generate(prompt, max_tokens=24, method="chain")
    assert distiller.wait(60)
    stats = distiller.stats()
    distiller.close()
assert stats.n_updates == 1 and stats.draft_version == 2, stats
assert "torch" not in sys.modules, "the serving process imported torch"
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, timeout=300)


def test_router_sends_tagged_requests_to_their_draft(tiny_target: str, tiny_drafts: dict[str, str], weak_draft: str,
                                                     plain: dict[str, list[int]], tmp_path: Path) -> None:
    with make_engine(tiny_target, weak_draft) as engine:
        router = DomainRouter(engine, {"code": None, "prose": tiny_drafts["independent"]}, CONFIG,
                              update_interval=2, work_dir=tmp_path)
        assert engine.draft_paths == {"": weak_draft, "code": weak_draft, "prose": tiny_drafts["independent"]}
        code = [router.generate(p, max_tokens=MAX_TOKENS, domain="code", method="chain") for p in (PROMPTS[0], PROMPTS[2])]
        prose = router.generate(PROMPTS[1], max_tokens=MAX_TOKENS, domain="prose", method="chain")
        assert router.wait(60)
        assert [r.draft for r in code] == ["code", "code"] and prose.draft == "prose"
        assert [r.tokens for r in code] == [plain[PROMPTS[0]], plain[PROMPTS[2]]]
        assert prose.tokens == plain[PROMPTS[1]]
        stats = router.stats()
        # Two code requests made the code draft's update due; prose had one request: no update.
        assert stats["code"].n_updates == 1 and engine.draft_versions["code"] == 2
        assert stats["prose"].n_updates == 0 and engine.draft_versions["prose"] == 1
        assert engine.draft_version == 1  # the default draft is not a domain here
        assert [r.domain for r in router.distillers["code"].history] == ["code", "code"]
        assert {s.domain for s in router.distillers["prose"].buffer.snapshot()} == {"prose"}
        # Untagged: the classifier learned from the tagged prompts.
        untagged = router.generate("def fib(n):\n    return n", max_tokens=8)
        assert untagged.draft == "code"
        unlike_both = engine.tokenize("%%%% @@@@ ^^^^ ~~~~")
        assert router.classifier.predict(unlike_both) is None  # below min_similarity: the default serves
        assert router.route(unlike_both) == router.default_domain == "code"
        with pytest.raises(ValueError, match="unknown domain 'math'"):
            router.generate(PROMPTS[0], max_tokens=8, domain="math")
        router.close()

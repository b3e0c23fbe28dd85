"""Per-token log-probabilities (OpenAI logprobs / top_logprobs) and chat content parts."""

from __future__ import annotations

import numpy as np
import pytest

import pyspec

PROMPT = "def greet(name):\n    print("


def log_softmax(row: np.ndarray) -> np.ndarray:
    shifted = row.astype(np.float64) - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def reference_logprobs(engine: pyspec.Engine, result: pyspec.GenerationResult) -> np.ndarray:
    """log softmax of the target's rows for the generated tokens, evaluated from scratch."""
    rows = engine.evaluate(result.prompt_tokens + result.tokens[:-1], all_rows=True)[len(result.prompt_tokens) - 1:]
    return np.stack([log_softmax(row) for row in rows])


@pytest.mark.parametrize("method", ["none", "chain", "tree", "lookup"])
def test_greedy_logprobs_are_the_target_distribution(engines, method: str) -> None:
    engine = engines["perturbed"]
    r = engine.generate(PROMPT, max_tokens=24, method=method, logprobs=5)
    lp = r.logprobs
    assert lp is not None and lp.tokens == r.tokens
    assert lp.token_logprobs.shape == (24,) and lp.top_ids.shape == lp.top_logprobs.shape == (24, 5)
    ref = reference_logprobs(engine, r)
    n = np.arange(24)
    # Batched and one-token rows differ slightly on this backend (docs/numerics.md).
    np.testing.assert_allclose(lp.token_logprobs, ref[n, r.tokens], atol=2e-3)
    np.testing.assert_allclose(lp.top_logprobs, np.take_along_axis(ref, lp.top_ids.astype(np.int64), 1), atol=2e-3)
    # Greedy: the chosen token is the row's likeliest; alternatives come likeliest first.
    assert list(lp.top_ids[:, 0]) == r.tokens
    np.testing.assert_array_equal(lp.top_logprobs[:, 0], lp.token_logprobs)
    assert np.all(np.diff(lp.top_logprobs, axis=1) <= 0)
    assert np.all(lp.token_logprobs <= 0)


def test_sampled_logprobs_ignore_the_sampling_transform(engines) -> None:
    """OpenAI semantics: the model's own distribution, not the temperature / top-p one."""
    engine = engines["perturbed"]
    r = engine.generate(PROMPT, max_tokens=24, method="chain", temperature=0.7, top_p=0.8, seed=3, logprobs=3)
    ref = reference_logprobs(engine, r)
    np.testing.assert_allclose(r.logprobs.token_logprobs, ref[np.arange(24), r.tokens], atol=2e-3)
    # The full distribution's probabilities sum to 1 (a truncated one would sum higher).
    assert np.exp(ref).sum(axis=1) == pytest.approx(np.ones(24), abs=1e-6)


def test_logprobs_off_and_zero(engines) -> None:
    engine = engines["identical"]
    assert engine.generate(PROMPT, max_tokens=8, method="none").logprobs is None
    r = engine.generate(PROMPT, max_tokens=8, method="none", logprobs=0)
    assert r.logprobs.token_logprobs.shape == (8,) and r.logprobs.top_ids.shape == (8, 0)
    with pytest.raises(pyspec.InvalidArgumentError, match="logprobs"):
        engine.generate(PROMPT, max_tokens=8, logprobs=-2)


def test_stream_chunks_carry_tokens_and_logprobs(engines) -> None:
    engine = engines["perturbed"]
    stream = engine.stream(PROMPT, max_tokens=32, method="chain", logprobs=2)
    chunks = list(stream.chunks())
    r = stream.result
    assert "".join(c.text for c in chunks) == r.text
    assert [t for c in chunks for t in c.tokens] == r.tokens
    joined = np.concatenate([c.logprobs.token_logprobs for c in chunks])
    np.testing.assert_array_equal(joined, r.logprobs.token_logprobs)
    np.testing.assert_array_equal(np.concatenate([c.logprobs.top_ids for c in chunks]), r.logprobs.top_ids)


def test_on_chunk_callback_cancels(engines) -> None:
    engine = engines["perturbed"]
    seen: list[pyspec.StreamChunk] = []
    r = engine.generate(PROMPT, max_tokens=64, method="tree", on_chunk=lambda c: seen.append(c) or len(seen) < 2)
    assert r.finish_reason == "cancelled" and len(seen) == 2
    assert engine.generate(PROMPT, max_tokens=8, method="none").finish_reason == "length"


def test_chat_content_parts(engines) -> None:
    engine = engines["identical"]
    plain = engine.apply_chat_template([{"role": "user", "content": "first\nsecond"}])
    parts = engine.apply_chat_template([{"role": "user", "content": [
        {"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}])
    assert parts == plain
    assert engine.apply_chat_template([{"role": "assistant", "content": None}]) == \
        engine.apply_chat_template([{"role": "assistant", "content": ""}])
    with pytest.raises(pyspec.InvalidArgumentError, match="image_url"):
        engine.apply_chat_template([{"role": "user", "content": [
            {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(TypeError, match="content part 0"):
        engine.apply_chat_template([{"role": "user", "content": [{"text": "no type"}]}])
    with pytest.raises(TypeError, match="content must be"):
        engine.apply_chat_template([{"role": "user", "content": 42}])

"""Prefix cache: the KV cache kept across requests gives the same greedy output as a cold start,
for every method, and leaves nothing but sequence 0 behind."""

from __future__ import annotations

import pytest

import pyspec

METHODS = ["none", "chain", "tree", "beam", "lookup", "ouroboros", "auto"]
TURN_1 = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
FOLLOW_UP = "\n# now the same with three numbers\ndef add3(a, b, c):"


@pytest.fixture(scope="module")
def cold(tiny_target: str, tiny_drafts: dict[str, str]):
    """The reference: the same models, the cache cleared at every request."""
    engine = pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=1024, n_threads=2, prefix_cache=False)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def warm(tiny_target: str, tiny_drafts: dict[str, str]):
    engine = pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=1024, n_threads=2)
    yield engine
    engine.close()


def assert_only_sequence_0(engine: pyspec.Engine, draft: bool) -> list[int]:
    """Only sequence 0 holds cells, and exactly the positions the engine believes it holds."""
    tokens, pos_max = engine.kv_cache_state(draft=draft)
    assert pos_max[0] == len(tokens) - 1
    assert all(p == -1 for p in pos_max[1:]), pos_max
    return tokens


def assert_cache_matches(engine: pyspec.Engine, result: pyspec.GenerationResult) -> None:
    """The target's cache holds the committed sequence (all of it but possibly the last token;
    a generation cut by max_tokens may also keep accepted draft tokens after it)."""
    committed = result.prompt_tokens + result.tokens
    cached = assert_only_sequence_0(engine, draft=False)
    assert len(cached) >= len(committed) - 1
    n = min(len(cached), len(committed))
    assert cached[:n] == committed[:n]


@pytest.mark.parametrize("method", METHODS)
def test_follow_up_turns_equal_cold_start(warm, cold, method: str) -> None:
    opts = dict(max_tokens=24, method=method)
    prompt = warm.tokenize(TURN_1)
    n_previous = 0  # prompt + output tokens of the turn before
    for turn in range(3):
        warm_result = warm.generate(prompt, **opts)
        cold_result = cold.generate(prompt, **opts)
        assert warm_result.tokens == cold_result.tokens, (method, turn)
        assert cold_result.stats.n_prompt_cached == 0
        if turn > 0:
            # The previous turn's prompt and all but its last output token are reused.
            assert warm_result.stats.n_prompt_cached >= n_previous - 1, (method, turn)
        assert_cache_matches(warm, warm_result)
        if warm.has_draft and method not in ("none", "lookup"):
            assert_only_sequence_0(warm, draft=True)
        n_previous = len(prompt) + len(warm_result.tokens)
        prompt = prompt + warm_result.tokens + warm.tokenize(FOLLOW_UP, add_special=False)


@pytest.mark.parametrize("method", ["chain", "tree", "ouroboros"])
def test_same_prompt_again_reuses_all_but_last_token(warm, cold, method: str) -> None:
    prompt = warm.tokenize("class Stack:\n    def push(self, x):")
    first = warm.generate(prompt, max_tokens=16, method=method)
    again = warm.generate(prompt, max_tokens=16, method=method)
    assert again.stats.n_prompt_cached == len(prompt) - 1
    assert again.tokens == first.tokens == cold.generate(prompt, max_tokens=16, method=method).tokens


def test_diverging_prompt_keeps_only_the_common_prefix(warm, cold) -> None:
    base = warm.tokenize("for i in range(10):\n    print(i)\n")
    first = base + warm.tokenize("# squares", add_special=False)
    other = base + warm.tokenize("# cubes of i", add_special=False)
    common = next(i for i, (a, b) in enumerate(zip(first, other)) if a != b)
    assert common >= len(base)
    warm.generate(first, max_tokens=16, method="chain")
    result = warm.generate(other, max_tokens=16, method="chain")
    assert result.stats.n_prompt_cached == common
    assert result.tokens == cold.generate(other, max_tokens=16, method="chain").tokens
    assert_cache_matches(warm, result)


def test_sampled_seeded_output_equals_cold_start(warm, cold) -> None:
    prompt = warm.tokenize("while True:\n")
    for method in ("none", "chain", "tree"):
        opts = dict(max_tokens=24, method=method, temperature=0.8, seed=7)
        warm.generate(prompt, **opts)  # fills the cache with this prompt
        again = warm.generate(prompt, **opts)
        assert again.stats.n_prompt_cached == len(prompt) - 1
        assert again.tokens == cold.generate(prompt, **opts).tokens, method


def test_evaluate_and_calibration_empty_the_cache(warm) -> None:
    prompt = warm.tokenize("x = [1, 2, 3]\n")
    warm.generate(prompt, max_tokens=8, method="chain")
    assert len(warm.kv_cache_state()[0]) >= len(prompt)
    warm.evaluate(prompt)
    assert warm.kv_cache_state()[0] == []
    assert warm.generate(prompt, max_tokens=8, method="chain").stats.n_prompt_cached == 0
    warm.evaluate(prompt, draft=True)
    assert warm.kv_cache_state(draft=True)[0] == []
    warm.calibrate(force=True, repeats=1)
    assert warm.kv_cache_state()[0] == [] and warm.kv_cache_state(draft=True)[0] == []
    assert warm.generate(prompt, max_tokens=8, method="chain").stats.n_prompt_cached == 0


def test_reloaded_draft_starts_empty(tiny_target: str, tiny_drafts: dict[str, str], cold) -> None:
    with pyspec.Engine(tiny_target, draft=tiny_drafts["identical"], n_ctx=1024, n_threads=2) as engine:
        prompt = engine.tokenize(TURN_1)
        engine.generate(prompt, max_tokens=16, method="chain")
        assert len(engine.kv_cache_state(draft=True)[0]) >= len(prompt) - 1
        engine.reload_draft(tiny_drafts["perturbed"])
        assert engine.kv_cache_state(draft=True)[0] == []
        # The target keeps its cache; the new draft fills its own from scratch.
        after = engine.generate(prompt, max_tokens=16, method="chain")
        assert after.stats.n_prompt_cached == len(prompt) - 1
        assert after.tokens == cold.generate(prompt, max_tokens=16, method="chain").tokens
        engine.reload_draft(tiny_drafts["perturbed"], name="second")
        assert engine.kv_cache_state(draft="second")[0] == []
        slot = engine.generate(prompt, max_tokens=16, method="tree", draft="second")
        assert slot.tokens == cold.generate(prompt, max_tokens=16, method="tree").tokens
        assert_only_sequence_0(engine, draft="second")


def test_cancelled_generation_leaves_a_consistent_cache(warm, cold) -> None:
    prompt = warm.tokenize("def fib(n):\n")
    pieces: list[str] = []

    def cancel_after_first_piece(chunk: pyspec.StreamChunk) -> bool:
        pieces.append(chunk.text)
        return False

    cancelled = warm.generate(prompt, max_tokens=64, method="tree", on_chunk=cancel_after_first_piece)
    assert cancelled.finish_reason == "cancelled" and len(pieces) == 1
    assert_only_sequence_0(warm, draft=False)
    assert_only_sequence_0(warm, draft=True)
    after = warm.generate(prompt, max_tokens=32, method="tree")
    assert after.stats.n_prompt_cached == len(prompt) - 1
    assert after.tokens == cold.generate(prompt, max_tokens=32, method="tree").tokens


def test_prefix_cache_off_never_reuses(cold) -> None:
    prompt = cold.tokenize(TURN_1)
    cold.generate(prompt, max_tokens=8, method="none")
    assert cold.generate(prompt, max_tokens=8, method="none").stats.n_prompt_cached == 0


@pytest.mark.parametrize("method", ["chain", "tree", "beam", "ouroboros"])
def test_draft_model_reuses_its_cache_too(tiny_target: str, tiny_drafts: dict[str, str], method: str) -> None:
    # Small batches make every prefill chunk a draft decode that shows in n_draft_decodes
    # (64: llama.cpp aborts when a context's n_batch is below its 64 sequences).
    kwargs = dict(draft=tiny_drafts["perturbed"], n_ctx=1024, n_batch=64, n_threads=2)
    with pyspec.Engine(tiny_target, **kwargs) as warm, \
            pyspec.Engine(tiny_target, prefix_cache=False, **kwargs) as cold:
        prompt = warm.tokenize(TURN_1 * 8)
        first = warm.generate(prompt, max_tokens=12, method=method, beams=2, beam_length=4)
        prompt = prompt + first.tokens + warm.tokenize(FOLLOW_UP, add_special=False)
        w = warm.generate(prompt, max_tokens=12, method=method, beams=2, beam_length=4)
        c = cold.generate(prompt, max_tokens=12, method=method, beams=2, beam_length=4)
        assert w.tokens == c.tokens
        n_chunks = -(-(len(prompt) - 1) // 64)
        assert n_chunks >= 4
        # The cold draft prefills every chunk again; the warm one only the new turn.
        assert c.stats.n_draft_decodes - w.stats.n_draft_decodes >= n_chunks - 2, (w.stats, c.stats)

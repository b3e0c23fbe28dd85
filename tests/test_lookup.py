"""Prompt lookup (method "lookup"): exact greedy output, proposals as specified, no draft model.

The tiny random models do not copy their prompt, but their greedy output falls into loops, so
lookup finds matches in the generated text too. Sampling exactness with lookup is checked in
test_sampling.py::test_decoder_samples_target_distribution.
"""

from __future__ import annotations

import pytest

import pyspec

from invariants import assert_step_invariants

CODE = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n"
PROMPTS = [
    "def hello():\n    return",
    "The quick brown fox",
    CODE + "\n" + CODE,  # the same code twice
    "Repeat after me: the cat sat on the mat. the cat sat on the mat. the cat",
    "x",
]


def reference_lookup(seq: list[int], n_draft_max: int, ngram_max: int, ngram_min: int) -> list[int]:
    """The proposal by brute force: the longest suffix (ngram_max down to ngram_min tokens) that
    occurred earlier, its most recent earlier occurrence, and the tokens that followed it, read
    on through the proposal itself when they reach the end of the sequence."""
    for n in range(min(ngram_max, len(seq)), ngram_min - 1, -1):
        suffix = seq[len(seq) - n :]
        for start in range(len(seq) - 1, n - 1, -1):  # start: position after the occurrence
            if seq[start - n : start] == suffix:
                extended = list(seq)
                for i in range(n_draft_max):
                    extended.append(extended[start + i])
                return extended[len(seq) :]
    return []


@pytest.mark.parametrize("n_draft", [1, 2, 4, 8])
def test_lookup_greedy_equals_plain(engines, n_draft: int) -> None:
    engine = engines["independent"]  # the draft model is unused by lookup
    n_accepted = 0
    for prompt in PROMPTS:
        plain = engine.generate(prompt, max_tokens=48, method="none")
        spec = engine.generate(prompt, max_tokens=48, method="lookup", n_draft=n_draft)
        assert spec.tokens == plain.tokens, (n_draft, prompt)
        assert spec.text == plain.text
        assert spec.finish_reason == plain.finish_reason == "length"
        assert spec.stats.n_draft_decodes == 0
        n_accepted += spec.stats.n_accepted
    assert n_accepted > 0


def test_lookup_accepts_on_repeated_text(engines) -> None:
    n_draft = 4
    r = engines["independent"].generate(PROMPTS[2], max_tokens=64, method="lookup", n_draft=n_draft,
                                         pool=False)
    assert_step_invariants(r, n_draft, max_tokens=64)
    assert r.stats.n_accepted > 0
    assert r.stats.tokens_per_target_call > 1.0
    assert r.stats.n_draft_decodes == 0


@pytest.mark.parametrize("ngram_max,ngram_min", [(3, 1), (1, 1), (5, 2), (2, 2)])
def test_proposals_match_reference(engines, ngram_max: int, ngram_min: int) -> None:
    """Each step's draft (from the trace) is the brute-force proposal for the sequence so far."""
    engine = engines["independent"]
    n_draft, max_tokens = 6, 80
    n_nonempty = 0
    for prompt in (PROMPTS[2], PROMPTS[4]):
        r = engine.generate(prompt, max_tokens=max_tokens, method="lookup", n_draft=n_draft, pool=False,
                            lookup_ngram_max=ngram_max, lookup_ngram_min=ngram_min)
        t = r.trace
        for step in range(t.n_steps):
            pos = int(t.positions[step])
            n_draft_max = min(n_draft, max_tokens - pos - 1)
            expected = reference_lookup(r.prompt_tokens + r.tokens[:pos], n_draft_max, ngram_max, ngram_min)
            assert [int(x) for x in t.drafted(step)] == expected, (prompt, step)
            n_nonempty += bool(expected)
    assert n_nonempty > 0


def test_lookup_without_draft_model(tiny_target: str) -> None:
    with pyspec.Engine(tiny_target, n_ctx=512, n_threads=2) as engine:
        assert not engine.has_draft
        for prompt in (PROMPTS[2], PROMPTS[4]):
            plain = engine.generate(prompt, max_tokens=40, method="none")
            spec = engine.generate(prompt, max_tokens=40, method="lookup", n_draft=4)
            assert spec.tokens == plain.tokens
            assert spec.method == "lookup"
            assert spec.stats.n_draft_decodes == 0
            assert spec.stats.n_drafted > 0
        # Other n-gram sizes on the same engine, then the defaults again.
        assert engine.generate(PROMPTS[4], max_tokens=40, method="lookup", lookup_ngram_max=6,
                               lookup_ngram_min=2).tokens == plain.tokens
        assert engine.generate(PROMPTS[4], max_tokens=40, method="lookup").tokens == plain.tokens


def test_lookup_stream_equals_generate(engines) -> None:
    engine = engines["independent"]
    full = engine.generate(PROMPTS[4], max_tokens=60, method="lookup")
    stream = engine.stream(PROMPTS[4], max_tokens=60, method="lookup")
    assert "".join(stream) == full.text
    assert stream.result is not None and stream.result.tokens == full.tokens


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(lookup_ngram_min=0), "ngram_min=0"),
        (dict(lookup_ngram_max=2, lookup_ngram_min=3), "1 <= ngram_min <= ngram_max <= 16"),
        (dict(lookup_ngram_max=17), "ngram_max=17"),
        (dict(n_draft=0), "n_draft"),
    ],
)
def test_invalid_lookup_arguments(engines, kwargs: dict, match: str) -> None:
    with pytest.raises(pyspec.InvalidArgumentError, match=match):
        engines["independent"].generate("hello", method="lookup", **kwargs)
    assert len(engines["independent"].generate("hello", max_tokens=4, method="lookup").tokens) == 4


def test_default_draft_length_per_method(engines) -> None:
    from pyspec.engine import DEFAULT_N_DRAFT

    engine = engines["identical"]
    for method in ("chain", "lookup"):
        r = engine.generate("def f():", max_tokens=8, method=method)
        assert len(r.stats.accept_histogram) == DEFAULT_N_DRAFT[method] + 1


def test_long_lookup_chain_equals_plain(engines) -> None:
    """Chains longer than a tree may be (63 nodes) are fine: one leaf, no extra sequences."""
    engine = engines["perturbed"]
    prompt = "abc abc abc abc abc abc abc abc abc abc abc abc"
    plain = engine.generate(prompt, max_tokens=120, method="none")
    spec = engine.generate(prompt, max_tokens=120, method="lookup", n_draft=100, pool=False)
    assert spec.tokens == plain.tokens
    assert spec.stats.n_drafted > 0

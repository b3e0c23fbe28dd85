"""End of text inside a draft: every method stops exactly where plain decoding stops.

The tiny target here gives <|endoftext|> an output row (models/tiny.py, eos_gain), so greedy
generations end on their own after a few to a few dozen tokens. The draft ranks the end lower
than the target (a smaller gain on a perturbed copy), so the end is sometimes the draft's second
candidate: a tree or beam then accepts it in a branch that is not the first. For each method the
prompts below put the end at the first and the last position of an accepted draft and right
after a draft (the step's own target token); the tests check that these cases occurred, that
the output, the finish reason and the text equal plain decoding, that the statistics count what
the output kept, and that the prefix cache holds the kept sequence and serves a follow-up turn
as a cold start would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pyspec
from pyspec import _core
from pyspec._models.tiny import build_tiny_model

TARGET_EOS_GAIN = 1.5
DRAFT_EOS_GAIN = 1.25
MAX_TOKENS = 72

PROMPTS = [
    "jumps the quick the", "quick when the def", "quick jumps dog lazy", "lazy dog sum model",
    "sum def fox jumps", "fox fox sum return", "answer return over answer", "the quick over when",
    "when return dog jumps", "dog return answer sum", "brown dog the lazy", "model jumps model sum",
]
# Methods and their settings; auto runs on a flat cost curve so that it drafts (see `engine`).
METHODS = {
    "chain": dict(method="chain", n_draft=4),
    "tree": dict(method="tree", tree_nodes=16, tree_depth=5, tree_branching=4, tree_expand=4),
    "beam": dict(method="beam", beams=4, beam_length=5),
    "lookup": dict(method="lookup"),
    "ouroboros": dict(method="ouroboros", n_draft=4),
    "auto": dict(method="auto", auto_adapt_costs=False),
}


@pytest.fixture(scope="module")
def eos_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("eos_models")
    return {
        "target": str(build_tiny_model(folder / "target.gguf", seed=0, eos_gain=TARGET_EOS_GAIN)),
        "draft": str(build_tiny_model(folder / "draft.gguf", seed=100, base_seed=0, perturb=0.1,
                                      eos_gain=DRAFT_EOS_GAIN)),
    }


def flat_costs(engine: pyspec.Engine) -> None:
    """Cost curves on which every drafted token pays (a target decode costs the same for any
    size, a draft token next to nothing): method auto then drafts at every step it can."""
    engine._core.set_cost(False, _core.CostCurve([1, 64], [10.0, 10.0]), "")
    engine._core.set_cost(True, _core.CostCurve([1, 64], [0.1, 0.1]), "")


@pytest.fixture(scope="module")
def engine(eos_models: dict[str, str]):
    """The perturbed draft in the default slot; the target itself as draft "same", which drafts
    the end of text wherever the target will emit it."""
    with pyspec.Engine(eos_models["target"], draft=eos_models["draft"], drafts={"same": eos_models["target"]},
                       n_ctx=512, n_threads=2) as made:
        flat_costs(made)
        yield made


@pytest.fixture(scope="module")
def cold(eos_models: dict[str, str]):
    """The reference for follow-up turns: the same models, the cache cleared at every request."""
    with pyspec.Engine(eos_models["target"], draft=eos_models["draft"], drafts={"same": eos_models["target"]},
                       n_ctx=512, n_threads=2, prefix_cache=False) as made:
        flat_costs(made)
        yield made


@pytest.fixture(scope="module")
def plain(engine: pyspec.Engine) -> dict[str, pyspec.GenerationResult]:
    results = {p: engine.generate(p, max_tokens=MAX_TOKENS, method="none") for p in PROMPTS}
    for prompt, r in results.items():
        assert r.finish_reason == "stop", prompt  # every prompt ends on its own
    return results


def eos_id(engine: pyspec.Engine) -> int:
    return engine.tokenize("<|endoftext|>", add_special=False)[0]


def end_in_last_step(result: pyspec.GenerationResult, eos: int) -> int | None:
    """Where the end of text sits in the accepted path of the last step (0: its first draft
    token), or None when the step's own target token was the end."""
    t = result.trace
    last = t.n_steps - 1
    accepted = list(t.drafted(last)[: t.n_accepted[last]])
    return accepted.index(eos) if eos in accepted else None


def assert_stopped_like_plain(result: pyspec.GenerationResult, reference: pyspec.GenerationResult,
                              eos: int) -> int | None:
    """Same output as plain decoding, ended by the end of text, statistics that count what the
    output kept. Returns end_in_last_step."""
    assert result.tokens == reference.tokens
    assert result.text == reference.text
    assert result.finish_reason == "stop"
    assert eos not in result.tokens
    s = result.stats
    assert s.n_generated == len(result.tokens)
    assert result.trace.n_steps == s.n_target_calls
    assert sum(s.accept_histogram) == s.n_target_calls
    assert sum(i * c for i, c in enumerate(s.accept_histogram)) == s.n_accepted
    at = end_in_last_step(result, eos)
    # Every step adds its accepted draft tokens and its own target token, except the last: there
    # the end of text is an accepted draft token (and the step's target token is not used) or the
    # step's target token. Accepted draft tokens after the end are not counted.
    assert s.n_accepted + s.n_target_calls == s.n_generated + 1 + (at is not None)
    if at is not None:
        t = result.trace
        assert t.positions[-1] + at == len(result.tokens)
    return at


def assert_cache_holds_output(engine: pyspec.Engine, result: pyspec.GenerationResult) -> None:
    """The target's prefix cache holds the prompt and the output (all of it but possibly the last
    token); whatever follows it in the cache starts with the end of text the step decoded (a
    beam's accepted path may go on after it: the cache knows those tokens, a later prompt reuses
    only what it shares)."""
    cached, pos_max = engine.kv_cache_state()
    assert pos_max[0] == len(cached) - 1 and all(p == -1 for p in pos_max[1:])
    committed = result.prompt_tokens + result.tokens
    assert len(cached) >= len(committed) - 1
    assert cached[: len(committed)] == committed[: len(cached)]
    assert cached[len(committed):len(committed) + 1] in ([], [eos_id(engine)])


def draft_ranks_end_first(engine: pyspec.Engine, result: pyspec.GenerationResult, eos: int) -> bool:
    """Whether the default draft's likeliest token after the output is the end of text: when it
    is not, a tree or beam that accepted the end there accepted a sibling that is not the first
    (siblings are tried likeliest first)."""
    logits = engine.evaluate(result.prompt_tokens + result.tokens, draft=True)[0]
    return int(np.argmax(logits)) == eos


@pytest.mark.parametrize("name", sorted(METHODS))
def test_end_of_text_inside_drafts_stops_like_plain(engine, cold, plain, name: str) -> None:
    options = METHODS[name]
    eos = eos_id(engine)
    drafts = [""] if name == "lookup" else ["", "same"]
    where: dict[tuple[str, str], int | None] = {}
    n_later_branch = n_full_chain_end = 0
    if name == "lookup":
        engine.clear_pool()
    for draft in drafts:
        for prompt in PROMPTS:
            result = engine.generate(prompt, max_tokens=MAX_TOKENS, draft=draft, **options)
            at = where[(draft, prompt)] = assert_stopped_like_plain(result, plain[prompt], eos)
            assert_cache_holds_output(engine, result)
            if at is not None and draft == "" and name in ("tree", "beam"):
                n_later_branch += not draft_ranks_end_first(engine, result, eos)
            if at is not None and name == "chain":
                n_full_chain_end += at == len(result.trace.drafted(result.trace.n_steps - 1)) - 1 == options["n_draft"] - 1
    # The cases this test is about occurred: the end as the first accepted draft token, deeper in
    # an accepted draft, and as a step's own target token; for trees and beams in a branch that
    # is not the first, for chains at the last position of a full-length draft.
    positions = set(where.values())
    assert None in positions, where
    if name == "lookup":
        # Copies of the context stop before control tokens (LookupParams::stop_tokens), and the
        # phrase pool, cleared above, holds no end of text: the end is the step's own target
        # token (stop strings inside lookup drafts: test_stop_string_inside_drafts).
        assert positions == {None}, where
    elif name == "auto":
        assert any(p is not None for p in positions), where
    else:
        assert 0 in positions and any(p is not None and p > 0 for p in positions), where
    if name in ("tree", "beam"):
        assert n_later_branch > 0, where
    if name == "chain":
        assert n_full_chain_end > 0, where
    # A follow-up turn after a generation that stopped inside a draft reuses the cache and
    # equals a cold start.
    draft, prompt = next((key for key, at in where.items() if at is not None), ("", PROMPTS[0]))
    first = engine.generate(prompt, max_tokens=MAX_TOKENS, draft=draft, **options)
    follow = first.prompt_tokens + first.tokens + [eos] + engine.tokenize(" the quick", add_special=False)
    warm_turn = engine.generate(follow, max_tokens=MAX_TOKENS, draft=draft, **options)
    cold_turn = cold.generate(follow, max_tokens=MAX_TOKENS, draft=draft, **options)
    assert warm_turn.tokens == cold_turn.tokens
    assert warm_turn.stats.n_prompt_cached >= len(first.prompt_tokens) + len(first.tokens) - 1


@pytest.mark.parametrize("name", sorted(METHODS))
def test_stop_string_inside_drafts_stops_like_plain(engine, plain, name: str) -> None:
    """A stop string completed by a draft token: the same tokens and text as plain decoding,
    finish reason "stop", and the accepted tokens after it not counted."""
    options = METHODS[name]
    n_inside = 0
    for prompt in PROMPTS[:6]:
        reference = plain[prompt]
        cut = len(reference.tokens) * 2 // 3
        stop = engine.detokenize(reference.tokens[cut - 2: cut])
        if not stop.strip() or "\ufffd" in stop:
            continue
        expected = engine.generate(prompt, max_tokens=MAX_TOKENS, method="none", stop=[stop])
        assert expected.finish_reason == "stop" and stop not in expected.text
        for draft in ([""] if name == "lookup" else ["", "same"]):
            result = engine.generate(prompt, max_tokens=MAX_TOKENS, draft=draft, stop=[stop], **options)
            assert result.tokens == expected.tokens
            assert result.text == expected.text
            assert result.finish_reason == "stop"
            s, t = result.stats, result.trace
            last = t.n_steps - 1
            # The token that completed the stop string came from the last step's accepted draft
            # or was the step's own target token.
            inside = len(result.tokens) - 1 < t.positions[last] + t.n_accepted[last]
            n_inside += inside
            assert s.n_accepted + s.n_target_calls == s.n_generated + inside
            assert sum(i * c for i, c in enumerate(s.accept_histogram)) == s.n_accepted
    if name != "lookup":
        assert n_inside > 0

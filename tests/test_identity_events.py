"""Seeded sampled and greedy output stay the same across the events a serving engine goes
through: a prefix-cache reuse and a draft reload, each compared with a fresh engine."""

from __future__ import annotations

import pytest

import pyspec

PROMPT = "import numpy as np\n\nclass Model:\n    def __init__(self):"


@pytest.mark.parametrize("method", ["chain", "tree", "beam", "ouroboros"])
def test_seeded_runs_repeat_across_cache_reuse_and_draft_reload(tiny_target: str, tiny_drafts: dict[str, str],
                                                                method: str) -> None:
    # The phrase pool learns across requests (its phrases change ouroboros drafts, and a sampled
    # run's random draws with them): off here, so that every run drafts alike.
    extra = dict(pool=False) if method == "ouroboros" else {}
    options = [dict(temperature=0.8, top_p=0.9, min_p=0.02, seed=11, **extra), dict(temperature=0.0, **extra)]
    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=1024, n_threads=2) as fresh:
        reference = [fresh.generate(PROMPT, max_tokens=32, method=method, **o) for o in options]
    for r in reference:
        assert r.stats.n_drafted > 0 and r.stats.n_accepted > 0, method
    with pyspec.Engine(tiny_target, draft=tiny_drafts["identical"], n_ctx=1024, n_threads=2) as engine:
        engine.generate(PROMPT, max_tokens=32, method=method)  # the old draft fills both caches
        engine.reload_draft(tiny_drafts["perturbed"])
        for o, ref in zip(options, reference):
            after_reload = engine.generate(PROMPT, max_tokens=32, method=method, **o)
            again = engine.generate(PROMPT, max_tokens=32, method=method, **o)
            assert again.stats.n_prompt_cached == len(again.prompt_tokens) - 1
            assert after_reload.tokens == again.tokens == ref.tokens, (method, o)
            assert after_reload.stats.n_accepted == ref.stats.n_accepted, (method, o)

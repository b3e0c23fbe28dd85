"""benchmarks/online_sim.py computes a greedy chain's acceptance instead of serving: it must
count what the engine counts.

The engine's own chain (method "chain", greedy) on a tiny target with a perturbed copy as
draft is compared with the script's count over the same output, where the draft's token at
each position is its argmax over the output so far (Engine.evaluate of the draft file).
"""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports online_stream beside it
    try:
        spec = importlib.util.spec_from_file_location("online_sim_script", BENCHMARKS / "online_sim.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_chain_acceptance_by_hand():
    chain = load_script().chain_acceptance
    target = [5, 6, 7, 8, 9]
    # every draft token right: steps at 0 (2 accepted, commit 3) and 3 (1 drafted: only 4 is left)
    assert chain(target, target, 2) == (3, 3)
    # wrong at position 1: step 0 accepts 1 and commits 2 tokens; step 2 drafts 7, 8 (right)
    assert chain([5, 0, 7, 8, 9], target, 2) == (4, 3)
    # nothing right: every step drafts, none accepted, one token committed per step
    assert chain([0] * 5, target, 1) == (4, 0)
    assert chain([0] * 5, target, 3) == (3 + 3 + 2 + 1, 0)
    assert chain([], [], 2) == (0, 0)


@pytest.mark.parametrize("n_draft", [1, 2, 3])
def test_counts_what_the_engine_counts(tiny_target, tiny_drafts, n_draft):
    import pyspec

    chain = load_script().chain_acceptance
    prompts = ["hello world", "the quick brown fox", "12345 and more"]
    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=1024, n_threads=2) as engine, \
            pyspec.Engine(tiny_drafts["perturbed"], n_ctx=1024, n_threads=2, prefix_cache=False) as draft:
        for prompt in prompts:
            result = engine.generate(prompt, max_tokens=40, method="chain", n_draft=n_draft)
            tokens = list(result.prompt_tokens) + list(result.tokens)
            rows = draft.evaluate(tokens[:-1], all_rows=True, first_row=len(result.prompt_tokens) - 1)
            counted = chain(rows.argmax(1).tolist(), list(result.tokens), n_draft)
            assert result.stats.n_accepted > 0 and result.stats.n_accepted < result.stats.n_drafted
            assert counted == (result.stats.n_drafted, result.stats.n_accepted), prompt

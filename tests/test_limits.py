"""Engine limits that used to end the process or a generation: a batch smaller than the tree
sequences (llama.cpp aborted the process), a draft tree at the end of the context window (the
draft's cache overflowed), beams wider than the sampling support (nothing was drafted)."""

from __future__ import annotations

import pytest
from isolated import run_json
from test_greedy import PROMPTS

import pyspec

# Runs in a child process: before the fix, llama.cpp aborted the process in the constructor.
SMALL_BATCH = """
import json, sys
import pyspec
from test_greedy import PROMPTS

target, draft = sys.argv[1], sys.argv[2]
out = {}
for n_ctx, n_batch in ((256, 1), (256, 8), (256, 63), (32, 512)):
    with pyspec.Engine(target, draft=draft, n_ctx=n_ctx, n_batch=n_batch, n_threads=1) as e:
        row = {}
        for prompt in PROMPTS + ["hello world, " * 30]:  # the last one is prefilled in chunks
            plain = e.generate(prompt, max_tokens=16, method="none")
            row.setdefault("n_plain", []).append(len(plain.tokens))
            if n_batch > 1:
                depth = min(3, n_batch - 1)
                for method, kw in (("chain", dict(n_draft=min(4, n_batch - 1))),
                                   ("tree", dict(tree_nodes=min(8, n_batch - 1), tree_depth=depth)),
                                   ("lookup", dict(n_draft=min(4, n_batch - 1))),
                                   ("auto", {})):
                    spec = e.generate(prompt, max_tokens=16, method=method, **kw)
                    row.setdefault(method, []).append(spec.tokens == plain.tokens)
        # A draft tree that decodes more nodes than the draft's sequences: refused up front.
        try:
            e.generate(PROMPTS[0], max_tokens=4, method="tree", tree_nodes=2, tree_depth=64, tree_expand=1)
            row["big_tree"] = "no error"
        except pyspec.InvalidArgumentError as err:
            row["big_tree"] = str(err)
        out[f"{n_ctx}/{n_batch}"] = row
print(json.dumps(out))
"""


def test_small_batches_work_and_refuse_trees_that_do_not_fit(tiny_target: str, tiny_drafts: dict[str, str]) -> None:
    import os

    tests_dir = os.path.dirname(__file__)
    out = run_json(f"import sys; sys.path.insert(0, {tests_dir!r})\n" + SMALL_BATCH, tiny_target,
                   tiny_drafts["perturbed"])
    assert set(out) == {"256/1", "256/8", "256/63", "32/512"}
    for key, row in out.items():
        assert row["n_plain"] == [16] * (len(PROMPTS) + 1), key
        for method in ("chain", "tree", "lookup", "auto"):
            if key != "256/1":
                assert all(row[method]), (key, method, row[method])
        assert "tree" in row["big_tree"] and "n_batch" in row["big_tree"], (key, row["big_tree"])


@pytest.mark.parametrize("expand", [2, 4])
def test_draft_tree_runs_to_the_end_of_the_window(tiny_target: str, tiny_drafts: dict[str, str], expand: int) -> None:
    """Near the end of the window the tree drafter decodes fewer nodes instead of overflowing the
    draft's cache: the generation ends with "length", token-identical to plain decoding."""
    with pyspec.Engine(tiny_target, draft=tiny_drafts["perturbed"], n_ctx=256, n_threads=2) as engine:
        plain = engine.generate(PROMPTS[0], max_tokens=1000, method="none")
        tree = engine.generate(PROMPTS[0], max_tokens=1000, method="tree", tree_expand=expand, tree_depth=6,
                               tree_nodes=8)
    assert plain.finish_reason == tree.finish_reason == "length"
    assert len(plain.tokens) + len(plain.prompt_tokens) >= 255  # it really reached the window's end
    assert tree.tokens == plain.tokens


def test_beams_wider_than_the_sampling_support_still_draft(engines) -> None:
    """top_k=2 leaves two candidate tokens per position: 4 beams become 2, not an empty draft.
    The proposal is deterministic, so with a seed the output is plain decoding's for that seed."""
    engine = engines["perturbed"]
    options = dict(max_tokens=40, temperature=1.0, top_k=2, seed=3)
    plain = engine.generate(PROMPTS[1], method="none", **options)
    beam = engine.generate(PROMPTS[1], method="beam", beams=4, beam_length=3, **options)
    assert beam.stats.n_drafted > 0
    assert beam.stats.n_accepted > 0
    assert beam.tokens == plain.tokens

"""Real models (marked `model`): greedy speculation (chain, tree, beam, lookup with the phrase pool,
ouroboros) on the Qwen2.5-Coder pair equals plain greedy decoding on five HumanEval prompts
through the chat template.

On this backend batched and one-token logits differ slightly (docs/numerics.md), so a
divergence is allowed only where it sits on a near-tie: the target's top-2 logit gap at the
divergence must be below NEAR_TIE, and the test reports it.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyspec
from invariants import layout_tokens_by_piece

# Logits. Flips measured on this backend: batched gaps <= 0.24 (docs/numerics.md, Zen 4) and 0.22
# (HumanEval/3, token 57, on the Xeon development machine with repacking off, for chain and lookup).
NEAR_TIE = 0.25

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def qwen_engine():
    with pyspec.Engine("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct", n_ctx=2048) as engine:
        yield engine


def top2_gap(logits: np.ndarray) -> float:
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


@pytest.fixture(scope="module")
def plain_runs(qwen_engine):
    from pyspec.data import load_suite

    prompts = load_suite("humaneval", n=5)
    return [(p, qwen_engine.generate(p.messages, max_tokens=48, method="none")) for p in prompts]


@pytest.mark.parametrize("method,options", [
    ("chain", dict(n_draft=4)), ("lookup", dict(n_draft=8)), ("tree", {}), ("beam", dict(beams=3, beam_length=5)),
    ("ouroboros", {}), ("auto", {}),
])
def test_greedy_identical_on_humaneval(qwen_engine, plain_runs, method: str, options: dict) -> None:
    n_accepted = 0
    for prompt, plain in plain_runs:
        spec = qwen_engine.generate(prompt.messages, max_tokens=48, method=method, **options)
        n_accepted += spec.stats.n_accepted
        if spec.tokens == plain.tokens:
            continue
        i = next((k for k, (a, b) in enumerate(zip(spec.tokens, plain.tokens)) if a != b),
                 min(len(spec.tokens), len(plain.tokens)))
        context = plain.prompt_tokens + plain.tokens[:i]
        gap = top2_gap(qwen_engine.evaluate(context)[0])
        assert gap < NEAR_TIE, f"{prompt.id}: divergence at token {i} with top-2 gap {gap:.3f} (not a near-tie)"
        warnings.warn(f"{prompt.id}: greedy outputs diverge at token {i} on a near-tie (top-2 gap {gap:.4f})")
    assert n_accepted > 0


def test_layout_tokens_of_the_real_vocabulary(qwen_engine) -> None:
    # The tiny test vocabulary has no code fence and no blank-line token; Qwen2.5's has both, so
    # the three lists the engine gives the copies (LookupParams) are checked here, each against
    # every token's piece read back through the tokenizer.
    blank_line, unit_start, fence = qwen_engine._core.layout_tokens()
    assert (list(blank_line), list(unit_start), list(fence)) == layout_tokens_by_piece(qwen_engine)
    # The opening fence of a Python block, as the chat answers write it, is one of them.
    assert qwen_engine.tokenize("```python", add_special=False)[0] in fence
    assert len(fence) >= 1 and len(blank_line) >= 1

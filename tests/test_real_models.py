"""Real models (marked `model`): greedy chain and lookup speculation on the Qwen2.5-Coder pair equal
plain greedy decoding on five HumanEval prompts through the chat template.

On this backend batched and one-token logits differ slightly (DESIGN.md, "Numerics"), so a
divergence is allowed only where it sits on a near-tie: the target's top-2 logit gap at the
divergence must be below NEAR_TIE, and the test reports it.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pyspec

# Logits. Flips measured on this backend: gaps <= ~0.15 (DESIGN.md, Zen 5) and 0.22 (HumanEval/3,
# token 57, on the Xeon development machine with repacking off, for chain and lookup alike).
NEAR_TIE = 0.25

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def qwen_engine():
    with pyspec.Engine("qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct", n_ctx=2048) as engine:
        yield engine


def top2_gap(logits: np.ndarray) -> float:
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


@pytest.mark.parametrize("method,n_draft", [("chain", 4), ("lookup", 8)])
def test_greedy_identical_on_humaneval(qwen_engine, method: str, n_draft: int) -> None:
    from pyspec.data import load_suite

    prompts = load_suite("humaneval", n=5)
    n_accepted = 0
    for prompt in prompts:
        plain = qwen_engine.generate(prompt.messages, max_tokens=48, method="none")
        spec = qwen_engine.generate(prompt.messages, max_tokens=48, method=method, n_draft=n_draft)
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

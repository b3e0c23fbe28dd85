"""Greedy speculative output equals plain greedy output token for token."""

from __future__ import annotations

import numpy as np
import pytest
from invariants import assert_step_invariants

PROMPTS = [
    "def hello():\n    return",
    "The quick brown fox",
    "import numpy as np\n\nclass Model:\n    def __init__(self):",
    "x",
]


@pytest.mark.parametrize("kind", ["identical", "independent", "perturbed"])
@pytest.mark.parametrize("n_draft", [1, 2, 4, 8])
def test_chain_greedy_equals_plain(engines, kind: str, n_draft: int) -> None:
    engine = engines[kind]
    for prompt in PROMPTS:
        plain = engine.generate(prompt, max_tokens=48, method="none")
        spec = engine.generate(prompt, max_tokens=48, method="chain", n_draft=n_draft)
        assert spec.tokens == plain.tokens, (kind, n_draft, prompt)
        assert spec.text == plain.text
        assert spec.finish_reason == plain.finish_reason == "length"


def test_acceptance_matches_draft_kind(engines) -> None:
    rates = {}
    for kind, engine in engines.items():
        r = engine.generate(PROMPTS[0], max_tokens=64, method="chain", n_draft=4)
        rates[kind] = r.stats.acceptance_rate
    assert rates["identical"] == 1.0
    assert rates["independent"] < 0.2
    assert 0.3 < rates["perturbed"] < 1.0


@pytest.mark.parametrize("kind", ["identical", "independent", "perturbed"])
def test_stats_invariants(engines, kind: str) -> None:
    n_draft = 4
    r = engines[kind].generate(PROMPTS[2], max_tokens=50, method="chain", n_draft=n_draft)
    assert_step_invariants(r, n_draft, max_tokens=50)
    s = r.stats
    assert s.acceptance_rate == pytest.approx(s.n_accepted / s.n_drafted)
    assert s.t_total_ms >= s.t_prefill_ms + s.t_draft_ms + s.t_verify_ms
    # Trace: drafted tokens and rejections consistent with the stats.
    t = r.trace
    assert int(t.draft_offsets[-1]) == s.n_drafted
    assert len(t.reject_steps) == sum(1 for i in range(t.n_steps) if t.n_accepted[i] < len(t.drafted(i)))


def test_plain_stats(engines) -> None:
    r = engines["identical"].generate(PROMPTS[1], max_tokens=20, method="none")
    s = r.stats
    assert s.n_target_calls == s.n_generated == 20
    assert s.n_drafted == s.n_accepted == 0
    assert s.tokens_per_target_call == 1.0


def test_trace_records_target_topk_at_rejections(engines) -> None:
    engine = engines["perturbed"]
    r = engine.generate(PROMPTS[0], max_tokens=40, method="chain", n_draft=4, trace_top_k=8)
    t = r.trace
    assert len(t.reject_steps) > 0
    assert t.top_ids.shape == (len(t.reject_steps), 8)
    full = r.prompt_tokens + r.tokens
    for row, step in enumerate(t.reject_steps):
        pos = int(t.reject_positions[row])
        # Greedy: the target's top-1 at the rejected position is the token it committed there.
        assert t.top_ids[row, 0] == r.tokens[pos]
        assert t.drafted(int(step))[t.n_accepted[step]] != r.tokens[pos]
        # The recorded probabilities are the target's softmax (T=1) at that position.
        logits = engine.evaluate(full[: len(r.prompt_tokens) + pos])[0]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        np.testing.assert_allclose(t.top_probs[row], p[t.top_ids[row]], rtol=5e-3, atol=1e-5)
    assert np.all(np.diff(t.top_probs, axis=1) <= 0)

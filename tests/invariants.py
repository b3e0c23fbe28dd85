"""Checks shared by the decoder tests (imported by test modules; tests/ is on sys.path)."""

from __future__ import annotations

import pytest


def assert_step_invariants(result, n_draft: int, max_tokens: int, max_nodes: int | None = None) -> None:
    """Bookkeeping of a speculative generation that ran to max_tokens.

    n_draft: the longest path a step can accept (chain length, tree depth, beam length);
    max_nodes: the most tokens one step can propose (default n_draft: a chain).
    """
    s = result.stats
    assert result.finish_reason == "length"
    assert s.n_generated == len(result.tokens) == max_tokens
    # Every step adds its accepted draft tokens plus one target token.
    assert s.n_generated == s.n_accepted + s.n_target_calls
    assert sum(s.accept_histogram) == s.n_target_calls
    assert sum(i * c for i, c in enumerate(s.accept_histogram)) == s.n_accepted
    assert len(s.accept_histogram) == n_draft + 1
    assert s.n_accepted <= s.n_drafted <= (max_nodes or n_draft) * s.n_target_calls
    assert s.tokens_per_target_call == pytest.approx(s.n_generated / s.n_target_calls)
    assert s.n_prompt_tokens == len(result.prompt_tokens)
    assert result.trace.n_steps == s.n_target_calls
    assert int(result.trace.n_accepted.sum()) == s.n_accepted


def layout_tokens_by_piece(engine) -> tuple[list[int], list[int], list[int]]:
    """What engine._core.layout_tokens() must return, read here from every token's piece:
    (blank_line: a piece holding "\\n\\n", unit_start: a piece starting with a character other
    than whitespace, fence: a piece starting with "```"), control tokens left out."""
    control = set(engine._core.control_tokens())
    pieces = {t: engine.detokenize_bytes([t]) for t in range(engine._core.n_vocab) if t not in control}
    return (sorted(t for t, p in pieces.items() if b"\n\n" in p),
            sorted(t for t, p in pieces.items() if p and p[:1] not in b" \t\n\r"),
            sorted(t for t, p in pieces.items() if p.startswith(b"```")))

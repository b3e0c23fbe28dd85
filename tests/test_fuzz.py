"""Short fuzz runs of every input a user or a file brings (tests/fuzz_cases.py): each case
succeeds or raises a typed error, and the engine keeps serving its reference output. Cases run in
child processes, so a crash is counted, not fatal. scripts/fuzz.py runs the same cases longer."""

from __future__ import annotations

import pytest
from fuzz_cases import run_fuzz


@pytest.mark.parametrize("kind,n_cases", [
    ("config", 200), ("prompt", 120), ("messages", 100), ("pool_file", 150), ("gguf", 60), ("gguf_draft", 60),
    ("engine_settings", 40),
])
def test_fuzz(kind: str, n_cases: int, tiny_target: str, tiny_drafts: dict[str, str]) -> None:
    report = run_fuzz(kind, n_cases, tiny_target, tiny_drafts["perturbed"], seed=0, timeout=600)
    print(report.summary())
    assert report.crashes == []
    assert report.wrong == []
    assert report.n_cases == n_cases
    assert report.outcomes["typed"] > 0  # the cases reach the checks

"""The target's hidden states (Engine.evaluate_hidden): what they hold, checked on tiny models."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import pyspec
from pyspec._models.tiny import build_tiny_model


def tensors(path: str | Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("arch,tied", [("llama", False), ("qwen2", True)])
def test_hidden_state_is_what_the_output_matrix_multiplies(tmp_path: Path, arch: str, tied: bool) -> None:
    """Every row's hidden state is taken after the final norm: logits = hidden @ output.T."""
    path = build_tiny_model(tmp_path / f"{arch}.gguf", seed=3, arch=arch, tied_output=tied)
    weights = tensors(path)
    output = weights["token_embd.weight" if tied else "output.weight"]  # [n_vocab, n_embd]
    with pyspec.Engine(str(path), n_ctx=256, n_threads=2) as engine:
        tokens = engine.tokenize("def add(a, b):\n    return a + b\n\nprint(add(1, 2))")
        logits, hidden = engine.evaluate_hidden(tokens)
        assert logits.shape == (len(tokens), engine.n_vocab) and hidden.shape == (len(tokens), output.shape[1])
        # The final RMSNorm (weights 1 in the tiny models) leaves every row at unit RMS; the
        # residual stream before it is not normalised.
        np.testing.assert_allclose(np.sqrt((hidden**2).mean(axis=1)), 1.0, atol=1e-4)
        np.testing.assert_allclose(hidden @ output.T, logits, atol=1e-4)
        # Keeping hidden states does not change the logits.
        np.testing.assert_array_equal(engine.evaluate(tokens, all_rows=True), logits)


def test_hidden_states_do_not_leak_into_generation(tiny_target: str) -> None:
    """evaluate_hidden turns hidden output off again: generation afterwards is unchanged."""
    with pyspec.Engine(tiny_target, n_ctx=256, n_threads=2) as engine:
        before = engine.generate("def f(x):", max_tokens=12, method="none").tokens
        engine.evaluate_hidden(engine.tokenize("some text to evaluate"))
        assert engine.generate("def f(x):", max_tokens=12, method="none").tokens == before

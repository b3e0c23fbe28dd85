"""Golden comparison of pyspec.online's PyTorch model with llama.cpp (the llama2.c test_all.py
pattern), shared by the test_online_* modules (tests/ is on sys.path)."""

from __future__ import annotations

import ctypes
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import pyspec
from pyspec.online import DraftModel

# Code and prose, ~60-100 tokens for the tiny and real vocabularies alike: long enough that rope
# and attention over many positions decide the logits.
GOLDEN_TEXT = (
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
    "class Counter:\n    def __init__(self, start=0):\n        self.value = start\n"
    "The quick brown fox jumps over the lazy dog, and then they went on to the next thing.\n"
)


@dataclass
class Comparison:
    torch_logits: np.ndarray  # [n_tokens, n_vocab] float32
    llama_logits: np.ndarray  # [n_tokens, n_vocab] float32

    @property
    def max_abs_diff(self) -> float:
        return float(np.abs(self.torch_logits - self.llama_logits).max())

    @property
    def argmax_mismatches(self) -> list[int]:
        """Positions where the two argmaxes differ."""
        return np.flatnonzero(self.torch_logits.argmax(-1) != self.llama_logits.argmax(-1)).tolist()

    def top2_gaps(self, positions: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Top-2 logit gap of llama.cpp and of PyTorch at `positions`."""
        def gap(logits: np.ndarray) -> np.ndarray:
            top2 = np.sort(logits[positions], axis=-1)[:, -2:]
            return top2[:, 1] - top2[:, 0]
        return gap(self.llama_logits), gap(self.torch_logits)

    def assert_argmax_matches(self, near_tie: float = 0.0) -> None:
        """Same argmax at every position, except where both top-2 gaps are below `near_tie`
        (each such flip is reported as a warning with both gaps)."""
        flips = self.argmax_mismatches
        if not flips:
            return
        llama_gaps, torch_gaps = self.top2_gaps(flips)
        ties = (llama_gaps < near_tie) & (torch_gaps < near_tie)
        assert ties.all(), (f"argmax differs off a near-tie (< {near_tie}) at "
                            f"{[p for p, t in zip(flips, ties) if not t]}: {self.report()}")
        warnings.warn(f"argmax flips on near-ties at {flips}, top-2 gaps llama.cpp "
                      f"{np.round(llama_gaps, 4).tolist()}, PyTorch {np.round(torch_gaps, 4).tolist()}")

    def report(self) -> str:
        scale = float(np.abs(self.llama_logits).max())
        return (f"max |logit diff| {self.max_abs_diff:.4g} (largest |logit| {scale:.3g}), "
                f"argmax differs at {self.argmax_mismatches}")


def golden_tokens(path: str | Path) -> list[int]:
    with pyspec.Engine(str(path), n_ctx=256, n_threads=2) as engine:
        return engine.tokenize(GOLDEN_TEXT)


def compare(path: str | Path, model: DraftModel, tokens: list[int]) -> Comparison:
    """Logits of llama.cpp (pyspec.Engine on `path`) and of `model` for the same tokens."""
    with pyspec.Engine(str(path), n_ctx=256, n_threads=2) as engine:
        llama_logits = engine.evaluate(tokens, all_rows=True)
    with torch.no_grad():
        torch_logits = model(torch.tensor(tokens)).numpy()
    return Comparison(torch_logits, llama_logits)


def quantize_with_llama_cpp(source: Path, out: Path, ftype: str) -> Path:
    """`out` = `source` quantized by llama.cpp's own llama_model_quantize (e.g. ftype "Q4_K_M")."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize failed for {source} -> {ftype}")
    return out

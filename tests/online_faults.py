"""Drafters for the training process that misbehave on request, to test the online loop's
failure paths through a real training process (worker.py loads them by "module:name"; tests/
is on the module search path the process inherits). Each is the real GGUF draft with one
member changed; files named by environment variables switch the fault on and off while the
process runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from pyspec.online.buffer import TraceSample
from pyspec.online.trainer import GGUFDraft

GATE_ENV = "PYSPEC_TEST_TRAINING_GATE"    # folder: "started" is written, "release" awaited
CORRUPT_ENV = "PYSPEC_TEST_CORRUPT_WHILE"  # file: exports are corrupt while it exists


class GatedDraft(GGUFDraft):
    """Training waits, on its first batch of each update, until the test releases it."""

    def row_logits(self, sample: TraceSample) -> torch.Tensor:
        gate = Path(os.environ[GATE_ENV])
        (gate / "started").touch()
        deadline = time.monotonic() + 60
        while not (gate / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return super().row_logits(sample)


class CorruptExport(GGUFDraft):
    """Writes a file that is not a model while the CORRUPT_ENV file exists."""

    def export(self, out: Path) -> Path:
        if Path(os.environ[CORRUPT_ENV]).exists():
            out.write_bytes(b"GGUF this is not a model")
            return out
        return super().export(out)


class BrokenTraining(GGUFDraft):
    def row_logits(self, sample: TraceSample) -> torch.Tensor:
        raise RuntimeError("out of memory (simulated)")

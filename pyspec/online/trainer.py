"""Distilling the draft on buffered generations: OSD's update step (Liu et al., 2024, Alg. 1 l. 20).

For each TraceSample the student (a DraftModel) runs once over the sample's tokens; only the
hidden states at the sample's rows are projected to logits (a whole sequence's logits are
[n_tokens, n_vocab], large for real vocabularies), and the chosen loss compares them with the
target's top-k there (`losses.distill_loss`; the top-k approximation is described in losses.py).
Gradients of `batch_size` samples are summed, weighted by rows, then one AdamW step is taken.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .buffer import POSITIONS, TraceSample
from .export import EXPORT_TYPES
from .losses import LOSSES, TopK, distill_loss
from .model import DraftModel

TEACHERS = ("trace", "evaluate")


@dataclass(frozen=True)
class DistillConfig:
    """How the draft is trained on the target's corrections.

    loss: "fkl" (forward KL), "rkl" (reverse KL), "jsd" (JSD[beta]) or "ce" (cross-entropy on
    the target's token, OSD's FT baseline); tau: temperature on both sides.
    positions: "rejected" (OSD: only where a draft token was rejected) or "all" (every generated
    position). teacher: where the target's distributions come from: "trace" (the generation's
    own record: the trace at rejections; for positions="all" the distiller generates with
    return_logits=True and keeps the top_k of each row), or "evaluate" (recomputed after the
    generation with Engine.evaluate(all_rows=True): one extra target pass over prompt +
    output, under the engine lock, so generation waits for it; for results made elsewhere).
    top_k: target probabilities kept per position when they come from full rows.
    Optimisation: AdamW with lr, weight_decay; `epochs` passes over an update's samples in
    batches of `batch_size` sequences; gradients clipped to max_grad_norm (0: off).
    train_threads: torch's CPU threads while training (torch.set_num_threads is process-wide);
    keep train_threads + the engine's n_threads within the cores, or they slow each other.
    export_dtype: the GGUF type the trained draft is written in (f32, f16, bf16, q8_0; small
    updates can vanish in q8_0 rounding).
    """

    loss: str = "fkl"
    tau: float = 1.0
    beta: float = 0.5
    positions: str = "rejected"
    teacher: str = "trace"
    top_k: int = 32
    lr: float = 1e-4
    weight_decay: float = 0.0
    epochs: int = 1
    batch_size: int = 8
    max_grad_norm: float = 1.0
    train_threads: int = 1
    export_dtype: str = "f16"
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.loss in LOSSES, f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}"),
            (self.tau > 0, f"tau must be > 0, got {self.tau}"),
            (0 < self.beta < 1, f"beta must be in (0, 1), got {self.beta}"),
            (self.positions in POSITIONS, f"positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}"),
            (self.teacher in TEACHERS, f"teacher must be one of {', '.join(TEACHERS)}, got {self.teacher!r}"),
            (self.top_k >= 1, f"top_k must be >= 1, got {self.top_k}"),
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.max_grad_norm >= 0, f"max_grad_norm must be >= 0, got {self.max_grad_norm}"),
            (self.train_threads >= 1, f"train_threads must be >= 1, got {self.train_threads}"),
            (self.export_dtype in EXPORT_TYPES,
             f"export_dtype must be one of {', '.join(EXPORT_TYPES)}, got {self.export_dtype!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(frozen=True)
class TrainReport:
    loss_before: float  # mean loss per position over the first epoch, each batch before its step
    loss_after: float   # mean loss per position over all samples after training
    n_steps: int        # optimizer steps
    n_samples: int
    n_positions: int
    seconds: float


def sample_loss(model: DraftModel, sample: TraceSample, config: DistillConfig) -> torch.Tensor:
    """Summed loss over the sample's rows (a 0-dim tensor with grad)."""
    tokens = torch.from_numpy(sample.tokens.astype(np.int64))
    rows = torch.from_numpy(sample.rows.astype(np.int64))
    hidden = model.hidden_states(tokens)  # [n_tokens, n_embd]
    logits = torch.nn.functional.linear(hidden[rows], model.output_weight)  # [n_rows, n_vocab]
    target = TopK(torch.from_numpy(sample.top_ids.astype(np.int64)), torch.from_numpy(sample.top_probs))
    return distill_loss(logits, target, loss=config.loss, tau=config.tau, beta=config.beta, reduction="sum")


def batch_loss(model: DraftModel, samples: Sequence[TraceSample], config: DistillConfig) -> torch.Tensor:
    """Mean loss per position over `samples` (with grad; wrap in torch.no_grad to evaluate)."""
    n_rows = sum(s.n_rows for s in samples)
    if n_rows == 0:
        raise ValueError("no training positions in these samples")
    return torch.stack([sample_loss(model, s, config) for s in samples]).sum() / n_rows


def make_optimizer(model: DraftModel, config: DistillConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def train_step(model: DraftModel, optimizer: torch.optim.Optimizer, samples: Sequence[TraceSample],
               config: DistillConfig) -> float:
    """One optimizer step on `samples`; returns their mean loss before the step."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = batch_loss(model, samples, config)
    loss.backward()
    if config.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    optimizer.step()
    model.eval()
    return float(loss.detach())


def train(model: DraftModel, optimizer: torch.optim.Optimizer, samples: Sequence[TraceSample],
          config: DistillConfig, rng: np.random.Generator | None = None) -> TrainReport:
    """`config.epochs` shuffled passes over `samples` in batches of config.batch_size."""
    t0 = time.perf_counter()
    torch.set_num_threads(config.train_threads)
    samples = [s for s in samples if s.n_rows > 0]
    if not samples:
        raise ValueError("no training positions in these samples")
    rng = rng if rng is not None else np.random.default_rng(config.seed)
    first_epoch_loss, n_steps = 0.0, 0
    for epoch in range(config.epochs):
        order = rng.permutation(len(samples))
        for start in range(0, len(order), config.batch_size):
            batch = [samples[i] for i in order[start : start + config.batch_size]]
            loss = train_step(model, optimizer, batch, config)
            n_steps += 1
            if epoch == 0:
                first_epoch_loss += loss * sum(s.n_rows for s in batch)
    n_positions = sum(s.n_rows for s in samples)
    with torch.no_grad():
        loss_after = float(batch_loss(model, samples, config))
    return TrainReport(
        loss_before=first_epoch_loss / n_positions,
        loss_after=loss_after,
        n_steps=n_steps,
        n_samples=len(samples),
        n_positions=n_positions,
        seconds=time.perf_counter() - t0,
    )

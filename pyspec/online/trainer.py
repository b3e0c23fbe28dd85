"""Distilling the draft on buffered generations: OSD's update step (Liu et al., 2024, Alg. 1 l. 20).

For each TraceSample the student runs once over the sample's tokens; only the rows the sample
trains are projected to logits (a whole sequence's logits are [n_tokens, n_vocab], large for real
vocabularies), and the chosen loss compares them with the target's top-k there
(`losses.distill_loss`: the top-k plus a tail bucket, see losses.py). Gradients of `batch_size`
samples are summed, weighted by rows, then one AdamW step is taken. With config.train_vocab
False the vocabulary matrices are frozen (`trainable_parameters`): no gradient, no optimizer state;
with config.train_blocks N the blocks before the last N are frozen the same way.

What is trained is a `Distillable`: a module, the logits it gives at a sample's rows, and how it
is written out for the engine. `GGUFDraft` is the draft model of a GGUF file, exported back to
GGUF; another trainable drafter (e.g. a draft head) implements the same three members and is
trained by the same loop and the same training process (worker.py, `factory=`).
`DraftTrainer` is that process's state: the student, its optimizer, the update count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, Union, runtime_checkable

import numpy as np
import torch

from .buffer import TraceSample
from .config import LR_SCHEDULES, TEACHERS, DistillConfig, TrainReport
from .export import ExportTemplate, export_gguf
from .losses import TopK, distill_loss
from .model import DraftModel, load_gguf

__all__ = ["DistillConfig", "Distillable", "DraftTrainer", "GGUFDraft", "LR_SCHEDULES", "TEACHERS", "TrainReport",
           "batch_loss", "frozen_parameters", "frozen_tensor_names", "make_optimizer", "sample_loss", "train",
           "train_step", "trainable_parameters", "vocab_parameters"]


@runtime_checkable
class Distillable(Protocol):
    """A drafter the online loop can train: `module` holds the parameters the optimizer moves,
    `row_logits(sample)` gives its logits [sample.n_rows, n_vocab] at the sample's rows (with
    grad), `export(out)` writes it where the engine can load it and returns the path.
    Optionally `vocab_parameters()`: its parameters indexed by vocabulary (embedding, output
    matrix), which config.train_vocab=False freezes; a drafter without it has none to freeze.
    A drafter made of transformer blocks can offer `early_block_parameters(n)` (every block's
    parameters but the last n's), which config.train_blocks freezes, `start_update()`, called
    before each update's training (to drop what it cached for the previous one), and
    `step_logits(sample)`, which replaces row_logits in the loss when it learns more than one
    distribution per row (sample_loss)."""

    module: torch.nn.Module

    def row_logits(self, sample: TraceSample) -> torch.Tensor: ...

    def export(self, out: Path) -> Path: ...


class GGUFDraft:
    """The draft model of a GGUF file as a Distillable (exported with config.export_dtype)."""

    suffix = ".gguf"

    def __init__(self, path: str | os.PathLike[str], config: DistillConfig) -> None:
        self.module: DraftModel = load_gguf(path)
        self.template = ExportTemplate.read(self.module.source_path or path)  # read once, reused by every export
        self.export_dtype = config.export_dtype
        self.export_threads = config.train_threads
        # Frozen tensors still hold the source's weights: the export copies their bytes.
        self.unchanged = frozen_tensor_names(self.module, config)
        # The blocks below every trained weight (embedding frozen, train_blocks set) give each
        # sequence the same output in every epoch: computed once per sequence and update.
        n_layer = self.module.config.n_layer
        self.n_fixed_blocks = (n_layer - config.train_blocks
                               if not config.train_vocab and 0 < config.train_blocks < n_layer else 0)
        self._fixed: dict[bytes, torch.Tensor] = {}

    def vocab_parameters(self) -> list[torch.nn.Parameter]:
        return self.module.vocab_parameters()

    def early_block_parameters(self, n_trained: int) -> list[torch.nn.Parameter]:
        return self.module.early_block_parameters(n_trained)

    def row_logits(self, sample: TraceSample) -> torch.Tensor:
        ids = sample.tokens.astype(np.int64)
        tokens, rows = torch.from_numpy(ids), torch.from_numpy(sample.rows.astype(np.int64))
        if not self.n_fixed_blocks:
            return self.module.logits_at(tokens, rows)
        key = ids.tobytes()
        x = self._fixed.get(key)
        if x is None:
            with torch.no_grad():
                x = self._fixed[key] = self.module.block_input(tokens, self.n_fixed_blocks)
        return self.module.logits_from(x, self.n_fixed_blocks, rows)

    def start_update(self) -> None:
        """Forgets the fixed blocks' outputs of the previous update's sequences."""
        self._fixed.clear()

    def export(self, out: Path) -> Path:
        return export_gguf(self.module, out, dtype=self.export_dtype, template=self.template,
                           n_threads=self.export_threads, unchanged=self.unchanged)


Student = Union[DraftModel, Distillable]


def _module(student: Student) -> torch.nn.Module:
    return student if isinstance(student, DraftModel) else student.module


def student_row_logits(student: Student, sample: TraceSample) -> torch.Tensor:
    """The student's logits at the sample's rows ([n_rows, n_vocab], with grad when enabled)."""
    if isinstance(student, DraftModel):
        return student.logits_at(torch.from_numpy(sample.tokens.astype(np.int64)),
                                 torch.from_numpy(sample.rows.astype(np.int64)))
    return student.row_logits(sample)


def sample_loss(student: Student, sample: TraceSample, config: DistillConfig) -> torch.Tensor:
    """Summed loss over the sample's rows (a 0-dim tensor with grad). A Distillable with
    `step_logits(sample)` (a draft head training several draft steps) gives a list of
    (logits [n, n_vocab], index [n] of the sample rows whose target distributions they learn);
    the loss is summed over all of them."""
    steps = getattr(student, "step_logits", None)
    parts = steps(sample) if callable(steps) else [(student_row_logits(student, sample), None)]
    total = None
    for logits, at in parts:
        ids, probs = (sample.top_ids, sample.top_probs) if at is None else (sample.top_ids[at], sample.top_probs[at])
        target = TopK(torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(probs))
        part = distill_loss(logits, target, loss=config.loss, tau=config.tau, beta=config.beta, reduction="sum")
        total = part if total is None else total + part
    if total is None:
        raise ValueError("the student gave no logits for this sample")
    return total


def batch_loss(student: Student, samples: Sequence[TraceSample], config: DistillConfig) -> torch.Tensor:
    """Mean loss per position over `samples` (with grad; wrap in torch.no_grad to evaluate)."""
    n_rows = sum(s.n_rows for s in samples)
    if n_rows == 0:
        raise ValueError("no training positions in these samples")
    return torch.stack([sample_loss(student, s, config) for s in samples]).sum() / n_rows


def vocab_parameters(student: Student) -> list[torch.nn.Parameter]:
    """The student's vocabulary matrices (empty for a Distillable without `vocab_parameters`)."""
    if isinstance(student, DraftModel):
        return student.vocab_parameters()
    named = getattr(student, "vocab_parameters", None)
    return list(named()) if callable(named) else []


def frozen_parameters(student: Student, config: DistillConfig) -> list[torch.nn.Parameter]:
    """The parameters config keeps as loaded: the vocabulary matrices unless config.train_vocab,
    the blocks before the last config.train_blocks when that is set."""
    frozen = [] if config.train_vocab else vocab_parameters(student)
    if config.train_blocks:
        early = getattr(student, "early_block_parameters", None)
        if not callable(early):
            raise ValueError(f"train_blocks={config.train_blocks} needs a draft made of transformer blocks; "
                             f"{type(student).__name__} has none")
        frozen += list(early(config.train_blocks))
    return frozen


def frozen_tensor_names(model: DraftModel, config: DistillConfig) -> list[str]:
    """GGUF names of the tensors config keeps as loaded (export_gguf's `unchanged`)."""
    frozen = {id(p) for p in frozen_parameters(model, config)}
    return [name for name, p in model.gguf_tensors().items() if id(p) in frozen]


def trainable_parameters(student: Student, config: DistillConfig) -> list[torch.nn.Parameter]:
    """The parameters training moves. Frozen ones (frozen_parameters) get requires_grad False
    first, so backward computes no gradient for them (the embedding's dense [n_vocab, n_embd]
    gradient is never allocated, and blocks below every trained one are run without a graph)."""
    for param in frozen_parameters(student, config):
        param.requires_grad_(False)
    return [p for p in _module(student).parameters() if p.requires_grad]


def make_optimizer(student: Student, config: DistillConfig) -> torch.optim.Optimizer:
    """AdamW over trainable_parameters (frozen ones hold no state in it)."""
    params = trainable_parameters(student, config)
    if not params:
        raise ValueError("the student has no parameters to train (train_vocab/train_blocks froze every one)")
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def train_step(student: Student, optimizer: torch.optim.Optimizer, samples: Sequence[TraceSample],
               config: DistillConfig) -> float:
    """One optimizer step on `samples`; returns their mean loss before the step."""
    module = _module(student)
    module.train()
    optimizer.zero_grad(set_to_none=True)
    loss = batch_loss(student, samples, config)
    loss.backward()
    if config.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(module.parameters(), config.max_grad_norm)
    optimizer.step()
    module.eval()
    return float(loss.detach())


def train(student: Student, optimizer: torch.optim.Optimizer, samples: Sequence[TraceSample],
          config: DistillConfig, rng: np.random.Generator | None = None, *,
          rehearsed: Sequence[TraceSample] = (), lr: float | None = None) -> TrainReport:
    """`config.epochs` shuffled passes over `samples` and `rehearsed` (earlier samples replayed
    with them) in batches of config.batch_size, at learning rate `lr` (default config.lr)."""
    t0 = time.perf_counter()
    torch.set_num_threads(config.train_threads)
    lr = config.lr if lr is None else lr
    for group in optimizer.param_groups:
        group["lr"] = lr
    everything = [s for s in [*samples, *rehearsed] if s.n_rows > 0]
    if not any(s.n_rows for s in samples):
        raise ValueError("no training positions in these samples")
    rng = rng if rng is not None else np.random.default_rng(config.seed)
    first_epoch_loss, step_losses = 0.0, []
    for epoch in range(config.epochs):
        order = rng.permutation(len(everything))
        for start in range(0, len(order), config.batch_size):
            batch = [everything[i] for i in order[start : start + config.batch_size]]
            loss = train_step(student, optimizer, batch, config)
            step_losses.append(loss)
            if epoch == 0:
                first_epoch_loss += loss * sum(s.n_rows for s in batch)
    n_positions = sum(s.n_rows for s in everything)
    with torch.no_grad():
        loss_after = float(batch_loss(student, everything, config))
    return TrainReport(
        loss_before=first_epoch_loss / n_positions,
        loss_after=loss_after,
        n_steps=len(step_losses),
        n_samples=len(everything),
        n_positions=n_positions,
        seconds=time.perf_counter() - t0,
        n_rehearsed=sum(s.n_rows for s in rehearsed),
        lr=lr,
        step_losses=tuple(step_losses),
    )


class DraftTrainer:
    """The training state of one drafter: the student (float32 master weights, kept between
    updates), its optimizer and the update count. Lives in the training process (worker.py).

    factory(path, config) -> Distillable builds the student from a file (default GGUFDraft).
    update(): train on the samples, export to work_dir/<name>-<n><suffix> (unless
    export=False), return the path and report. reset(path): start again from a file's weights
    (the one serving, after an update that did not reach the engine) with a fresh optimizer;
    the update count, and so the learning-rate schedule, continues.
    """

    def __init__(self, path: str | os.PathLike[str], config: DistillConfig, work_dir: str | os.PathLike[str], *,
                 name: str = "draft", factory: Callable[[str, DistillConfig], Distillable] | None = None) -> None:
        self.config = config
        self.work_dir = Path(work_dir)
        self.name = name
        self.factory = factory or GGUFDraft
        self.n_updates = 0
        self.n_exports = 0
        self._rng = np.random.default_rng(config.seed)
        torch.set_num_threads(config.train_threads)
        self.reset(path)

    def reset(self, path: str | os.PathLike[str]) -> None:
        self.student = self.factory(os.fspath(path), self.config)
        self.optimizer = make_optimizer(self.student, self.config)

    def update(self, samples: Sequence[TraceSample], rehearsed: Sequence[TraceSample] = (), *,
               export: bool = True) -> tuple[Path | None, TrainReport]:
        """Trains update n_updates + 1 (its learning rate, the student's per-update reset) and
        exports it; export=False leaves the weights in memory (path None; a replay of the
        schedule that measures the float32 weights, benchmarks/online_sim.py)."""
        lr = self.config.lr_at(self.n_updates + 1)
        start = getattr(self.student, "start_update", None)
        if callable(start):
            start()
        report = train(self.student, self.optimizer, samples, self.config, self._rng, rehearsed=rehearsed, lr=lr)
        path = None
        if export:
            self.n_exports += 1
            t0 = time.perf_counter()
            out = self.work_dir / f"{self.name}-{self.n_exports}{getattr(self.student, 'suffix', '')}"
            path = self.student.export(out)
            report = TrainReport(**{**report.__dict__, "export_seconds": time.perf_counter() - t0})
        self.n_updates += 1
        return path, report

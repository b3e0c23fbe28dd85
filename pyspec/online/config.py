"""Settings and reports of draft training that the serving process needs without PyTorch: the
trainer runs in its own process (worker.py), and these cross the pipe to it and back.

Export types (`DistillConfig.export_dtype`):
- "source" (default): each tensor in the type the source GGUF stores it in, so the trained draft
  costs what the draft it replaces cost (a Q5_0 draft exported in f16 ran 1.65x slower per token);
- "source+q8_0": the tensors training moves in q8_0, the frozen ones (train_vocab=False,
  train_blocks) copied from the source in its types. Small updates survive q8_0's rounding
  (they can vanish in Q5_0's: `benchmarks/online_sim.py --served`, docs/results-online.md)
  while the frozen vocabulary matrices, most of a small draft's bytes, keep the source's cost;
- "f32", "f16", "bf16", "q8_0": written directly (the gguf package's encoders);
- the other llama.cpp file types ("q4_k_m", "q5_0", "q6_k", ...): written as f32, then
  converted by llama.cpp's own quantizer with its per-tensor mix (`llama_model_quantize`).
Small weight updates can vanish in the rounding of a quantized type; the trainer keeps float32
master weights, so updates accumulate across exports even when one alone does not show.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

from .buffer import POSITIONS

_FILE_TYPE = gguf.LlamaFileType

# Written by the gguf package directly: name -> (tensor type of the matrices, general.file_type).
DIRECT_TYPES: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "f32": (gguf.GGMLQuantizationType.F32, _FILE_TYPE.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, _FILE_TYPE.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, _FILE_TYPE.MOSTLY_BF16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, _FILE_TYPE.MOSTLY_Q8_0),
}

# Written by llama.cpp's quantizer (from an f32 export): name -> llama_ftype. The i-quants are
# left out: most of them need an importance matrix.
LLAMA_TYPES: dict[str, gguf.LlamaFileType] = {
    name: _FILE_TYPE[f"MOSTLY_{name.upper()}"]
    for name in ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m",
                 "q5_k_s", "q5_k_m", "q6_k")
}

# "source+q8_0": what training moves in q8_0, what it froze in the source's types.
MIXED_Q8_0 = "source+q8_0"

EXPORT_TYPES: tuple[str, ...] = ("source", MIXED_Q8_0, *DIRECT_TYPES, *LLAMA_TYPES)

TEACHERS = ("trace", "evaluate")
LR_SCHEDULES = ("constant", "inverse_sqrt")


# The help text of the --train-blocks flags (pyspec distill, pyspec serve --online, benchmarks).
TRAIN_BLOCKS_HELP = ("train only the draft's last N transformer blocks (default 0: all); with the vocabulary "
                     "frozen too, the earlier blocks run once per sequence and update, without a backward graph")


@dataclass(frozen=True)
class DistillConfig:
    """How the draft is trained on the target's corrections.

    loss: "fkl" (forward KL), "rkl" (reverse KL), "jsd" (JSD[beta]) or "ce" (cross-entropy on
    the target's token, OSD's FT baseline); tau: temperature on both sides (losses.py: top-k
    targets carry a tail bucket and the rejected draft token).
    positions: "rejected" (OSD: only where a draft token was rejected) or "all" (every generated
    position). teacher: where the target's distributions come from: "trace" (the generation's
    own record: the trace at rejections; for positions="all" the distiller generates with
    return_logits=True and keeps the top_k of each row), or "evaluate" (recomputed after the
    generation with Engine.evaluate over the output rows only: one extra target pass per
    request, under the engine lock, so generation waits for it; for results made elsewhere).
    top_k: target probabilities kept per position when they come from full rows.
    prompt_positions: also train on the prompt's positions, with the target's rows over the
    prompt (one extra target pass over it per request, under the engine lock; with teacher
    "evaluate" the pass that gives the output's rows gives them too). The rows of the
    prompt's common prefix with the previous request's prompt (a shared system prompt or chat
    template) are left out, so text every request repeats is not trained on again and again.
    On chat a request's prompt often holds more tokens than its answer: this is more of the
    target's text in the request's domain for the same traffic.
    Optimisation: AdamW with lr, weight_decay; `epochs` passes over an update's samples in
    batches of `batch_size` sequences; gradients clipped to max_grad_norm (0: off).
    lr_schedule: "constant", or "inverse_sqrt" (update u, from 1, trains at lr / sqrt(u): later
    updates move the weights less, so they overwrite less of what earlier ones learnt).
    rehearsal: positions of earlier, already trained samples replayed with each update, per new
    position (0: none, OSD's buffer release; 1: as many old positions as new ones), drawn at
    random from a reservoir of at most rehearsal_limit positions that is a uniform sample of
    every released sample so far (so no domain of a shifting stream is forgotten).
    train_vocab: whether the vocabulary matrices (token embedding, and the output matrix, tied
    to it or not) are trained. False freezes them: they get no gradient and no AdamW state and
    are exported unchanged; only the blocks and norms learn. For a small draft with a large
    vocabulary they hold most of the parameters (272M of 362M for 6 Qwen2.5 blocks), and so
    most of the training's memory and of its optimizer time (docs/results-online.md, "Freezing
    the vocabulary").
    train_blocks: how many of the draft's last transformer blocks are trained (0: all). The
    blocks before them are frozen as the vocabulary is, and with train_vocab False too the
    training runs them without building a graph for backward: an update then costs one forward
    pass plus the backward and AdamW step of the trained blocks only, which is what lets a
    large draft's updates keep up with the traffic they learn from (docs/results-online.md,
    "Training only the last blocks").
    train_threads: torch's CPU threads in the training process; keep train_threads + the
    engine's n_threads within the cores, or they slow each other.
    export_dtype: the GGUF type of the trained draft (module docstring; default "source").
    head_depth: for a draft head (pyspec.head.online.HeadDistiller), how many of its draft steps
    an update trains: 1 (the default) the first step only; k > 1 also steps 2..k of an
    EAGLE-class head, as its offline training does (each step from the head's own predicted
    feature and the real next token, against the target's distribution there), so that moving
    the first step does not leave the later ones, which reuse its layer, behind. The loss is
    then summed over the steps. The recurrent head trains its first step whatever this says.
    """

    loss: str = "fkl"
    tau: float = 1.0
    beta: float = 0.5
    positions: str = "rejected"
    teacher: str = "trace"
    top_k: int = 32
    prompt_positions: bool = False
    lr: float = 1e-4
    lr_schedule: str = "constant"
    weight_decay: float = 0.0
    epochs: int = 1
    batch_size: int = 8
    max_grad_norm: float = 1.0
    rehearsal: float = 0.0
    rehearsal_limit: int = 16384
    train_vocab: bool = True
    train_blocks: int = 0
    train_threads: int = 1
    export_dtype: str = "source"
    seed: int = 0
    head_depth: int = 1

    def __post_init__(self) -> None:
        losses = ("fkl", "rkl", "jsd", "ce")  # losses.LOSSES, which needs torch
        checks = [
            (self.loss in losses, f"loss must be one of {', '.join(losses)}, got {self.loss!r}"),
            (self.tau > 0, f"tau must be > 0, got {self.tau}"),
            (0 < self.beta < 1, f"beta must be in (0, 1), got {self.beta}"),
            (self.positions in POSITIONS, f"positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}"),
            (self.teacher in TEACHERS, f"teacher must be one of {', '.join(TEACHERS)}, got {self.teacher!r}"),
            (self.top_k >= 1, f"top_k must be >= 1, got {self.top_k}"),
            (isinstance(self.prompt_positions, bool),
             f"prompt_positions must be True or False, got {self.prompt_positions!r}"),
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (self.lr_schedule in LR_SCHEDULES,
             f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.max_grad_norm >= 0, f"max_grad_norm must be >= 0, got {self.max_grad_norm}"),
            (self.rehearsal >= 0, f"rehearsal must be >= 0, got {self.rehearsal}"),
            (self.rehearsal_limit >= 0, f"rehearsal_limit must be >= 0 positions, got {self.rehearsal_limit}"),
            (isinstance(self.train_vocab, bool), f"train_vocab must be True or False, got {self.train_vocab!r}"),
            (isinstance(self.train_blocks, int) and not isinstance(self.train_blocks, bool) and self.train_blocks >= 0,
             f"train_blocks must be a whole number of blocks >= 0 (0: all), got {self.train_blocks!r}"),
            (self.train_threads >= 1, f"train_threads must be >= 1, got {self.train_threads}"),
            (isinstance(self.head_depth, int) and not isinstance(self.head_depth, bool) and self.head_depth >= 1,
             f"head_depth must be a whole number of draft steps >= 1, got {self.head_depth!r}"),
            (self.export_dtype in EXPORT_TYPES,
             f"export_dtype must be one of {', '.join(EXPORT_TYPES)}, got {self.export_dtype!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def lr_at(self, update: int) -> float:
        """The learning rate of update `update` (from 1) under lr_schedule."""
        return self.lr if self.lr_schedule == "constant" else self.lr / max(1, update) ** 0.5


@dataclass(frozen=True)
class TrainReport:
    # Mean loss per position over the first epoch, each batch before its step: a running mean
    # taken while the weights move, not the batch's loss before the update (a first step that
    # overshoots lifts it above the starting loss; measure that with batch_loss when it matters).
    loss_before: float
    loss_after: float   # mean loss per position over all samples after training
    n_steps: int        # optimizer steps
    n_samples: int      # samples trained on (new and rehearsed)
    n_positions: int    # their positions
    seconds: float      # training time
    n_rehearsed: int = 0        # of n_positions, positions of earlier samples replayed
    lr: float = 0.0             # the learning rate this update used
    export_seconds: float = 0.0  # writing (and quantizing) the GGUF
    step_losses: tuple[float, ...] = ()  # each step's batch loss (mean per position) before its step

"""Online distillation of the draft model in PyTorch (needs `pip install "pyspec-engine[train]"`).

    >>> from pyspec.online import load_gguf, export_gguf, TopK, distill_loss
    >>> draft = load_gguf("draft.gguf")            # DraftModel: float32 nn.Module, eval mode
    >>> logits = draft(torch.tensor([token_ids]))  # [1, n_tokens, n_vocab], same as llama.cpp's
    >>> loss = distill_loss(logits[0, rows], TopK(ids, probs), loss="fkl", tau=1.0)
    >>> export_gguf(draft, "draft-tuned.gguf", dtype="q8_0")   # tokenizer and metadata kept

Online loop (OSD): `OnlineDistiller(engine, DistillConfig(...))` buffers the target's corrections
from every generation, trains the draft in a background thread and hot-reloads it into the engine
(distiller.py); `DomainRouter` keeps one draft and one distiller per domain (router.py).

`import pyspec` never imports torch; this subpackage does.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'pyspec.online needs PyTorch: pip install "pyspec-engine[train]" (torch==2.13.0)'
    ) from exc

from .buffer import ReplayBuffer, TraceSample, sample_from_rows, samples_from_result, top_k_of_logits
from .distiller import DistillerStats, OnlineDistiller, RequestRecord
from .export import EXPORT_TYPES, export_gguf
from .gguf_read import ModelConfig, UnsupportedModelError, open_gguf, read_config, read_gguf
from .losses import LOSSES, TopK, cross_entropy, distill_loss, forward_kl, jsd, reverse_kl, target_tokens
from .model import DraftModel, load_gguf
from .router import DomainRouter, PromptCentroids
from .trainer import DistillConfig, TrainReport, batch_loss, make_optimizer, train, train_step

__all__ = [
    "DistillConfig",
    "DistillerStats",
    "DomainRouter",
    "DraftModel",
    "EXPORT_TYPES",
    "LOSSES",
    "ModelConfig",
    "OnlineDistiller",
    "PromptCentroids",
    "ReplayBuffer",
    "RequestRecord",
    "TopK",
    "TraceSample",
    "TrainReport",
    "UnsupportedModelError",
    "batch_loss",
    "cross_entropy",
    "distill_loss",
    "export_gguf",
    "forward_kl",
    "jsd",
    "load_gguf",
    "make_optimizer",
    "open_gguf",
    "read_config",
    "read_gguf",
    "reverse_kl",
    "sample_from_rows",
    "samples_from_result",
    "target_tokens",
    "top_k_of_logits",
    "train",
    "train_step",
]

"""Online distillation of the draft model (training needs `pip install "pyspec-engine[train]"`).

    >>> from pyspec.online import load_gguf, export_gguf, TopK, distill_loss
    >>> draft = load_gguf("draft.gguf")            # DraftModel: float32 nn.Module, eval mode
    >>> logits = draft(torch.tensor([token_ids]))  # [1, n_tokens, n_vocab], same as llama.cpp's
    >>> loss = distill_loss(logits[0, rows], TopK(ids, probs), loss="fkl", tau=1.0)
    >>> export_gguf(draft, "draft-tuned.gguf")     # the source's quantization, metadata kept

Online loop (OSD): `OnlineDistiller(engine, DistillConfig(...))` buffers the target's corrections
from every generation, has a training process (worker.py: `TrainerProcess`, which owns the
PyTorch draft) train on them and hot-reloads the draft it writes (distiller.py); `DomainRouter`
keeps one draft and one distiller per domain (router.py).

`import pyspec` never imports torch, and neither do the serving parts here (OnlineDistiller,
DomainRouter, TrainerProcess, ReplayBuffer, DistillConfig): names are imported on first use, and
only the training names (models, losses, export, trainer) import torch, in the process that
trains.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module, for the names that need no torch
_SERVING = {
    "DistillConfig": ".config", "EXPORT_TYPES": ".config", "TrainReport": ".config",
    "ReplayBuffer": ".buffer", "TraceSample": ".buffer", "sample_from_rows": ".buffer",
    "samples_from_result": ".buffer", "top_k_of_logits": ".buffer",
    "DistillerStats": ".distiller", "OnlineDistiller": ".distiller", "RequestRecord": ".distiller",
    "UpdateRecord": ".distiller",
    "DomainRouter": ".router", "PromptCentroids": ".router",
    "TrainerError": ".worker", "TrainerExitedError": ".worker", "TrainerProcess": ".worker",
    "UpdateResult": ".worker",
    "ModelConfig": ".gguf_read", "UnsupportedModelError": ".gguf_read", "open_gguf": ".gguf_read",
    "read_config": ".gguf_read", "read_gguf": ".gguf_read",
}
# name -> module, for the names that train (they import torch)
_TRAINING = {
    "ExportTemplate": ".export", "export_gguf": ".export",
    "LOSSES": ".losses", "TopK": ".losses", "cross_entropy": ".losses", "distill_loss": ".losses",
    "forward_kl": ".losses", "jsd": ".losses", "reverse_kl": ".losses", "target_tokens": ".losses",
    "DraftModel": ".model", "load_gguf": ".model",
    "Distillable": ".trainer", "DraftTrainer": ".trainer", "GGUFDraft": ".trainer", "batch_loss": ".trainer",
    "make_optimizer": ".trainer", "train": ".trainer", "train_step": ".trainer",
}

__all__ = sorted([*_SERVING, *_TRAINING])


def __getattr__(name: str) -> Any:
    module = _SERVING.get(name) or _TRAINING.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _TRAINING:
        try:
            import torch  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(f'pyspec.online.{name} needs PyTorch: pip install "pyspec-engine[train]" '
                              f'(torch==2.13.0)') from exc
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

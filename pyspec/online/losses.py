"""Distillation losses for the draft (student, q) against the target (teacher, p), as in online
speculative decoding (Liu et al., ICML 2024, eq. 3):

    forward KL   KL(p || q)
    reverse KL   KL(q || p)
    JSD[beta]    beta KL(p || m) + (1 - beta) KL(q || m),   m = beta p + (1 - beta) q
    cross-entropy on the target's token: -log q(y), y = the target's argmax unless given

Temperature tau applies to both sides: q = softmax(z / tau) for student logits z, and the
target's probabilities become p^(1 / tau), renormalised (= softmax(target logits / tau)). No
tau^2 factor is applied.

The target comes either as full rows of probabilities ([n, V]) or as its top k (`TopK`: ids and
probabilities, e.g. the engine's trace at rejections). Top-k approximation: both distributions
are restricted to the k ids of each row and renormalised there, i.e. the losses are the exact
divergences between p and q conditioned on the target's top-k set. The student's mass outside
that set gets no gradient (the tail is not lumped into an extra bin); with k = 32 the target's
top-k usually holds nearly all of its mass. Cross-entropy always uses the student's full softmax.

Target probabilities are floored at the smallest normal float32 before taking logs, so a zero in
the target gives a large finite reverse-KL term instead of inf. All losses compute in float32
and reduce over rows with `reduction` = "mean" (default), "sum" or "none" ([n]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Union

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class TopK:
    """The target's top-k per row; probabilities need not sum to 1 (they are renormalised)."""

    ids: torch.Tensor    # [n, k] int64 token ids
    probs: torch.Tensor  # [n, k] float probabilities of those ids (any positive scale)


Target = Union[torch.Tensor, TopK]  # full rows: [n, V] float probabilities


def _check(student_logits: torch.Tensor, target: Target, tau: float) -> None:
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if student_logits.dim() != 2:
        raise ValueError(f"student_logits must be [n, V], got shape {tuple(student_logits.shape)}")
    n, n_vocab = student_logits.shape
    if isinstance(target, TopK):
        if target.ids.shape != target.probs.shape or target.ids.dim() != 2 or target.ids.shape[0] != n:
            raise ValueError(f"TopK ids and probs must both be [n={n}, k], got "
                             f"{tuple(target.ids.shape)} and {tuple(target.probs.shape)}")
    elif target.shape != (n, n_vocab):
        raise ValueError(f"target probabilities must be [n={n}, V={n_vocab}] like the student "
                         f"logits, got {tuple(target.shape)}")


def _log_probs(student_logits: torch.Tensor, target: Target, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log p and log q at temperature tau over the support: [n, V] for full rows, [n, k] for TopK."""
    _check(student_logits, target, tau)
    logits = student_logits.float()
    probs = target.probs if isinstance(target, TopK) else target
    if isinstance(target, TopK):
        logits = logits.gather(-1, target.ids.long())
    floor = torch.finfo(torch.float32).tiny
    log_p = F.log_softmax(probs.float().clamp_min(floor).log() / tau, dim=-1)
    log_q = F.log_softmax(logits / tau, dim=-1)
    return log_p, log_q


def _reduce(per_row: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return per_row.mean()
    if reduction == "sum":
        return per_row.sum()
    if reduction == "none":
        return per_row
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) per row, from log-probabilities: sum a (log a - log b)."""
    return (log_a.exp() * (log_a - log_b)).sum(-1)


def forward_kl(student_logits: torch.Tensor, target: Target, *, tau: float = 1.0,
               reduction: str = "mean") -> torch.Tensor:
    """KL(p || q): mass-covering; the student pays where the target has mass it lacks."""
    log_p, log_q = _log_probs(student_logits, target, tau)
    return _reduce(_kl(log_p, log_q), reduction)


def reverse_kl(student_logits: torch.Tensor, target: Target, *, tau: float = 1.0,
               reduction: str = "mean") -> torch.Tensor:
    """KL(q || p): mode-seeking; the student pays for mass where the target has little."""
    log_p, log_q = _log_probs(student_logits, target, tau)
    return _reduce(_kl(log_q, log_p), reduction)


def jsd(student_logits: torch.Tensor, target: Target, *, beta: float = 0.5, tau: float = 1.0,
        reduction: str = "mean") -> torch.Tensor:
    """JSD[beta] = beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q; 0 < beta < 1."""
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    log_p, log_q = _log_probs(student_logits, target, tau)
    log_m = torch.logaddexp(log_p + math.log(beta), log_q + math.log(1.0 - beta))
    return _reduce(beta * _kl(log_p, log_m) + (1.0 - beta) * _kl(log_q, log_m), reduction)


def target_tokens(target: Target) -> torch.Tensor:
    """[n] int64: the target's most probable token per row."""
    if isinstance(target, TopK):
        return target.ids.long().gather(-1, target.probs.argmax(-1, keepdim=True)).squeeze(-1)
    return target.argmax(-1)


def cross_entropy(student_logits: torch.Tensor, target: Target, *, tau: float = 1.0,
                  tokens: torch.Tensor | None = None, reduction: str = "mean") -> torch.Tensor:
    """-log q(y) over the student's full vocabulary; y = `tokens` ([n] int64) or the target's argmax."""
    _check(student_logits, target, tau)
    y = target_tokens(target) if tokens is None else tokens.long()
    log_q = F.log_softmax(student_logits.float() / tau, dim=-1)
    return _reduce(-log_q.gather(-1, y[:, None]).squeeze(-1), reduction)


LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "fkl": forward_kl,
    "rkl": reverse_kl,
    "jsd": jsd,
    "ce": cross_entropy,
}


def distill_loss(student_logits: torch.Tensor, target: Target, *, loss: str = "fkl", tau: float = 1.0,
                 beta: float = 0.5, tokens: torch.Tensor | None = None,
                 reduction: str = "mean") -> torch.Tensor:
    """One of LOSSES by name ("fkl", "rkl", "jsd", "ce"); beta is used by jsd, tokens by ce."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    if loss == "jsd":
        return jsd(student_logits, target, beta=beta, tau=tau, reduction=reduction)
    if loss == "ce":
        return cross_entropy(student_logits, target, tau=tau, tokens=tokens, reduction=reduction)
    return LOSSES[loss](student_logits, target, tau=tau, reduction=reduction)

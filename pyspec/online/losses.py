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
probabilities, e.g. the engine's trace at rejections, with the rejected draft token added). A
top-k target is a distribution over k + 1 bins: the k ids, and a tail bucket holding the rest of
its mass, 1 - sum(top-k probabilities) (the trace's probabilities are normalised over the whole
vocabulary). The student's full softmax is summed into the same bins: its probability of each
of the k ids, and everything else in the tail. So every student logit gets a gradient: a draft
whose argmax lies outside the target's top-k puts most of its mass in the tail bucket, where the
target has little, and pays for it (forward KL: p_tail log(p_tail / q_tail) + sum over the set,
which only vanishes when q matches p on every bin). Ids of -1 pad a row (probability 0); they are
left out of both distributions.

Temperature and a top-k target: p_i^(1 / tau) for the k ids; the tail's mass is tempered as if
it were spread evenly over the V - k ids outside the set (their individual probabilities are not
known), i.e. (p_tail / m)^(1 / tau) * m with m = V - k. Exact at tau = 1.

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
    """The target's top-k per row, as probabilities over the whole vocabulary: the rest of each
    row's mass (1 - sum) is its tail bucket. Rows that sum to more than 1 (rounding) are scaled
    to 1 (empty tail). Ids are distinct within a row; -1 pads a row (its probability is ignored)."""

    ids: torch.Tensor    # [n, k] int64 token ids, -1 = padding
    probs: torch.Tensor  # [n, k] float probabilities of those ids


Target = Union[torch.Tensor, TopK]  # full rows: [n, V] float probabilities

_FLOOR = torch.finfo(torch.float32).tiny


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
        if target.ids.numel() and int(target.ids.max()) >= n_vocab:
            raise ValueError(f"TopK id {int(target.ids.max())} is outside the student's vocabulary of {n_vocab}")
    elif target.shape != (n, n_vocab):
        raise ValueError(f"target probabilities must be [n={n}, V={n_vocab}] like the student "
                         f"logits, got {tuple(target.shape)}")


def _log_probs(student_logits: torch.Tensor, target: Target,
               tau: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log p, log q at temperature tau over the bins, and which bins exist (None: all).

    Full rows: [n, V] each. TopK: [n, k + 1]: the k ids, then the tail bucket; padded ids (and
    the tail when the set covers the vocabulary) are masked out, with log p = log q = 0 there
    so that no NaN reaches a gradient.
    """
    _check(student_logits, target, tau)
    logits = student_logits.float() / tau
    if not isinstance(target, TopK):
        log_p = F.log_softmax(target.float().clamp_min(_FLOOR).log() / tau, dim=-1)
        return log_p, F.log_softmax(logits, dim=-1), None

    n, n_vocab = logits.shape
    valid = target.ids >= 0                                           # [n, k]
    ids = target.ids.long().clamp_min(0)
    # Student: its probability of each id, and of everything else (the tail), from the full softmax.
    log_z = logits.logsumexp(-1, keepdim=True)                       # [n, 1]
    in_set = torch.zeros(n, n_vocab + 1, dtype=torch.bool, device=logits.device)
    in_set.scatter_(1, torch.where(valid, ids, n_vocab), True)        # padding marks the spare column
    in_set = in_set[:, :n_vocab]
    log_q_tail = logits.masked_fill(in_set, -math.inf).logsumexp(-1, keepdim=True) - log_z
    log_q = torch.cat([logits.gather(-1, ids) - log_z, log_q_tail], dim=-1)  # [n, k + 1]

    # Target: the given probabilities, and 1 - their sum in the tail.
    probs = target.probs.float().masked_fill(~valid, 0.0)
    total = probs.sum(-1, keepdim=True)
    probs = probs / total.clamp_min(1.0)
    p_tail = (1.0 - probs.sum(-1, keepdim=True)).clamp_min(0.0)
    n_outside = n_vocab - in_set.sum(-1, keepdim=True)                # ids in the tail bucket
    log_outside = n_outside.clamp_min(1).float().log()
    log_p_tail = (p_tail.clamp_min(_FLOOR).log() - log_outside) / tau + log_outside
    mask = torch.cat([valid, n_outside > 0], dim=-1)                  # [n, k + 1]
    log_p = torch.cat([probs.clamp_min(_FLOOR).log() / tau, log_p_tail], dim=-1)
    log_p = F.log_softmax(log_p.masked_fill(~mask, -math.inf), dim=-1)
    return log_p.masked_fill(~mask, 0.0), log_q.masked_fill(~mask, 0.0), mask


def _reduce(per_row: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return per_row.mean()
    if reduction == "sum":
        return per_row.sum()
    if reduction == "none":
        return per_row
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _kl(log_a: torch.Tensor, log_b: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """KL(a || b) per row, from log-probabilities: sum a (log a - log b) over the bins in mask."""
    terms = log_a.exp() * (log_a - log_b)
    return (terms if mask is None else terms.masked_fill(~mask, 0.0)).sum(-1)


def forward_kl(student_logits: torch.Tensor, target: Target, *, tau: float = 1.0,
               reduction: str = "mean") -> torch.Tensor:
    """KL(p || q): mass-covering; the student pays where the target has mass it lacks."""
    log_p, log_q, mask = _log_probs(student_logits, target, tau)
    return _reduce(_kl(log_p, log_q, mask), reduction)


def reverse_kl(student_logits: torch.Tensor, target: Target, *, tau: float = 1.0,
               reduction: str = "mean") -> torch.Tensor:
    """KL(q || p): mode-seeking; the student pays for mass it puts where the target has little
    (with a top-k target: on ids the target ranks low, or in the tail bucket when the target's
    tail is small)."""
    log_p, log_q, mask = _log_probs(student_logits, target, tau)
    return _reduce(_kl(log_q, log_p, mask), reduction)


def jsd(student_logits: torch.Tensor, target: Target, *, beta: float = 0.5, tau: float = 1.0,
        reduction: str = "mean") -> torch.Tensor:
    """JSD[beta] = beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q; 0 < beta < 1."""
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    log_p, log_q, mask = _log_probs(student_logits, target, tau)
    log_m = torch.logaddexp(log_p + math.log(beta), log_q + math.log(1.0 - beta))
    return _reduce(beta * _kl(log_p, log_m, mask) + (1.0 - beta) * _kl(log_q, log_m, mask), reduction)


def target_tokens(target: Target) -> torch.Tensor:
    """[n] int64: the target's most probable token per row."""
    if isinstance(target, TopK):
        probs = target.probs.masked_fill(target.ids < 0, -1.0)
        return target.ids.long().gather(-1, probs.argmax(-1, keepdim=True)).squeeze(-1)
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

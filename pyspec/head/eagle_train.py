"""Training and held-out evaluation of the EAGLE-class head (pyspec/head/eagle.py).

The head attends over the anchors before the one it drafts from, so it trains on windows of
consecutive rows of a sequence rather than on independent rows: a window of W rows is one
example, every row in it an anchor, and each anchor runs `depth` draft steps on the head's own
predicted features. The metrics are those of the recurrent head's evaluation (train.evaluate):
acc@k (step k's top-1 equals the target's argmax at that row, the earlier tokens given) and
chain@k (steps 1..k all right: what a greedy chain drafted by the head gets accepted), per anchor
that has a row k steps ahead. Evaluation uses windows as long as the longest sequence, so every
anchor sees its whole context.

The resumable loop is train.train_head's, with this module's loss and evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch.nn import functional as F

from .data import HeadSequence
from .eagle import EagleHead
from .train import DepthTally, teacher_rows


@dataclass
class Windows:
    """Rows of a set of sequences, flat, and the windows over them.

    hidden [R, d] f16; next_tokens [R, depth] the tokens x_{t+1..t+depth} after each row (0 past
    the end); seq_end [R] the flat index one past the last row of the row's sequence;
    teacher_cols / teacher_probs [R, top_k] each row's distribution over kept columns (-1: not
    kept), renormalised; teacher_top [R] the target's argmax column (-1: not kept);
    starts / lengths [N]: each window's first row and its number of rows.
    """

    hidden: np.ndarray
    next_tokens: np.ndarray
    seq_end: np.ndarray
    teacher_cols: np.ndarray
    teacher_probs: np.ndarray
    teacher_top: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    width: int
    depth: int

    @property
    def n(self) -> int:
        return int(self.starts.shape[0])

    @property
    def n_anchors(self) -> int:
        return int(self.lengths.sum())

    def batch(self, idx: np.ndarray) -> dict[str, torch.Tensor]:
        """Tensors of windows idx: features [B, W, d], tokens [B, W, depth], valid [B, W],
        target rows [B, W, depth] (clipped) and where they exist [B, W, depth]."""
        offs = np.arange(self.width)
        rows = self.starts[idx, None] + offs                              # [B, W]
        valid = offs[None, :] < self.lengths[idx, None]
        safe = np.where(valid, rows, self.starts[idx, None])
        target = safe[..., None] + np.arange(1, self.depth + 1)            # [B, W, depth]
        exists = valid[..., None] & (target < self.seq_end[safe][..., None])
        target = np.where(exists, target, 0)
        return {"features": torch.from_numpy(self.hidden[safe].astype(np.float32)),
                "tokens": torch.from_numpy(self.next_tokens[safe]), "valid": torch.from_numpy(valid),
                "target": torch.from_numpy(target), "exists": torch.from_numpy(exists)}


def build_windows(sequences: Sequence[HeadSequence], column_of: np.ndarray, depth: int,
                  width: int | None = None) -> Windows:
    """Windows of `width` rows over every sequence (None: one window a sequence, for
    evaluation of a head with attention; a head without attention drafts each row on its own,
    so any width evaluates it alike, and 1 pads nothing)."""
    hidden, next_tokens, seq_end, cols, probs, top, starts, lengths = [], [], [], [], [], [], [], []
    base = 0
    longest = max(s.n_rows for s in sequences)
    w = longest if width is None else width
    for seq in sequences:
        n_rows = seq.n_rows
        after = seq.tokens[seq.first_row + 1:]
        padded = np.concatenate([after, np.zeros(depth, dtype=after.dtype)])
        next_tokens.append(np.lib.stride_tricks.sliding_window_view(padded, depth)[:n_rows])
        seq_end.append(np.full(n_rows, base + n_rows, dtype=np.int64))
        c, p, t = teacher_rows(seq, column_of)
        hidden.append(seq.hidden)
        cols.append(c)
        probs.append(p)
        top.append(t)
        for s in range(0, n_rows, w):
            starts.append(base + s)
            lengths.append(min(w, n_rows - s))
        base += n_rows
    return Windows(hidden=np.concatenate(hidden), next_tokens=np.concatenate(next_tokens).astype(np.int64),
                   seq_end=np.concatenate(seq_end), teacher_cols=np.concatenate(cols),
                   teacher_probs=np.concatenate(probs), teacher_top=np.concatenate(top),
                   starts=np.asarray(starts, dtype=np.int64), lengths=np.asarray(lengths, dtype=np.int64),
                   width=w, depth=depth)


def window_loss(head: EagleHead, win: Windows, idx: np.ndarray, feature_weight: float = 0.1
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss of windows idx (see eagle.py); also the logits' argmax and where targets exist,
    both [B, W, depth]."""
    b = win.batch(idx)
    logits, feats = head(b["features"], b["tokens"], win.depth, b["valid"])
    target = b["target"].numpy()
    cols = torch.from_numpy(win.teacher_cols[target])                 # [B, W, depth, k]
    probs = torch.from_numpy(win.teacher_probs[target])
    logp = F.log_softmax(logits.float(), dim=-1)
    ce = -(probs * torch.gather(logp, 3, cols.clamp(min=0)) * (cols >= 0)).sum(-1)
    loss = ce
    if feature_weight:
        real = torch.from_numpy(win.hidden[target].astype(np.float32))
        loss = loss + feature_weight * F.smooth_l1_loss(feats.float(), real, reduction="none").mean(-1)
    exists = b["exists"]
    loss = (loss * exists).sum() / exists.sum().clamp(min=1)
    return loss, logits.argmax(-1), exists


@torch.no_grad()
def evaluate_windows(head: EagleHead, win: Windows, batch_size: int | None = None) -> dict[str, object]:
    """Held-out loss, acc@k and chain@k over every anchor of `win`. batch_size: windows per
    forward pass (None: about 1,024 rows)."""
    if batch_size is None:
        batch_size = max(1, 1024 // win.width)
    head.eval()
    tally = DepthTally(win.depth)
    for start in range(0, win.n, batch_size):
        idx = np.arange(start, min(start + batch_size, win.n))
        loss, argmax, exists = window_loss(head, win, idx, feature_weight=0.0)
        target = win.batch(idx)["target"].numpy()
        tally.add(argmax.numpy() == win.teacher_top[target], exists.numpy(), float(loss))
    head.train()
    return tally.result()

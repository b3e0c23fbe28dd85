"""Training a draft head offline on data made by the target (pyspec/head/data.py).

Every kept row j of a sequence is one example: the head gets the hidden state of row j and the
tokens g0 .. g_{L-1} that followed it (teacher forcing on the target's own answer) and predicts,
at depth k, the target's distribution of the token after g_k (row j + 1 + k's top-k, restricted
to the kept vocabulary and renormalised). The loss is the soft cross-entropy summed over depths,
which is the forward KL to the target up to a constant. Depths past the end of a sequence are
masked out.

Held-out evaluation: the sequences of a fraction of the prompts (chosen by a hash of the prompt
id, so the split is stable) are never trained on; at every evaluation the head's top-1 is
compared with the target's argmax at each depth, both per depth given the earlier tokens
("acc@k") and for whole prefixes ("chain@k": depths 1..k all right, what a greedy chain drafted
by the head would get accepted).

Training is resumable: a checkpoint (weights, optimizer, step; the data order is a function of
the seed and the epoch) is written every
`checkpoint_every` steps and at the end into the work directory, and a later run with the same
work directory continues from it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from .data import HeadSequence
from .model import RecurrentHead

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    depth: int = 5              # draft steps trained per example (L)
    epochs: float = 3.0
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    eval_fraction: float = 0.08  # prompts held out from training
    eval_every: int = 100       # steps between held-out evaluations
    checkpoint_every: int = 50
    seed: int = 0
    threads: int = 0            # torch threads (0: leave torch's default)
    # Training steps with bfloat16 matrix products (torch.autocast; weights, optimizer state and
    # the loss's log-softmax stay float32; held-out evaluation is float32 throughout). On this
    # project's AMX CPU it made 1.4x the steps per second (README, "Draft heads"); on CPUs without
    # bfloat16 units it can be slower.
    bf16: bool = False


def kept_vocabulary(sequences: Sequence[HeadSequence], size: int, n_vocab: int) -> np.ndarray:
    """The `size` target tokens the head predicts: the most frequent answer tokens plus the
    target's probability mass (a token the target often gives high probability to is kept even
    when it was not the one emitted), ties by id. Sorted by decreasing weight."""
    weight = np.zeros(n_vocab, dtype=np.float64)
    for seq in sequences:
        np.add.at(weight, seq.tokens[seq.first_row + 1:], 1.0)
        np.add.at(weight, seq.top_ids.ravel(), seq.top_probs.astype(np.float64).ravel())
    size = min(size, n_vocab)
    order = np.lexsort((np.arange(n_vocab), -weight))
    return order[:size].astype(np.int64)


def coverage(sequences: Sequence[HeadSequence], vocab: np.ndarray) -> float:
    """Share of answer tokens that are kept tokens."""
    kept = np.zeros(int(max(int(vocab.max()) + 1, max(int(s.tokens.max()) for s in sequences) + 1)), dtype=bool)
    kept[vocab] = True
    total = sum(len(s.tokens) - s.first_row - 1 for s in sequences)
    hits = sum(int(kept[s.tokens[s.first_row + 1:]].sum()) for s in sequences)
    return hits / max(total, 1)


def is_held_out(prompt_id: str, fraction: float) -> bool:
    digest = hashlib.sha256(prompt_id.encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < fraction


@dataclass
class Examples:
    """All examples of a set of sequences as flat arrays.

    hidden [R, d] f16 (every stored row); tokens [E, L] target ids g0..; rows [E] the example's
    hidden row; target_rows [E, L] the row holding depth k's target (-1: past the end);
    teacher_cols / teacher_probs [R, top_k] each row's distribution over kept columns (-1: not
    kept), renormalised; teacher_top [R] the target's argmax column (-1: not kept).
    """

    hidden: np.ndarray
    tokens: np.ndarray
    rows: np.ndarray
    target_rows: np.ndarray
    teacher_cols: np.ndarray
    teacher_probs: np.ndarray
    teacher_top: np.ndarray

    @property
    def n(self) -> int:
        return int(self.rows.shape[0])


def teacher_rows(seq: HeadSequence, column_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The target's distribution at every stored row of `seq` over the kept columns: columns
    [n_rows, top_k] (-1: not kept), probabilities renormalised over the kept ones, and the
    argmax's column [n_rows] (-1: not kept)."""
    c = column_of[seq.top_ids]
    p = np.where(c >= 0, seq.top_probs.astype(np.float32), 0.0)
    p = p / np.maximum(p.sum(axis=1, keepdims=True), 1e-12)
    return c.astype(np.int64), p.astype(np.float32), c[:, 0].astype(np.int64)


def build_examples(sequences: Sequence[HeadSequence], column_of: np.ndarray, depth: int) -> Examples:
    hidden, tokens, rows, target_rows, cols, probs, top = [], [], [], [], [], [], []
    base = 0
    for seq in sequences:
        n_rows = seq.n_rows
        for r in range(n_rows - 1):
            j = seq.first_row + r
            toks = seq.tokens[j + 1: j + 1 + depth]
            pad = depth - len(toks)
            tokens.append(np.concatenate([toks, np.zeros(pad, dtype=np.int32)]))
            rows.append(base + r)
            tr = np.arange(r + 1, r + 1 + depth)
            target_rows.append(np.where(tr < n_rows, base + tr, -1))
        c, p, t = teacher_rows(seq, column_of)
        hidden.append(seq.hidden)
        cols.append(c)
        probs.append(p)
        top.append(t)
        base += n_rows
    return Examples(hidden=np.concatenate(hidden), tokens=np.stack(tokens).astype(np.int64), rows=np.asarray(rows),
                    target_rows=np.stack(target_rows).astype(np.int64), teacher_cols=np.concatenate(cols),
                    teacher_probs=np.concatenate(probs), teacher_top=np.concatenate(top))


def batch_loss(head: RecurrentHead, ex: Examples, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss of examples `idx`; also returns the logits' argmax [B, L] and the valid mask [B, L]."""
    x = torch.from_numpy(ex.hidden[ex.rows[idx]].astype(np.float32))
    tokens = torch.from_numpy(ex.tokens[idx])
    logits = head(x, tokens)                                     # [B, L, V']
    tr = ex.target_rows[idx]                                     # [B, L]
    valid = torch.from_numpy(tr >= 0)
    safe = np.where(tr >= 0, tr, 0)
    cols = torch.from_numpy(ex.teacher_cols[safe])               # [B, L, k]
    probs = torch.from_numpy(ex.teacher_probs[safe])             # [B, L, k]
    logp = F.log_softmax(logits.float(), dim=-1)  # float32 even under bf16 autocast
    picked = torch.gather(logp, 2, cols.clamp(min=0))            # [B, L, k]
    ce = -(probs * picked * (cols >= 0)).sum(-1)                 # [B, L]
    loss = (ce * valid).sum() / valid.sum().clamp(min=1)
    return loss, logits.argmax(-1), valid


class DepthTally:
    """acc@k, chain@k and the mean loss, summed over evaluation batches."""

    def __init__(self, depth: int) -> None:
        self.right = np.zeros(depth)
        self.chain = np.zeros(depth)
        self.counted = np.zeros(depth)
        self.loss_sum, self.n_valid = 0.0, 0

    def add(self, hit: np.ndarray, valid: np.ndarray, loss: float = 0.0) -> None:
        """hit, valid: [..., depth] booleans (hit: right at that depth; valid: the depth exists);
        loss: the batch's mean loss over its valid entries."""
        depth = self.right.shape[0]
        hit = (hit & valid).reshape(-1, depth)
        valid = valid.reshape(-1, depth)
        self.right += hit.sum(0)
        self.chain += np.cumprod(hit, axis=1).sum(0)
        self.counted += valid.sum(0)
        self.loss_sum += float(loss) * int(valid.sum())
        self.n_valid += int(valid.sum())

    def result(self) -> dict[str, object]:
        counted = np.maximum(self.counted, 1)
        return {"loss": self.loss_sum / max(self.n_valid, 1), "acc": (self.right / counted).round(4).tolist(),
                "chain": (self.chain / counted).round(4).tolist()}


@torch.no_grad()
def evaluate(head: RecurrentHead, ex: Examples, batch_size: int = 256) -> dict[str, object]:
    """Held-out loss, acc@k and chain@k (see the module docstring)."""
    head.eval()
    tally = DepthTally(ex.tokens.shape[1])
    for start in range(0, ex.n, batch_size):
        idx = np.arange(start, min(start + batch_size, ex.n))
        loss, argmax, valid = batch_loss(head, ex, idx)
        tr = ex.target_rows[idx]
        tally.add(argmax.numpy() == ex.teacher_top[np.where(tr >= 0, tr, 0)], valid.numpy(), float(loss))
    head.train()
    return tally.result()


def _training_settings(config: dict[str, object]) -> dict[str, object]:
    """The settings a resumed run must share with the checkpoint: all but the thread count,
    which changes how fast the run goes, not what it computes (a run resumed on a busier or
    quieter machine may use other threads)."""
    return {k: v for k, v in config.items() if k != "threads"}


@dataclass
class TrainState:
    step: int = 0
    total: int = 0          # steps of the whole run
    history: list[dict[str, object]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.step >= self.total


def train_head(
    head: torch.nn.Module,
    train: Examples,
    held_out: Examples | None,
    config: TrainConfig,
    work_dir: str | os.PathLike[str],
    *,
    on_step: Callable[[int, int, float], None] | None = None,
    on_eval: Callable[[int, dict[str, object]], None] | None = None,
    max_seconds: float | None = None,
    held_out_answers: Examples | None = None,
    loss_fn: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = batch_loss,
    eval_fn: Callable[..., dict[str, object]] = evaluate,
    settings: dict[str, object] | None = None,
) -> TrainState:
    """Trains `head` in place; resumes from work_dir/checkpoint.pt when present.

    Returns the state with the evaluation history (one entry per evaluation: step, seconds,
    train loss, held-out metrics). on_step(step, total, loss) after every step. max_seconds:
    stop (with a checkpoint) once this much time has passed; `finished` then says whether the
    run is complete, and a later call continues it. held_out_answers: the held-out examples from
    the target's own answers (a subset of held_out when it also holds reference texts), evaluated
    apart as the entry's "answers": they are what a head drafts on in generation, and a head can
    do much better on reference texts than there.
    loss_fn(head, train, idx) / eval_fn(head, examples): another head's loss and evaluation
    (default: the recurrent head's, on Examples); `settings`: that head's own training settings,
    stored with the checkpoint and, like `config`, required to match on resume.
    """
    started = time.monotonic()
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    ckpt_path = work / "checkpoint.pt"
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = max(1, math.ceil(train.n / config.batch_size))
    total = max(1, int(round(config.epochs * steps_per_epoch)))
    state = TrainState(total=total)
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        if (_training_settings(ckpt["config"]) != _training_settings(asdict(config))
                or ckpt.get("settings") != settings):
            raise ValueError(f"{ckpt_path} was made with other settings {ckpt['config']}; use another work dir")
        head.load_state_dict(ckpt["head"])
        opt.load_state_dict(ckpt["optimizer"])
        state = TrainState(step=ckpt["step"], total=total, history=ckpt["history"])
        log.info("resuming from step %d of %d", state.step, total)

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return config.lr * (step + 1) / config.warmup_steps
        t = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
        return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(t, 1.0)))

    def save() -> None:
        tmp = ckpt_path.with_name("checkpoint.pt.tmp")
        torch.save({"config": asdict(config), "settings": settings, "head": head.state_dict(),
                    "optimizer": opt.state_dict(),
                    "step": state.step, "history": state.history}, tmp)
        os.replace(tmp, ckpt_path)

    def run_eval(train_loss: float) -> None:
        entry: dict[str, object] = {"step": state.step, "time": time.time(),
                                    "train_loss": None if math.isnan(train_loss) else train_loss}
        if held_out is not None and held_out.n:
            entry.update(eval_fn(head, held_out))
        if held_out_answers is not None and held_out_answers.n:
            entry["answers"] = eval_fn(head, held_out_answers)
        state.history.append(entry)
        if on_eval:
            on_eval(state.step, entry)

    def epoch_order(epoch: int) -> np.ndarray:
        # A fixed permutation per epoch, so a resumed run sees the batches the interrupted one would.
        return np.random.default_rng([config.seed, epoch]).permutation(train.n)

    head.train()
    running = float("nan")
    if state.step == 0:
        run_eval(running)
    epoch = state.step // steps_per_epoch
    order = epoch_order(epoch)
    while state.step < total:
        if state.step // steps_per_epoch != epoch:
            epoch = state.step // steps_per_epoch
            order = epoch_order(epoch)
        pos = (state.step % steps_per_epoch) * config.batch_size
        idx = order[pos: pos + config.batch_size]
        for group in opt.param_groups:
            group["lr"] = lr_at(state.step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
            loss, _, _ = loss_fn(head, train, idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        state.step += 1
        value = loss.item()
        running = value if math.isnan(running) else 0.9 * running + 0.1 * value
        if on_step:
            on_step(state.step, total, value)
        if state.step % config.eval_every == 0 or state.step == total:
            run_eval(running)
        out_of_time = max_seconds is not None and time.monotonic() - started > max_seconds
        if state.step % config.checkpoint_every == 0 or state.step == total or out_of_time:
            save()
        if out_of_time:
            break
    return state


def write_report(path: str | os.PathLike[str], report: dict[str, object]) -> None:
    Path(path).write_text(json.dumps(report, indent=1))

"""The recurrent draft head (ReDrafter) as a PyTorch module.

The head drafts from the target's last-layer hidden state x (final norm applied: the row that
chose the last committed token g0) and the tokens drafted so far. Per draft step i = 1, 2, ...:

    s_i = silu(W e(g_{i-1}) + U s_{i-1} + b),  s_0 = 0        (one-layer RNN over token embeddings)
    h_i = [x, s_i]                                              (2 * n_embd)
    h_i <- h_i + silu(R_k h_i + c_k)   for each ResNet layer k
    logits_i = O (P h_i + p)    (shared output: O = the target's output rows, frozen)
       or      O' h_i           (own output matrix)

so the state starts from the embedding of the last committed token (s_1 = silu(W e(g0) + b)), as
in the paper's reference code. e() is the target's token embedding (frozen, shared). The head
predicts over a kept vocabulary (`vocab`: target token ids, the most frequent in the training
data): logits column c is token vocab[c]. A committed token outside it is embedded with one extra
row (`embedding[n_kept]`, the mean of the rows left out), so any token can start a draft; draft
tokens are always kept tokens.

Shapes: n_embd = d, n_kept = V'. Weights use PyTorch's Linear layout [out, in], which is also the
numpy layout the head GGUF stores (pyspec/head/gguf_io.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class HeadConfig:
    n_embd: int              # the target's hidden width d (= its embedding width)
    n_target_vocab: int      # the target's full vocabulary size
    n_res_layers: int = 1    # ResNet layers on [x, s] (width 2d)
    share_output: bool = True  # logits through the target's output rows (frozen) after a 2d -> d map


def register_vocabulary(head: nn.Module, n_target_vocab: int, vocab: torch.Tensor, embedding: torch.Tensor,
                        output: torch.Tensor | None = None) -> None:
    """The buffers every head shares: `vocab` [V'] (kept target ids), `row_of` [n_target_vocab]
    (target id -> embedding row; V' for any token outside the kept vocabulary), `embedding`
    [V' + 1, d] and, when given, `output` [V', d]."""
    n_kept, d = int(vocab.numel()), embedding.shape[-1]
    if embedding.shape != (n_kept + 1, d):
        raise ValueError(f"embedding must be [{n_kept + 1}, {d}] (kept tokens + 1), got {tuple(embedding.shape)}")
    if output is not None and output.shape != (n_kept, d):
        raise ValueError(f"output must be [{n_kept}, {d}], got {tuple(output.shape)}")
    head.register_buffer("vocab", vocab.to(torch.int64).clone())
    row_of = torch.full((n_target_vocab,), n_kept, dtype=torch.int64)
    row_of[head.vocab] = torch.arange(n_kept)
    head.register_buffer("row_of", row_of)
    head.register_buffer("embedding", embedding.to(torch.float32).clone())
    if output is not None:
        head.register_buffer("output", output.to(torch.float32).clone())


def autocast_frozen(rows: torch.Tensor) -> torch.Tensor:
    """Frozen output rows cast once to the CPU autocast dtype when autocast is on (autocast would
    cast them again for every product: a [V', d] copy each draft step), else as they are."""
    if torch.is_autocast_enabled("cpu") and not rows.requires_grad:
        return rows.to(torch.get_autocast_dtype("cpu"))
    return rows


class RecurrentHead(nn.Module):
    """ReDrafter's draft head; see the module docstring.

    vocab: [V'] int64 target ids of the kept tokens. embedding: [V' + 1, d] their target
    embeddings plus the row for every other token. output: [V', d] the target's output rows of
    the kept tokens when config.share_output (None: the embedding rows, for targets whose output
    matrix is their embedding); ignored otherwise.
    """

    def __init__(self, config: HeadConfig, vocab: torch.Tensor, embedding: torch.Tensor,
                 output: torch.Tensor | None = None) -> None:
        super().__init__()
        d, n_kept = config.n_embd, int(vocab.numel())
        self.config = config
        register_vocabulary(self, config.n_target_vocab, vocab, embedding)
        self.rnn_w = nn.Linear(d, d, bias=False)
        self.rnn_u = nn.Linear(d, d, bias=True)
        self.res = nn.ModuleList(nn.Linear(2 * d, 2 * d) for _ in range(config.n_res_layers))
        self.output_tied = config.share_output and output is None
        if config.share_output:
            self.out_proj = nn.Linear(2 * d, d)
            if output is not None:
                if output.shape != (n_kept, d):
                    raise ValueError(f"output must be [{n_kept}, {d}], got {tuple(output.shape)}")
                self.register_buffer("output", output.to(torch.float32).clone())
        else:
            self.output_weight = nn.Parameter(torch.empty(n_kept, 2 * d))
        self.reset_parameters()

    @property
    def n_kept(self) -> int:
        return int(self.vocab.numel())

    def reset_parameters(self) -> None:
        """A starting point that drafts like the target: the state path starts near zero, the
        ResNet layers near identity, and the shared output map passes x through (its logits are
        then the target's own for the position, a sensible prior for the next ones)."""
        d = self.config.n_embd
        for lin in (self.rnn_w, self.rnn_u):
            nn.init.normal_(lin.weight, std=0.5 / d**0.5)
        nn.init.zeros_(self.rnn_u.bias)
        for lin in self.res:
            nn.init.normal_(lin.weight, std=0.1 / (2 * d) ** 0.5)
            nn.init.zeros_(lin.bias)
        if self.config.share_output:
            with torch.no_grad():
                self.out_proj.weight.zero_()
                self.out_proj.weight[:, :d] = torch.eye(d)
                self.out_proj.weight[:, d:].normal_(std=0.1 / d**0.5)
                self.out_proj.bias.zero_()
        else:
            nn.init.normal_(self.output_weight, std=1.0 / (2 * d) ** 0.5)

    def output_rows(self) -> torch.Tensor:
        """[V', k] the output matrix (k = d shared, 2d own)."""
        if not self.config.share_output:
            return self.output_weight
        return self.embedding[: self.n_kept] if self.output_tied else self.output

    def step(self, x: torch.Tensor, state: torch.Tensor, rows: torch.Tensor,
             out_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step. x, state: [B, d]; rows: [B] embedding rows of the previous tokens;
        out_rows: output_rows() as the caller cast it (None: as they are).
        Returns (logits [B, V'], new state [B, d])."""
        state = F.silu(self.rnn_w(self.embedding[rows]) + self.rnn_u(state))
        h = torch.cat([x, state], dim=-1)
        for lin in self.res:
            h = h + F.silu(lin(h))
        if self.config.share_output:
            h = self.out_proj(h)
        return h @ (self.output_rows() if out_rows is None else out_rows).T, state

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced drafting. x: [B, d] hidden state of the row that chose tokens[:, 0];
        tokens: [B, L] target ids g0 .. g_{L-1}. Returns logits [B, L, V']: step i predicts the
        token after tokens[:, i]."""
        state = torch.zeros_like(x)
        rows = self.row_of[tokens]
        out_rows = autocast_frozen(self.output_rows())
        out = []
        for i in range(tokens.shape[1]):
            logits, state = self.step(x, state, rows[:, i], out_rows)
            out.append(logits)
        return torch.stack(out, dim=1)

"""The EAGLE-class draft head: feature-level drafting through one decoder layer.

The head predicts the target's next hidden state (its "feature") and reads the next token's
distribution off it through the target's own output rows (frozen). Per anchor row t of a sequence
(hidden state f_t: the target's last-layer state after token t, final norm applied, the row that
chose token x_{t+1}) and draft step k = 1, 2, ...:

    z_k      = W_in [g_{k-1}, e(x_{t+k})]          g_0 = f_t, e() the target's embedding (frozen)
    a_k      = z_k + Attn(norm(z_k))                one pre-norm decoder layer: causal attention,
    h_k      = a_k + SwiGLU(norm(a_k))              then a gated MLP
    g_k      = norm_out(h_k)                        the predicted feature f_{t+k}
    logits_k = O g_k                                O: the target's output rows of the kept tokens

so step k drafts token x_{t+k+1}. Attention at step 1 runs over the step-1 entries of the anchors
up to t (made from the target's real features: in generation, the committed context); at step
k > 1 the query also sees the entries of steps 2..k of its own anchor (the draft so far), as in
generation. Training runs every step at once over all anchors with exactly that mask, feeding
each step the head's own predicted feature g_{k-1} (training on its own predictions, so later
steps see at training what they see when drafting).

With `attention=False` the layer is its MLP alone (a_k = z_k): each anchor drafts from its own
feature and tokens, and a step carries only the previous feature, as the recurrent head carries
its state.

Loss: the soft cross-entropy to the target's top-k distribution at row t + k (over the kept
vocabulary, renormalised), plus `feature_weight` x a smooth-L1 distance between g_k and the
target's real f_{t+k}.

The kept vocabulary, the "other token" embedding row and the output rows are those of
RecurrentHead (pyspec/head/model.py): logits column c is token vocab[c].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .model import autocast_frozen, register_vocabulary


@dataclass(frozen=True)
class EagleConfig:
    n_embd: int              # the target's hidden width d
    n_target_vocab: int      # the target's full vocabulary size
    n_head: int = 12         # attention heads (head width d / n_head)
    n_ff: int = 4096         # MLP width
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    # False: no attention block (the layer is its MLP alone), so a draft step needs only the
    # previous feature and token, like the recurrent head, and no cache of the context.
    attention: bool = True


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary position embedding of x [..., T, hd] at positions pos [T] (or broadcastable)."""
    hd = x.shape[-1]
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd)
    ang = pos.to(torch.float32)[..., None] * inv                    # [T, hd/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.flatten(-2)


class EagleHead(nn.Module):
    """See the module docstring. vocab / embedding / output as RecurrentHead's."""

    def __init__(self, config: EagleConfig, vocab: torch.Tensor, embedding: torch.Tensor,
                 output: torch.Tensor | None = None) -> None:
        super().__init__()
        d = config.n_embd
        if config.attention and d % config.n_head:
            raise ValueError(f"n_head {config.n_head} must divide the width {d}")
        self.config = config
        register_vocabulary(self, config.n_target_vocab, vocab, embedding, output)
        self.output_tied = output is None
        self.w_in = nn.Linear(2 * d, d, bias=False)
        if config.attention:
            self.attn_norm = RMSNorm(d, config.norm_eps)
            self.wq = nn.Linear(d, d, bias=False)
            self.wk = nn.Linear(d, d, bias=False)
            self.wv = nn.Linear(d, d, bias=False)
            self.wo = nn.Linear(d, d, bias=False)
        self.ff_norm = RMSNorm(d, config.norm_eps)
        self.w_gate = nn.Linear(d, config.n_ff, bias=False)
        self.w_up = nn.Linear(d, config.n_ff, bias=False)
        self.w_down = nn.Linear(config.n_ff, d, bias=False)
        self.out_norm = RMSNorm(d, config.norm_eps)
        self.reset_parameters()

    @property
    def n_kept(self) -> int:
        return int(self.vocab.numel())

    def reset_parameters(self) -> None:
        """Starts near "the next feature is this one": W_in passes the feature through, the
        attention and MLP outputs start small, so step 1 first drafts what the target's own row
        would (a sensible prior), and training moves it from there."""
        d = self.config.n_embd
        with torch.no_grad():
            self.w_in.weight.zero_()
            self.w_in.weight[:, :d] = torch.eye(d)
            self.w_in.weight[:, d:].normal_(std=0.1 / d**0.5)
        attn = (self.wq, self.wk, self.wv) if self.config.attention else ()
        for lin in attn + (self.w_gate, self.w_up):
            nn.init.normal_(lin.weight, std=1.0 / d**0.5)
        for lin in ((self.wo,) if self.config.attention else ()) + (self.w_down,):
            nn.init.normal_(lin.weight, std=0.1 / lin.weight.shape[1] ** 0.5)

    def output_rows(self) -> torch.Tensor:
        return self.embedding[: self.n_kept] if self.output_tied else self.output

    def _mlp(self, a: torch.Tensor) -> torch.Tensor:
        h = self.ff_norm(a)
        return a + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.config.n_head, -1).transpose(1, 2)    # [B, H, T, hd]

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, depth: int,
                valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced drafting of every anchor of a window at once.

        features [B, T, d]: the target's rows f_t of T consecutive anchors; tokens [B, T, depth]:
        tokens[:, t, k-1] = x_{t+k} (the token the draft's step k starts from); valid [B, T]
        (optional): anchors that exist (padding is never attended to). Returns logits
        [B, T, depth, V'] and predicted features [B, T, depth, d]; [:, t, k-1] is step k.
        """
        b, t, d = features.shape
        cfg = self.config
        hd = d // cfg.n_head
        pos = torch.arange(t, device=features.device)
        rows = self.row_of[tokens]                                       # [B, T, depth]
        mask = torch.ones(t, t, dtype=torch.bool, device=features.device).tril()
        if valid is not None:
            mask = mask[None, None] & valid[:, None, None, :]            # [B, 1, T, T]
        keys1 = vals1 = None
        diag_k: list[torch.Tensor] = []   # steps 2..k: [B, H, T, hd] each (own anchor only)
        diag_v: list[torch.Tensor] = []
        g = features
        logits, feats = [], []
        scale = 1.0 / math.sqrt(hd)
        out_rows = autocast_frozen(self.output_rows())
        for k in range(depth):
            z = self.w_in(torch.cat([g, self.embedding[rows[:, :, k]]], dim=-1))
            if not cfg.attention:
                g = self.out_norm(self._mlp(z))
                feats.append(g)
                logits.append(g @ out_rows.T)
                continue
            h = self.attn_norm(z)
            q = rope(self._heads(self.wq(h)), pos + k, cfg.rope_base)
            key = rope(self._heads(self.wk(h)), pos + k, cfg.rope_base)
            val = self._heads(self.wv(h))
            if k == 0:
                keys1, vals1 = key, val
            else:
                diag_k.append(key)
                diag_v.append(val)
            scores = (q @ keys1.transpose(-1, -2)) * scale                      # [B, H, T, T]
            scores = scores.masked_fill(~mask, float("-inf"))
            if diag_k:
                own = torch.stack([(q * kk).sum(-1) for kk in diag_k], dim=-1) * scale  # [B, H, T, k]
                probs = torch.softmax(torch.cat([scores, own], dim=-1), dim=-1)
                out = probs[..., :t] @ vals1
                for m, vv in enumerate(diag_v):
                    out = out + probs[..., t + m, None] * vv
            else:
                out = torch.softmax(scores, dim=-1) @ vals1
            a = z + self.wo(out.transpose(1, 2).reshape(b, t, d))
            g = self.out_norm(self._mlp(a))
            feats.append(g)
            logits.append(g @ out_rows.T)
        return torch.stack(logits, dim=2), torch.stack(feats, dim=2)

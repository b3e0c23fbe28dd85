"""A `llama` / `qwen2` GGUF as a PyTorch module (float32), for training the draft model.

The module computes what llama.cpp computes for these architectures: token embedding, per block
RMSNorm -> attention with rope and grouped-query heads (+ q/k/v biases for qwen2) -> residual,
RMSNorm -> SwiGLU feed-forward -> residual, final RMSNorm, output head (the embedding matrix when
the file has no output.weight). Weights keep llama.cpp's layout (see gguf_read), and parameter
names mirror the GGUF tensor names (`blocks.3.attn_q.weight` is `blk.3.attn_q.weight`), so a
trained module exports back without any conversion.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from ..models import resolve_model
from .gguf_read import ModelConfig, read_gguf


def rope_tables(positions: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * base^(-2i / rope_dims), each [n_tokens, rope_dims / 2] float32."""
    half = config.rope_dims // 2
    inv_freq = config.rope_base ** (-torch.arange(half, dtype=torch.float64) * 2.0 / config.rope_dims)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).to(torch.float32), torch.sin(angles).to(torch.float32)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """Rotates the first 2 * cos.shape[-1] dims of each head. x: [batch, n_tokens, n_heads, head_dim].

    neox=False (llama.cpp's "normal" rope, used for `llama`): pairs (2i, 2i + 1).
    neox=True (qwen2): pairs (i, i + rope_dims / 2).
    """
    rope_dims = 2 * cos.shape[-1]
    rotated, passed = x[..., :rope_dims], x[..., rope_dims:]
    cos, sin = cos[:, None, :], sin[:, None, :]  # [n_tokens, 1, rope_dims / 2], broadcast over heads
    if neox:
        first, second = rotated[..., : rope_dims // 2], rotated[..., rope_dims // 2:]
        rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    else:
        even, odd = rotated[..., 0::2], rotated[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    return torch.cat((rotated, passed), dim=-1)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Block(nn.Module):
    """One transformer block; attribute names are the GGUF tensor names without `blk.N.`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.attn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.attn_q = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=c.qkv_bias)
        self.attn_k = nn.Linear(c.n_embd, c.n_embd_kv, bias=c.qkv_bias)
        self.attn_v = nn.Linear(c.n_embd, c.n_embd_kv, bias=c.qkv_bias)
        self.attn_output = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        self.ffn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.ffn_gate = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.ffn_up = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.ffn_down = nn.Linear(c.n_ff, c.n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.config
        batch, n_tokens, _ = x.shape
        h = self.attn_norm(x)
        q = self.attn_q(h).view(batch, n_tokens, c.n_head, c.head_dim)
        k = self.attn_k(h).view(batch, n_tokens, c.n_head_kv, c.head_dim)
        v = self.attn_v(h).view(batch, n_tokens, c.n_head_kv, c.head_dim)
        q = apply_rope(q, cos, sin, c.rope_neox)
        k = apply_rope(k, cos, sin, c.rope_neox)
        # [batch, heads, n_tokens, head_dim]; query head j reads kv head j // (n_head / n_head_kv)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            is_causal=True, scale=1.0 / math.sqrt(c.head_dim), enable_gqa=c.n_head != c.n_head_kv,
        )
        x = x + self.attn_output(attn.transpose(1, 2).reshape(batch, n_tokens, c.n_head * c.head_dim))
        h = self.ffn_norm(x)
        return x + self.ffn_down(F.silu(self.ffn_gate(h)) * self.ffn_up(h))


class DraftModel(nn.Module):
    """A `llama` or `qwen2` model in float32, built from (and exportable to) a GGUF file.

    forward(tokens [batch, n_tokens] or [n_tokens] int64) -> logits [..., n_tokens, n_vocab]:
    causal, every sequence starting at position 0. `source_path` is the GGUF the weights came
    from (None for a module built from a config); export_gguf takes its metadata from there.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.source_path: str | None = None
        self.token_embd = nn.Embedding(config.n_vocab, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.output_norm = RMSNorm(config.n_embd, config.rms_eps)
        self.output = None if config.tied_output else nn.Linear(config.n_embd, config.n_vocab, bias=False)

    @property
    def output_weight(self) -> torch.Tensor:
        """[n_vocab, n_embd]: output.weight, or token_embd.weight when the two are tied."""
        return self.token_embd.weight if self.output is None else self.output.weight

    def vocab_parameters(self) -> list[nn.Parameter]:
        """The matrices indexed by vocabulary: token_embd.weight, and output.weight unless tied."""
        return [self.token_embd.weight] + ([self.output.weight] if self.output is not None else [])

    def early_block_parameters(self, n_trained: int) -> list[nn.Parameter]:
        """The parameters of every block before the last `n_trained` (none when n_trained is 0,
        meaning all blocks, or at least the number of blocks)."""
        if n_trained <= 0 or n_trained >= len(self.blocks):
            return []
        return [p for block in self.blocks[: len(self.blocks) - n_trained] for p in block.parameters()]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.linear(self.hidden_states(tokens), self.output_weight)  # [..., n_tokens, n_vocab]

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final normed hidden states [..., n_tokens, n_embd]; the logits are
        F.linear(hidden, output_weight). Trainers project only the rows they need, since the
        logits of a whole sequence ([n_tokens, n_vocab]) are large for real vocabularies."""
        return self.hidden_states_from(self.block_input(tokens, 0), 0)

    def block_input(self, tokens: torch.Tensor, first_block: int) -> torch.Tensor:
        """The input of block `first_block` ([..., n_tokens, n_embd]): the token embedding run
        through the blocks before it. With those frozen, a trainer can compute it once per
        sequence and reuse it (GGUFDraft)."""
        squeeze = tokens.dim() == 1
        if squeeze:
            tokens = tokens[None, :]
        x = self.token_embd(tokens)  # [batch, n_tokens, n_embd]
        if first_block > 0:
            cos, sin = rope_tables(torch.arange(tokens.shape[1], device=tokens.device), self.config)
            for block in self.blocks[:first_block]:
                x = block(x, cos, sin)
        return x[0] if squeeze else x

    def hidden_states_from(self, x: torch.Tensor, first_block: int) -> torch.Tensor:
        """hidden_states given block_input(tokens, first_block)."""
        squeeze = x.dim() == 2
        if squeeze:
            x = x[None]
        cos, sin = rope_tables(torch.arange(x.shape[1], device=x.device), self.config)
        for block in self.blocks[first_block:]:
            x = block(x, cos, sin)
        x = self.output_norm(x)
        return x[0] if squeeze else x

    def logits_at(self, tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Logits [n_rows, n_vocab] of the rows `rows` ([n_rows] int64) of a forward pass over
        `tokens` ([n_tokens] int64); the other rows are never projected to the vocabulary."""
        return self.logits_from(self.block_input(tokens, 0), 0, rows)

    def logits_from(self, x: torch.Tensor, first_block: int, rows: torch.Tensor) -> torch.Tensor:
        """logits_at given block_input(tokens, first_block) [n_tokens, n_embd]."""
        return F.linear(self.hidden_states_from(x, first_block)[rows], self.output_weight)

    def gguf_tensors(self) -> dict[str, torch.Tensor]:
        """GGUF tensor name -> parameter, for every tensor the GGUF file holds."""
        named = {}
        for name, param in self.named_parameters():
            named[name.replace("blocks.", "blk.", 1) if name.startswith("blocks.") else name] = param
        return named

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "DraftModel":
        """Dequantizes every tensor of `path` (a GGUF path or registry name) to float32; raises
        UnsupportedModelError for other architectures or tensors this module does not have."""
        path = resolve_model(path)  # a registry name is fetched, as Engine does
        config, weights = read_gguf(path)
        with torch.device("meta"):  # no random initialisation of weights about to be replaced
            model = cls(config)
        state = {}
        for name, values in weights.items():
            module_name = name.replace("blk.", "blocks.", 1) if name.startswith("blk.") else name
            state[module_name] = torch.from_numpy(values)
        model.load_state_dict(state, strict=True, assign=True)
        model.source_path = path
        return model.eval()


def load_gguf(path: str | os.PathLike[str]) -> DraftModel:
    """The GGUF model at `path` (or a registry name) as a float32 DraftModel in eval mode."""
    return DraftModel.from_gguf(path)

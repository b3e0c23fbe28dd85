"""Random-weight GGUF models with a real model's shapes and tensor types, for cost curves.

What one decode of k tokens costs depends on the tensors' shapes and types, not on their values,
so a model with the real target's shapes (Qwen2.5-1.5B: 28 layers, width 1536, 151,936-token
vocabulary) and its tensor types (Q4_K / Q6_K) costs what the real one costs. Such a file can be
written anywhere from a few hundred bytes of description (`ModelShape`), where the real 1.1 GB
file cannot be carried.

`read_shape` reads the description off a real GGUF; `write_shape_model` writes random f16
weights of that shape (the tiny test vocabulary padded with unused tokens to the real size) and
has llama.cpp's quantizer give every tensor the real file's type.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

# Small enough for f16 activations to stay finite through the layers; the values are never read
# for meaning, only timed.
WEIGHT_STD = 0.02
LLAMA_FTYPE_MOSTLY_F16 = 1
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15


@dataclass(frozen=True)
class ModelShape:
    """What a cost curve depends on: architecture, sizes and each tensor's ggml type."""

    arch: str                 # "qwen2" or "llama" (qwen2 adds q/k/v biases)
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    tied_output: bool         # no output.weight: the embedding is the output head
    tensor_types: dict[str, int] = field(default_factory=dict)  # name -> ggml type; empty: Q4_K_M's mix

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ModelShape":
        return cls(**{**data, "tensor_types": {str(k): int(v) for k, v in data.get("tensor_types", {}).items()}})

    def describe(self) -> str:
        return (f"{self.arch}, {self.n_layer} layers, width {self.n_embd}, {self.n_head}/{self.n_head_kv} heads, "
                f"ffn {self.n_ff}, vocabulary {self.n_vocab}")


def _field_int(reader: gguf.GGUFReader, key: str) -> int:
    part = reader.fields[key].parts[-1]
    return int(part[0])


def read_shape(path: str | os.PathLike[str]) -> ModelShape:
    """The shape and per-tensor types of a real GGUF model (llama or qwen2 architecture)."""
    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"{path}: architecture {arch!r}; only llama and qwen2 shapes can be rewritten")
    names = {t.name for t in reader.tensors}
    tokens = reader.fields["tokenizer.ggml.tokens"]
    return ModelShape(
        arch=arch,
        n_vocab=len(tokens.data),
        n_embd=_field_int(reader, f"{arch}.embedding_length"),
        n_layer=_field_int(reader, f"{arch}.block_count"),
        n_head=_field_int(reader, f"{arch}.attention.head_count"),
        n_head_kv=_field_int(reader, f"{arch}.attention.head_count_kv"),
        n_ff=_field_int(reader, f"{arch}.feed_forward_length"),
        tied_output="output.weight" not in names,
        tensor_types={t.name: int(t.tensor_type) for t in reader.tensors},
    )


def _tensors(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape [out, in]) of every tensor in file order; 1-D ones are norms or biases."""
    head_dim = shape.n_embd // shape.n_head
    n_embd_kv = head_dim * shape.n_head_kv
    e, f = shape.n_embd, shape.n_ff
    out = [("token_embd.weight", (shape.n_vocab, e))]
    for layer in range(shape.n_layer):
        blk = f"blk.{layer}"
        out += [(f"{blk}.attn_norm.weight", (e,)),
                (f"{blk}.attn_q.weight", (e, e)), (f"{blk}.attn_k.weight", (n_embd_kv, e)),
                (f"{blk}.attn_v.weight", (n_embd_kv, e)), (f"{blk}.attn_output.weight", (e, e)),
                (f"{blk}.ffn_norm.weight", (e,)),
                (f"{blk}.ffn_gate.weight", (f, e)), (f"{blk}.ffn_up.weight", (f, e)),
                (f"{blk}.ffn_down.weight", (e, f))]
        if shape.arch == "qwen2":
            out += [(f"{blk}.attn_q.bias", (e,)), (f"{blk}.attn_k.bias", (n_embd_kv,)),
                    (f"{blk}.attn_v.bias", (n_embd_kv,))]
    out.append(("output_norm.weight", (e,)))
    if not shape.tied_output:
        out.append(("output.weight", (shape.n_vocab, e)))
    return out


def _vocabulary(n_vocab: int) -> tuple[list[str], list[int], list[str], int, int]:
    """The tiny test vocabulary padded with unused tokens: (tokens, types, merges, eos, im_end)."""
    from pyspec._models.tiny import EOS_TEXT, IM_END_TEXT, build_vocab

    tokens, types, merges = build_vocab()
    if n_vocab < len(tokens):
        raise ValueError(f"n_vocab={n_vocab} is below the {len(tokens)} tokens of the base vocabulary")
    pad = n_vocab - len(tokens)
    tokens = tokens + [f"<unused{i}>" for i in range(pad)]
    types = types + [int(gguf.TokenType.UNUSED)] * pad
    return tokens, types, merges, tokens.index(EOS_TEXT), tokens.index(IM_END_TEXT)


def write_f16(shape: ModelShape, path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Random f16 weights (f32 norms and biases) of `shape` at `path`."""
    from pyspec._models.tiny import CHATML_TEMPLATE, write_gguf

    path = Path(path)
    tokens, types, merges, eos, im_end = _vocabulary(shape.n_vocab)
    writer = gguf.GGUFWriter(None, shape.arch)
    writer.add_name(f"pyspec random {shape.arch} shape")
    writer.add_description(f"random weights (seed {seed}) of {shape.describe()}, for cost curves only")
    writer.add_file_type(LLAMA_FTYPE_MOSTLY_F16)
    writer.add_vocab_size(shape.n_vocab)
    writer.add_context_length(32768)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(eos)
    writer.add_eos_token_id(eos)
    writer.add_eot_token_id(im_end)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    rng = np.random.default_rng(seed)
    for name, dims in _tensors(shape):
        if len(dims) == 1:
            values = np.ones(dims, np.float32) if name.endswith("norm.weight") else np.zeros(dims, np.float32)
        else:
            values = (rng.standard_normal(dims, dtype=np.float32) * WEIGHT_STD).astype(np.float16)
        writer.add_tensor(name, values)
    return write_gguf(writer, path)


def write_shape_model(shape: ModelShape, path: str | os.PathLike[str], *, seed: int = 0,
                      n_threads: int = 0) -> Path:
    """A random model of `shape` at `path`, every tensor in the type `shape.tensor_types` gives it
    (llama.cpp's Q4_K_M mix where it names none). The f16 file written on the way is removed."""
    from pyspec import _core

    path = Path(path)
    f16 = path.with_name(path.stem + ".f16.gguf")
    write_f16(shape, f16, seed=seed)
    try:
        overrides = [(name, t) for name, t in shape.tensor_types.items()
                     if t not in (int(gguf.GGMLQuantizationType.F32),)]
        _core.quantize_model(str(f16), str(path), LLAMA_FTYPE_MOSTLY_Q4_K_M, overrides, n_threads)
    finally:
        f16.unlink(missing_ok=True)
    return path

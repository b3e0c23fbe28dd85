"""The head GGUF: a trained RecurrentHead in a file the engine loads (engine/src/draft_head.cpp).

Architecture `redrafter_head`, format version HEAD_FORMAT_VERSION. Keys (prefix
`redrafter_head.`): `format_version`, `embedding_length` (d), `block_count` (ResNet layers),
`kept_vocab_size` (V'), `share_output`, `output_tied` (the output rows are the embedding rows);
and the target it was trained for, checked by the engine at load: `target.name` (its
general.name), `target.architecture`, `target.block_count`, `target.vocab_size` and
`target.vocab_hash` (FNV-1a 64 over every token text followed by a zero byte, hex).

Tensors (numpy layout [rows, cols]; GGUF lists dimensions reversed):
- `head.vocab` [V'] I32: target ids of the kept tokens;
- `head.token_embd.weight` [V' + 1, d]: their target embeddings + the row for other tokens;
- `head.rnn_w.weight` [d, d], `head.rnn_u.weight` [d, d], `head.rnn_u.bias` [d];
- `head.res.{k}.weight` [2d, 2d], `head.res.{k}.bias` [2d];
- shared output: `head.out_proj.weight` [d, 2d], `head.out_proj.bias` [d], and unless tied
  `head.output.weight` [V', d] (the target's output rows); own output: `head.output.weight`
  [V', 2d].
Matrices are written as f32, f16 or q8_0, vectors as f32; the file is written beside its final
path, fsynced and renamed.

An EAGLE-class head without attention (pyspec/head/eagle.py) is architecture `eagle_head`, keys
under `eagle_head.`: those above but `block_count` and `share_output`, plus
`feed_forward_length` (n_ff) and `norm_epsilon`; tensors `head.vocab`, `head.token_embd.weight`,
`head.w_in.weight` [d, 2d], `head.ff_norm.weight` [d], `head.w_gate.weight` and
`head.w_up.weight` [n_ff, d], `head.w_down.weight` [d, n_ff], `head.out_norm.weight` [d], and
unless tied `head.output.weight` [V', d]. Only the engine reads it back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from ..errors import HeadFileError
from .eagle import EagleConfig, EagleHead
from .model import HeadConfig, RecurrentHead

ARCH = "redrafter_head"
EAGLE_ARCH = "eagle_head"
HEAD_FORMAT_VERSION = 1
Q = gguf.GGMLQuantizationType
MATRIX_TYPES = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0}


@dataclass(frozen=True)
class TargetInfo:
    """What identifies the target a head belongs to (compared by the engine at load)."""

    name: str
    architecture: str
    n_layer: int
    n_embd: int
    n_vocab: int
    vocab_hash: str


def vocab_hash(tokens: list[bytes]) -> str:
    """FNV-1a 64 over each token text followed by a zero byte; the engine computes the same."""
    h = 0xCBF29CE484222325
    prime, mask = 0x100000001B3, 0xFFFFFFFFFFFFFFFF
    for token in tokens:
        for byte in token + b"\0":
            h = ((h ^ byte) * prime) & mask
    return f"{h:016x}"


def _field(reader: gguf.GGUFReader, key: str, default: object = None) -> object:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise HeadFileError(f"{key} missing")
        return default
    return field.contents()


def _token_texts(reader: gguf.GGUFReader) -> list[bytes]:
    field = reader.fields["tokenizer.ggml.tokens"]
    return [bytes(field.parts[i]) for i in field.data]


def _dequantized_rows(tensor: gguf.ReaderTensor, rows: np.ndarray) -> np.ndarray:
    """float32 [len(rows), n_cols] of a 2-D GGUF tensor, dequantizing only those rows."""
    data = np.asarray(tensor.data)
    picked = data[rows]
    if tensor.tensor_type in (Q.F32, Q.F16, Q.BF16) and picked.dtype != np.uint8:
        return picked.astype(np.float32)
    return gguf.quants.dequantize(picked, tensor.tensor_type).astype(np.float32)


@dataclass
class TargetWeights:
    """The target's parts a head shares: embedding and output rows of the kept vocabulary."""

    info: TargetInfo
    embedding: np.ndarray        # [V' + 1, d]: kept rows + the mean of the others
    output: np.ndarray | None    # [V', d], None when the target's output matrix is its embedding


def read_target(target_path: str | os.PathLike[str], vocab: np.ndarray) -> TargetWeights:
    """The target's identity and its embedding / output rows for the kept token ids `vocab`."""
    reader = gguf.GGUFReader(os.fspath(target_path))
    arch = str(_field(reader, "general.architecture"))
    texts = _token_texts(reader)
    tensors = {t.name: t for t in reader.tensors}
    embd = tensors["token_embd.weight"]
    n_vocab, n_embd = int(embd.shape[1]), int(embd.shape[0])
    info = TargetInfo(name=str(_field(reader, "general.name", "")), architecture=arch,
                      n_layer=int(_field(reader, f"{arch}.block_count")), n_embd=n_embd, n_vocab=n_vocab,
                      vocab_hash=vocab_hash(texts))
    vocab = np.asarray(vocab, dtype=np.int64)
    kept = _dequantized_rows(embd, vocab)
    others = np.setdiff1d(np.arange(n_vocab), vocab)
    # The "other token" row: the mean embedding of the tokens left out (in chunks: they are many).
    total = np.zeros(n_embd, dtype=np.float64)
    for start in range(0, len(others), 8192):
        total += _dequantized_rows(embd, others[start:start + 8192]).sum(axis=0)
    other_row = (total / max(len(others), 1)).astype(np.float32)
    output = _dequantized_rows(tensors["output.weight"], vocab) if "output.weight" in tensors else None
    return TargetWeights(info=info, embedding=np.vstack([kept, other_row[None]]), output=output)


def new_head(target: TargetWeights, vocab: np.ndarray, *, n_res_layers: int = 1, share_output: bool = True
             ) -> RecurrentHead:
    config = HeadConfig(n_embd=target.info.n_embd, n_target_vocab=target.info.n_vocab, n_res_layers=n_res_layers,
                        share_output=share_output)
    output = None if target.output is None else torch.from_numpy(target.output)
    return RecurrentHead(config, torch.from_numpy(np.asarray(vocab, dtype=np.int64)),
                         torch.from_numpy(target.embedding), output)


def _matrix(values: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    a = values.detach().to(torch.float32).cpu().numpy()
    if qtype == Q.Q8_0 and a.shape[-1] % 32 != 0:
        qtype = Q.F16  # q8_0 rows are whole blocks of 32
    if qtype == Q.F32:
        return np.ascontiguousarray(a), qtype
    if qtype == Q.F16:
        return np.ascontiguousarray(a.astype(np.float16)), qtype
    return gguf.quants.quantize(np.ascontiguousarray(a), qtype), qtype


def export_head(head: RecurrentHead | EagleHead, info: TargetInfo, out: str | os.PathLike[str],
                dtype: str = "q8_0") -> Path:
    """Writes `head` (trained for the target `info`) as a head GGUF; returns the path. An
    EagleHead is written as architecture `eagle_head` and must be one without attention (the
    engine runs those)."""
    if dtype not in MATRIX_TYPES:
        raise ValueError(f"dtype must be one of {', '.join(MATRIX_TYPES)}, got {dtype!r}")
    cfg = head.config
    if (info.n_embd, info.n_vocab) != (cfg.n_embd, cfg.n_target_vocab):
        raise ValueError(f"head is for width {cfg.n_embd} / vocabulary {cfg.n_target_vocab}, target info says "
                         f"{info.n_embd} / {info.n_vocab}")
    eagle = isinstance(head, EagleHead)
    if eagle and head.config.attention:
        raise ValueError("the engine runs EAGLE-class heads without attention only (EagleConfig.attention=False)")
    arch = EAGLE_ARCH if eagle else ARCH
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    p = f"{arch}."
    writer.add_uint32(p + "format_version", HEAD_FORMAT_VERSION)
    writer.add_uint32(p + "embedding_length", cfg.n_embd)
    writer.add_uint32(p + "kept_vocab_size", head.n_kept)
    writer.add_bool(p + "output_tied", bool(head.output_tied))
    if eagle:
        writer.add_uint32(p + "feed_forward_length", head.config.n_ff)
        writer.add_float32(p + "norm_epsilon", head.config.norm_eps)
    else:
        writer.add_uint32(p + "block_count", cfg.n_res_layers)
        writer.add_bool(p + "share_output", cfg.share_output)
    writer.add_string(p + "target.name", info.name)
    writer.add_string(p + "target.architecture", info.architecture)
    writer.add_uint32(p + "target.block_count", info.n_layer)
    writer.add_uint32(p + "target.vocab_size", info.n_vocab)
    writer.add_string(p + "target.vocab_hash", info.vocab_hash)
    qtype = MATRIX_TYPES[dtype]

    def matrix(name: str, values: torch.Tensor) -> None:
        data, actual = _matrix(values, qtype)
        writer.add_tensor(name, data, raw_dtype=actual)

    def vector(name: str, values: torch.Tensor) -> None:
        writer.add_tensor(name, np.ascontiguousarray(values.detach().to(torch.float32).cpu().numpy()))

    writer.add_tensor("head.vocab", head.vocab.to(torch.int32).cpu().numpy())
    matrix("head.token_embd.weight", head.embedding)
    if eagle:
        matrix("head.w_in.weight", head.w_in.weight)
        vector("head.ff_norm.weight", head.ff_norm.weight)
        matrix("head.w_gate.weight", head.w_gate.weight)
        matrix("head.w_up.weight", head.w_up.weight)
        matrix("head.w_down.weight", head.w_down.weight)
        vector("head.out_norm.weight", head.out_norm.weight)
        if not head.output_tied:
            matrix("head.output.weight", head.output)
    else:
        matrix("head.rnn_w.weight", head.rnn_w.weight)
        matrix("head.rnn_u.weight", head.rnn_u.weight)
        vector("head.rnn_u.bias", head.rnn_u.bias)
        for k, lin in enumerate(head.res):
            matrix(f"head.res.{k}.weight", lin.weight)
            vector(f"head.res.{k}.bias", lin.bias)
        if cfg.share_output:
            matrix("head.out_proj.weight", head.out_proj.weight)
            vector("head.out_proj.bias", head.out_proj.bias)
            if not head.output_tied:
                matrix("head.output.weight", head.output)
        else:
            matrix("head.output.weight", head.output_weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return out


def read_head_info(path: str | os.PathLike[str]) -> tuple[HeadConfig | EagleConfig, TargetInfo]:
    """The head's configuration (HeadConfig or, for an EAGLE-class head, EagleConfig) and its
    target, from the metadata (HeadFileError when invalid)."""
    reader = _open(path)
    return _config(reader), _target_info(reader)


def _open(path: str | os.PathLike[str]) -> gguf.GGUFReader:
    if not Path(path).is_file():
        raise FileNotFoundError(f"head file not found: {path}")
    try:
        reader = gguf.GGUFReader(os.fspath(path))
    except Exception as exc:  # the gguf package raises ValueError / IndexError / struct errors
        raise HeadFileError(f"{path}: not a readable GGUF file ({exc})") from exc
    arch = _field(reader, "general.architecture", "")
    if arch not in (ARCH, EAGLE_ARCH):
        raise HeadFileError(f"{path}: architecture {arch!r}, not a draft head ({ARCH!r} or {EAGLE_ARCH!r})")
    version = int(_field(reader, f"{arch}.format_version", -1))
    if version != HEAD_FORMAT_VERSION:
        raise HeadFileError(f"{path}: head format version {version}, this pyspec reads {HEAD_FORMAT_VERSION}")
    return reader


def _arch(reader: gguf.GGUFReader) -> str:
    return str(_field(reader, "general.architecture"))


def _config(reader: gguf.GGUFReader) -> HeadConfig | EagleConfig:
    arch = _arch(reader)
    p = f"{arch}."
    if arch == EAGLE_ARCH:
        return EagleConfig(n_embd=int(_field(reader, p + "embedding_length")),
                           n_target_vocab=int(_field(reader, p + "target.vocab_size")),
                           n_ff=int(_field(reader, p + "feed_forward_length")),
                           norm_eps=float(_field(reader, p + "norm_epsilon")), attention=False)
    return HeadConfig(n_embd=int(_field(reader, p + "embedding_length")),
                      n_target_vocab=int(_field(reader, p + "target.vocab_size")),
                      n_res_layers=int(_field(reader, p + "block_count")),
                      share_output=bool(_field(reader, p + "share_output")))


def _target_info(reader: gguf.GGUFReader) -> TargetInfo:
    arch = _arch(reader)
    p = f"{arch}.target."
    return TargetInfo(name=str(_field(reader, p + "name", "")), architecture=str(_field(reader, p + "architecture")),
                      n_layer=int(_field(reader, p + "block_count")),
                      n_embd=int(_field(reader, f"{arch}.embedding_length")),
                      n_vocab=int(_field(reader, p + "vocab_size")), vocab_hash=str(_field(reader, p + "vocab_hash")))


def load_head(path: str | os.PathLike[str]) -> tuple[RecurrentHead | EagleHead, TargetInfo]:
    """A head GGUF as a float32 RecurrentHead or EagleHead (eval mode; quantized matrices
    dequantized) and the target it was trained for."""
    reader = _open(path)
    config, info = _config(reader), _target_info(reader)
    tensors = {t.name: t for t in reader.tensors}

    def array(name: str) -> np.ndarray:
        if name not in tensors:
            raise HeadFileError(f"{path}: tensor {name} missing")
        t = tensors[name]
        data = np.asarray(t.data)
        if t.tensor_type not in (Q.F32, Q.F16, Q.I32):
            data = gguf.quants.dequantize(data, t.tensor_type)
        return np.array(data)

    def tensor(name: str) -> torch.Tensor:
        return torch.from_numpy(array(name).astype(np.float32))

    vocab = torch.from_numpy(array("head.vocab").astype(np.int64))
    tied = bool(_field(reader, f"{_arch(reader)}.output_tied"))
    if isinstance(config, EagleConfig):
        eagle = EagleHead(config, vocab, tensor("head.token_embd.weight"),
                          None if tied else tensor("head.output.weight"))
        with torch.no_grad():
            for name in ("w_in", "w_gate", "w_up", "w_down", "ff_norm", "out_norm"):
                getattr(eagle, name).weight.copy_(tensor(f"head.{name}.weight"))
        return eagle.eval(), info
    output = tensor("head.output.weight") if config.share_output and not tied else None
    head = RecurrentHead(config, vocab, tensor("head.token_embd.weight"), output)
    with torch.no_grad():
        head.rnn_w.weight.copy_(tensor("head.rnn_w.weight"))
        head.rnn_u.weight.copy_(tensor("head.rnn_u.weight"))
        head.rnn_u.bias.copy_(tensor("head.rnn_u.bias"))
        for k, lin in enumerate(head.res):
            lin.weight.copy_(tensor(f"head.res.{k}.weight"))
            lin.bias.copy_(tensor(f"head.res.{k}.bias"))
        if config.share_output:
            head.out_proj.weight.copy_(tensor("head.out_proj.weight"))
            head.out_proj.bias.copy_(tensor("head.out_proj.bias"))
        else:
            head.output_weight.copy_(tensor("head.output.weight"))
    return head.eval(), info

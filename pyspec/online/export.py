"""Writing a (trained) DraftModel back to GGUF, so the engine can load it as its draft.

The new file is the source GGUF with its tensors replaced: every metadata key is copied with its
original type (tokenizer, chat template, hyperparameters, names), except `general.file_type`,
which names the new tensor type; tensors keep the source's names and order. Matrices are written
in the requested type, vectors (norms, biases) in F32 as llama.cpp's own quantizer does.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import gguf
import numpy as np
import torch

from .gguf_read import expected_shapes, open_gguf, read_config
from .model import DraftModel

log = logging.getLogger(__name__)

Q = gguf.GGMLQuantizationType

# Export types: (tensor type of the matrices, general.file_type). The K-quants have no quantizer
# in the gguf package; requantize an f16 export with llama.cpp's llama_model_quantize for those.
EXPORT_TYPES: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "f32": (Q.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (Q.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}


def _tensor_type(name: str, shape: tuple[int, ...], matrix_type: gguf.GGMLQuantizationType) -> gguf.GGMLQuantizationType:
    if len(shape) == 1:
        return Q.F32
    block_size, _ = gguf.GGML_QUANT_SIZES[matrix_type]
    if shape[-1] % block_size:  # rows must be whole blocks; llama.cpp's quantizer falls back too
        log.info("export: %s has rows of %d values, not a multiple of %d; writing F16", name,
                 shape[-1], block_size)
        return Q.F16
    return matrix_type


def _encode(values: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """float32 [rows, cols] -> the bytes (or f32/f16 array) GGUF stores for `qtype`."""
    if qtype == Q.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    if qtype == Q.F16:
        return np.ascontiguousarray(values, dtype=np.float16)
    return gguf.quants.quantize(np.ascontiguousarray(values, dtype=np.float32), qtype)


def _copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, file_type: int) -> None:
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == "general.file_type":
            value = file_type
        elif field.name == "general.alignment":
            writer.data_alignment = int(value)  # the writer pads tensor data by this
        writer.add_key_value(field.name, value, vtype, sub_type=sub_type)
    if "general.file_type" not in reader.fields:
        writer.add_file_type(file_type)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def export_gguf(
    model: DraftModel,
    out: str | os.PathLike[str],
    *,
    dtype: str = "f16",
    source: str | os.PathLike[str] | None = None,
) -> Path:
    """Write `model` to `out` as GGUF with the metadata of `source` (default: model.source_path).

    dtype: "f32", "f16", "bf16" or "q8_0" for the matrices (a matrix whose rows are not whole
    blocks falls back to F16). The source must have exactly the model's tensors and shapes.
    The file appears atomically: written beside `out`, fsynced, then renamed over it.
    """
    if dtype not in EXPORT_TYPES:
        raise ValueError(f"dtype must be one of {', '.join(EXPORT_TYPES)}, got {dtype!r}")
    source = source if source is not None else model.source_path
    if source is None:
        raise ValueError("export_gguf needs source=: the model was not loaded from a GGUF file")
    reader = open_gguf(source)
    if read_config(reader) != model.config:
        raise ValueError(f"{source}: its architecture differs from the model's; export with the "
                         f"GGUF the model was loaded from")
    params = model.gguf_tensors()
    shapes = expected_shapes(model.config)
    names = [t.name for t in reader.tensors]  # the source's order
    if set(names) != set(shapes) or set(params) != set(shapes):
        raise ValueError(f"{source}: its tensors differ from the model's "
                         f"({sorted(set(names) ^ set(params))[:5]})")
    matrix_type, file_type = EXPORT_TYPES[dtype]

    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(tmp, reader.fields["general.architecture"].contents())
    _copy_metadata(reader, writer, int(file_type))
    types = {name: _tensor_type(name, shapes[name], matrix_type) for name in names}
    for name in names:
        block_size, type_size = gguf.GGML_QUANT_SIZES[types[name]]
        n_bytes = int(np.prod(shapes[name])) // block_size * type_size
        writer.add_tensor_info(name, shapes[name], np.dtype(np.float32), n_bytes, raw_dtype=types[name])
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        with torch.no_grad():
            for name in names:
                values = params[name].detach().to("cpu", torch.float32).numpy()
                writer.write_tensor_data(_encode(values, types[name]))
        assert writer.fout is not None
        writer.flush()
        os.fsync(writer.fout[0].fileno())
        writer.close()
        os.replace(tmp, out_path)
        _fsync_dir(out_path.parent)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    log.info("export: %s -> %s (%s, %d tensors)", source, out_path, dtype, len(names))
    return out_path

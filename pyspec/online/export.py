"""Writing a (trained) DraftModel back to GGUF, so the engine can load it as its draft.

The new file is the source GGUF with its tensors replaced: every metadata key is copied with its
original type (tokenizer, chat template, hyperparameters, names), except `general.file_type`,
which names the new file type; tensors keep the source's names and order. Tensor types
(`dtype`, config.py): "source" writes each matrix in the type the source stores it in; f32, f16,
bf16 and q8_0 are written directly; every other llama.cpp type is written as f32 and converted by
llama.cpp's own quantizer (`_core.quantize_model`, llama_model_quantize), which also reproduces
the source's K-quant and mixed-type tensors. Vectors (norms, biases) stay F32.

Tensors the caller left as loaded (`unchanged`: a trainer's frozen vocabulary matrices) are
copied byte for byte from the source whenever they are written in their source type, and always
with "source+q8_0": dequantizing and quantizing again need not give back the same bytes, and the
copy skips the encoding's cost.

Reading the source's metadata takes seconds for a real vocabulary; `ExportTemplate.read` does it
once and every later export of the same model reuses it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from .. import _core
from .config import DIRECT_TYPES, EXPORT_TYPES, LLAMA_TYPES, MIXED_Q8_0
from .gguf_read import ModelConfig, expected_shapes, open_gguf, read_config
from .model import DraftModel

log = logging.getLogger(__name__)

Q = gguf.GGMLQuantizationType
_DIRECT_TENSOR_TYPES = {matrix_type for matrix_type, _ in DIRECT_TYPES.values()}

__all__ = ["EXPORT_TYPES", "ExportTemplate", "export_gguf"]


@dataclass(frozen=True)
class ExportTemplate:
    """What an export copies from the source GGUF, read once."""

    source: str
    arch: str
    config: ModelConfig
    # (key, value, value type, array element type or None), in the source's order
    fields: tuple[tuple[str, Any, gguf.GGUFValueType, gguf.GGUFValueType | None], ...]
    alignment: int | None
    tensor_names: tuple[str, ...]         # the source's order
    tensor_types: dict[str, gguf.GGMLQuantizationType]
    file_type: int | None                 # the source's general.file_type
    tensor_spans: dict[str, tuple[int, int]]  # name -> (offset of its data in the file, bytes)

    @classmethod
    def read(cls, source: str | os.PathLike[str]) -> "ExportTemplate":
        reader = open_gguf(source)
        fields, alignment, file_type = [], None, None
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name == "general.architecture":
                continue  # written by GGUFWriter itself
            vtype = field.types[0]
            value = field.contents()
            if field.name == "general.alignment":
                alignment = int(value)
            elif field.name == "general.file_type":
                file_type = int(value)
            fields.append((field.name, value, vtype, field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None))
        return cls(
            source=os.fspath(source),
            arch=str(reader.fields["general.architecture"].contents()),
            config=read_config(reader),
            fields=tuple(fields),
            alignment=alignment,
            tensor_names=tuple(t.name for t in reader.tensors),
            tensor_types={t.name: gguf.GGMLQuantizationType(t.tensor_type) for t in reader.tensors},
            file_type=file_type,
            tensor_spans={t.name: (int(t.data_offset), int(t.n_bytes)) for t in reader.tensors},
        )

    def source_bytes(self, name: str) -> np.ndarray:
        """The source file's stored data of tensor `name` (uint8, read-only memory map)."""
        offset, n_bytes = self.tensor_spans[name]
        return np.memmap(self.source, dtype=np.uint8, mode="r", offset=offset, shape=(n_bytes,))


def _fits(shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> bool:
    """Whether rows of this shape are whole blocks of qtype."""
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    return shape[-1] % block_size == 0


def _encode(values: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """float32 [rows, cols] -> the bytes (or f32/f16 array) GGUF stores for `qtype`."""
    if qtype == Q.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    if qtype == Q.F16:
        return np.ascontiguousarray(values, dtype=np.float16)
    return gguf.quants.quantize(np.ascontiguousarray(values, dtype=np.float32), qtype)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextmanager
def _temporary(path: Path) -> Iterator[Path]:
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _write(template: ExportTemplate, params: dict[str, torch.Tensor], out: Path,
           types: dict[str, gguf.GGMLQuantizationType], file_type: int, copied: Collection[str] = ()) -> None:
    """Writes a GGUF with the template's metadata and `params` in `types` to `out` (fsynced);
    the tensors named in `copied` (each in its source type) are the source's bytes."""
    shapes = expected_shapes(template.config)
    writer = gguf.GGUFWriter(out, template.arch)
    if template.alignment is not None:
        writer.data_alignment = template.alignment  # the writer pads tensor data by this
    for name, value, vtype, sub_type in template.fields:
        writer.add_key_value(name, file_type if name == "general.file_type" else value, vtype, sub_type=sub_type)
    if template.file_type is None:
        writer.add_file_type(file_type)
    for name in template.tensor_names:
        block_size, type_size = gguf.GGML_QUANT_SIZES[types[name]]
        n_bytes = int(np.prod(shapes[name])) // block_size * type_size
        writer.add_tensor_info(name, shapes[name], np.dtype(np.float32), n_bytes, raw_dtype=types[name])
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        with torch.no_grad():
            for name in template.tensor_names:
                if name in copied:
                    writer.write_tensor_data(template.source_bytes(name))
                    continue
                values = params[name].detach().to("cpu", torch.float32).numpy()
                writer.write_tensor_data(_encode(values, types[name]))
        assert writer.fout is not None
        writer.flush()
        os.fsync(writer.fout[0].fileno())
    finally:
        writer.close()


def _plan(template: ExportTemplate, dtype: str) -> tuple[dict[str, gguf.GGMLQuantizationType], int,
                                                         list[tuple[str, int]] | None]:
    """(tensor types to write directly, their file type, and None), or (f32 everywhere, the
    llama_ftype to quantize to, per-tensor overrides) when llama.cpp must convert."""
    shapes = expected_shapes(template.config)
    names = template.tensor_names
    vectors = {name: Q.F32 for name in names if len(shapes[name]) == 1}
    matrices = [name for name in names if len(shapes[name]) > 1]
    if dtype in DIRECT_TYPES or dtype == MIXED_Q8_0:  # the mix: q8_0, its frozen tensors copied later
        matrix_type, file_type = DIRECT_TYPES["q8_0" if dtype == MIXED_Q8_0 else dtype]
        types = {}
        for name in matrices:
            types[name] = matrix_type if _fits(shapes[name], matrix_type) else Q.F16
            if types[name] != matrix_type:  # llama.cpp's quantizer falls back the same way
                log.info("export: %s has rows of %d values, not whole %s blocks; writing F16", name,
                         shapes[name][-1], matrix_type.name)
        return vectors | types, int(file_type), None
    all_f32 = {name: Q.F32 for name in names}
    if dtype in LLAMA_TYPES:
        return all_f32, int(LLAMA_TYPES[dtype]), []
    # "source": every matrix in its source type.
    source_types = {name: template.tensor_types[name] for name in matrices}
    source_file_type = template.file_type if template.file_type is not None else int(gguf.LlamaFileType.ALL_F32)
    if set(source_types.values()) <= _DIRECT_TENSOR_TYPES:
        return vectors | source_types, source_file_type, None
    quantized_file_type = source_file_type if source_file_type not in (0, 1, 32) else int(gguf.LlamaFileType.MOSTLY_Q8_0)
    return all_f32, quantized_file_type, [(name, int(t)) for name, t in source_types.items()]


def export_gguf(
    model: DraftModel,
    out: str | os.PathLike[str],
    *,
    dtype: str = "source",
    source: str | os.PathLike[str] | None = None,
    template: ExportTemplate | None = None,
    n_threads: int = 0,
    unchanged: Collection[str] = (),
) -> Path:
    """Write `model` to `out` as GGUF with the metadata of `source` (default: model.source_path).

    dtype: one of EXPORT_TYPES (config.py): "source" (each matrix in its source type), f32,
    f16, bf16, q8_0 (a matrix whose rows are not whole blocks falls back to F16), "source+q8_0"
    (q8_0, but every `unchanged` tensor copied in its source type), or a llama.cpp type such as
    q4_k_m or q5_0. template: ExportTemplate.read(source), to skip re-reading the
    source's metadata on every export. n_threads: llama.cpp's quantizer (0: all cores).
    unchanged: GGUF names of tensors whose weights are still the source's (frozen in training);
    with dtype "source" or "source+q8_0" (or a direct type equal to theirs) their source bytes
    are copied.
    The source must have exactly the model's tensors and shapes. The file appears atomically:
    written beside `out`, fsynced, then renamed over it; a failure leaves `out` as it was.
    """
    if dtype not in EXPORT_TYPES:
        raise ValueError(f"dtype must be one of {', '.join(EXPORT_TYPES)}, got {dtype!r}")
    if template is None:
        source = source if source is not None else model.source_path
        if source is None:
            raise ValueError("export_gguf needs source=: the model was not loaded from a GGUF file")
        template = ExportTemplate.read(source)
    if template.config != model.config:
        raise ValueError(f"{template.source}: its architecture differs from the model's; export with the "
                         f"GGUF the model was loaded from")
    params = model.gguf_tensors()
    shapes = expected_shapes(model.config)
    if set(template.tensor_names) != set(shapes) or set(params) != set(shapes):
        raise ValueError(f"{template.source}: its tensors differ from the model's "
                         f"({sorted(set(template.tensor_names) ^ set(params))[:5]})")
    types, file_type, overrides = _plan(template, dtype)
    unknown = set(unchanged) - set(shapes)
    if unknown:
        raise ValueError(f"unchanged names tensors the model does not have: {sorted(unknown)}")
    copied: set[str] = set()
    if overrides is None or dtype == "source":
        # In the source plan the quantizer's input may hold a tensor in its final type already;
        # llama.cpp then copies it unchanged.
        target = dict(overrides) if overrides else {}
        types = dict(types)
        for name in unchanged:
            source_type = template.tensor_types[name]
            if dtype == MIXED_Q8_0 or int(target.get(name, types[name])) == int(source_type):
                types[name] = source_type
                copied.add(name)

    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    with _temporary(tmp):
        if overrides is None:
            _write(template, params, tmp, types, file_type, copied)
        else:
            with _temporary(out_path.with_name(f".{out_path.name}.f32-{os.getpid()}")) as f32:
                _write(template, params, f32, types, int(gguf.LlamaFileType.ALL_F32), copied)
                try:
                    _core.quantize_model(str(f32), str(tmp), file_type, overrides, n_threads)
                finally:
                    for line in _core.drain_logs():  # per-tensor notices of the quantizer
                        log.debug("llama.cpp: %s", line.text)
            _fsync_file(tmp)
        os.replace(tmp, out_path)
    _fsync_dir(out_path.parent)
    log.info("export: %s -> %s (%s)", template.source, out_path, dtype)
    return out_path

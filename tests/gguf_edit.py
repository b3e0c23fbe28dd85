"""Byte-level edits of a tiny GGUF's metadata for the error tests (the layout stays valid)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def copy_with_duplicated_token(source: str, dest: Path, first: int = 300) -> tuple[int, int]:
    """Write `source` to `dest` with a later token's text replaced by token `first`'s text.

    The later token is the next one whose text has the same length, so the rewrite is in place and
    the file's layout is unchanged. Returns the two token ids that now share a text.
    """
    import gguf

    reader = gguf.GGUFReader(source)
    field = reader.fields["tokenizer.ggml.tokens"]
    texts = [field.parts[index] for index in field.data]
    original = texts[first]
    assert original.dtype == np.uint8
    second = next(i for i in range(first + 1, len(texts)) if len(texts[i]) == len(original))
    data = bytearray(Path(source).read_bytes())
    offset = texts[second].ctypes.data - reader.data.ctypes.data
    data[offset : offset + len(original)] = original.tobytes()
    dest.write_bytes(bytes(data))
    return first, second
